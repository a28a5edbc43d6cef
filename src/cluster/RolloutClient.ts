/**
 * The trainer's side of the rollout cluster: `rollOut(prompt, { seed, minVersion })` sends the group's request to a
 * Rollout entity and waits for its TrajectoryGroup, wherever the cluster runs it (and re-runs it, when its runner
 * dies). `run` names this trainer process's new requests; a resumed trainer asks again, under their own keys, for the
 * groups its earlier process asked for (the run's request journal), and the cluster answers those from its storage.
 *
 * Placement: the cluster puts an entity on the runner owning its id's shard. Hashing request keys alone spreads
 * groups unevenly over runners (a runner with a long queue holds back the batch the trainer needs next while another
 * idles), so each request's entity id is its key plus a salt (`<key>#<n>`) chosen among 64 so that its shard lands on
 * the runner with the fewest groups in flight. Which runner owns a shard is learned from the replies (each names its
 * runner); a shard not seen yet counts as an average runner. After a failover the replies teach the new owners.
 */
import { randomBytes } from "node:crypto"
import { Context, Duration, Effect, Layer, Schedule } from "effect"
import { EntityId, Sharding } from "effect/cluster"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import type { Prompt } from "../generator/Generator.ts"
import * as ConsumedLog from "../store/ConsumedLog.ts"
import * as RolloutRequests from "../store/RolloutRequests.ts"
import { Rollout, requestKey } from "./RolloutEntity.ts"

/** How many times a request that cannot be sent is sent again, a second apart, before the run fails. */
const retries = 300
/** Salts tried per request when placing it. */
const salts = 64

export interface RollOptions {
  readonly seed: number
  readonly minVersion: number
}

export class RolloutClient extends Context.Service<
  RolloutClient,
  {
    readonly run: string
    readonly rollOut: (prompt: Prompt, options: RollOptions) => Effect.Effect<TrajectoryGroup>
  }
>()("rl/cluster/RolloutClient") {}

/** Where requests go: shard → runner as the replies said, and each runner's groups in flight. */
export const makePlacement = (shardOf: (entityId: string) => number) => {
  const owner = new Map<number, string>()
  const inflight = new Map<string, number>()
  const load = (runner: string) => inflight.get(runner) ?? 0
  return {
    /** The entity id for `key` whose shard's runner has the fewest groups in flight, and that runner (if known). */
    place: (key: string): { readonly entityId: string; readonly runner: string | undefined } => {
      const known = [...inflight.keys()]
      const average = known.length === 0 ? 0 : known.reduce((sum, r) => sum + load(r), 0) / known.length
      let best = { entityId: `${key}#0`, runner: undefined as string | undefined, score: Number.POSITIVE_INFINITY }
      for (let n = 0; n < salts; n++) {
        const entityId = `${key}#${n}`
        const runner = owner.get(shardOf(entityId))
        const score = runner === undefined ? average + 0.5 : load(runner)
        if (score < best.score) best = { entityId, runner, score }
      }
      if (best.runner !== undefined) inflight.set(best.runner, load(best.runner) + 1)
      return { entityId: best.entityId, runner: best.runner }
    },
    /** A reply: `runner` owns the entity's shard; the group placed on `placed` is no longer in flight. */
    done: (entityId: string, placed: string | undefined, runner: string) => {
      owner.set(shardOf(entityId), runner)
      if (placed !== undefined) inflight.set(placed, Math.max(0, load(placed) - 1))
      if (!inflight.has(runner)) inflight.set(runner, 0)
    },
    /** A request given up: its group is no longer in flight. */
    abandon: (placed: string | undefined) => {
      if (placed !== undefined) inflight.set(placed, Math.max(0, load(placed) - 1))
    }
  }
}

/**
 * The client. With `runDir` (a run whose requests outlive the trainer: storage in Postgres) every request is
 * journalled there before it is sent (store/RolloutRequests), and a cursor found in the journal, a request of an
 * earlier process of the same run, is asked for again under its key and entity: the stored group, or the rollout
 * still in flight, answers it.
 */
export const layer = (runDir?: string): Layer.Layer<RolloutClient, never, Sharding.Sharding> =>
  Layer.effect(
    RolloutClient,
    Effect.gen(function* () {
      const clientFor = yield* Rollout.client
      const sharding = yield* Sharding.Sharding
      const placement = makePlacement((id) => sharding.getShardId(EntityId.make(id), "default").id)
      const run = randomBytes(6).toString("hex")
      if (runDir !== undefined) yield* ConsumedLog.dropTornTail(RolloutRequests.file(runDir))
      const sent = runDir === undefined ? new Map() : yield* Effect.promise(() => RolloutRequests.read(runDir))
      if (sent.size > 0) {
        yield* Effect.logInfo(
          `rollouts: ${sent.size} requests of earlier trainer processes of this run are asked for again under their keys`
        )
      }
      const journal = (request: RolloutRequests.Request) =>
        runDir === undefined ? Effect.void : Effect.promise(() => RolloutRequests.append(runDir, request))
      const rollOut = (prompt: Prompt, options: RollOptions): Effect.Effect<TrajectoryGroup> => {
        const earlier = sent.get(prompt.cursor)
        const key = earlier?.key ?? requestKey(run, prompt.cursor, options.minVersion)
        const { extras, ...row } = prompt.row
        return Effect.suspend(() => {
          const { entityId, runner } =
            earlier === undefined ? placement.place(key) : { entityId: earlier.entityId, runner: undefined }
          const request = clientFor(entityId)
            .RollOut({
              key,
              cursor: prompt.cursor,
              row,
              ...(extras === undefined ? {} : { extras: { ...extras } }),
              seed: options.seed,
              minVersion: options.minVersion
            })
            .pipe(
              // storage out of reach (Postgres restarting), no runner for the shard yet, a full mailbox: the request
              // is sent again to the same entity (its key is the primary key: a stored request is not stored twice)
              Effect.tapError((e) =>
                Effect.logWarning(`rollout ${key}: ${e._tag} (${e.message}); sending it again in 1 s`)
              ),
              Effect.retry({ schedule: Schedule.spaced(Duration.seconds(1)), times: retries }),
              Effect.orDie,
              Effect.tap((reply) => Effect.sync(() => placement.done(entityId, runner, reply.runner))),
              Effect.onInterrupt(() => Effect.sync(() => placement.abandon(runner))),
              Effect.map((reply) => reply.group),
              Effect.withSpan("RolloutClient.rollOut", { attributes: { key, entityId } })
            )
          return earlier === undefined
            ? journal({ cursor: prompt.cursor, key, entityId }).pipe(Effect.andThen(request))
            : request
        })
      }
      return RolloutClient.of({ run, rollOut })
    })
  )
