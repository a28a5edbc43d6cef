/**
 * What a rollout runner hosts: the Rollout entity's handler over this process's Generator (the agent loop, the
 * environments with their MCP servers) and InferenceEngine. A request waits until the engine's weights reach its
 * `minVersion` (the trainer's version when it admitted the group, so the staleness bound holds as in a local run),
 * then takes one of the runner's `capacity` slots (how many groups it rolls out at once: its MCP servers, sandboxes
 * and engine share the machine) and runs the group. Every turn records the versions it sampled from.
 *
 * Attempts are counted per request key (`Attempts`): with SQL storage in a table every runner shares, so a group
 * rolled out again after its runner died says so (`TrajectoryGroup.retried`).
 */
import * as os from "node:os"
import { Clock, Context, Deferred, Duration, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Generator } from "../generator/Generator.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import { Rollout } from "./RolloutEntity.ts"

/** How many times a request key has been started, this start included. */
export class Attempts extends Context.Service<Attempts, { readonly start: (key: string) => Effect.Effect<number> }>()(
  "rl/cluster/Attempts"
) {}

/** Attempts of one process (memory storage: the trainer is the only runner). */
export const attemptsMemory: Layer.Layer<Attempts> = Layer.sync(Attempts, () => {
  const counts = new Map<string, number>()
  return Attempts.of({
    start: (key) =>
      Effect.sync(() => {
        const n = (counts.get(key) ?? 0) + 1
        counts.set(key, n)
        return n
      })
  })
})

/** Attempts in the cluster's SQL database, shared by every runner (table effect_rl_rollout_attempts). */
export const attemptsSql: Layer.Layer<Attempts, never, SqlClient.SqlClient> = Layer.effect(
  Attempts,
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`CREATE TABLE IF NOT EXISTS effect_rl_rollout_attempts (
      key TEXT NOT NULL, runner TEXT NOT NULL, started_at TIMESTAMPTZ NOT NULL DEFAULT now())`.pipe(
      Effect.retry({ times: 3 }),
      Effect.orDie
    )
    const runner = `${os.hostname()}:${process.pid}`
    return Attempts.of({
      start: (key) =>
        Effect.gen(function* () {
          yield* sql`INSERT INTO effect_rl_rollout_attempts (key, runner) VALUES (${key}, ${runner})`
          const rows = yield* sql<{
            n: number | string
          }>`SELECT count(*) AS n FROM effect_rl_rollout_attempts WHERE key = ${key}`
          return Number(rows[0]?.n ?? 1)
        }).pipe(Effect.orDie)
    })
  })
)

export interface HostOptions {
  /** This runner's name in replies (its address). */
  readonly name: string
  /** Groups this runner rolls out at once (generator.max_concurrent_groups). */
  readonly capacity: number
  /** Where the engine's weights come from, for the warning while a request waits for its version. */
  readonly weightsFrom: string
}

/** Poll the engine's version until it reaches `minVersion`, warning every 30 s of waiting. */
const awaitVersion = (engine: InferenceEngine["Service"], minVersion: number, weightsFrom: string) =>
  Effect.gen(function* () {
    const t0 = yield* Clock.currentTimeMillis
    let warned = t0
    while ((yield* engine.version) < minVersion) {
      const now = yield* Clock.currentTimeMillis
      if (now - warned >= 30_000) {
        warned = now
        yield* Effect.logWarning(
          `runner: waiting ${Math.round((now - t0) / 1000)} s for weights v${minVersion} (have v${yield* engine.version}) from ${weightsFrom}: ` +
            `is the trainer's pipeline.weight_sync writing there?`
        )
      }
      yield* Effect.sleep(Duration.millis(50))
    }
  })

/**
 * A runner's slots: at most `capacity` groups at once, a free slot going to the waiting request with the lowest cursor
 * (the trainer trains in cursor order, so a later cursor finishing first only waits in its reorder buffer).
 */
export interface Slots {
  readonly withSlot: <A, E, R>(cursor: number, use: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
}

export const makeSlots = (capacity: number): Slots => {
  let free = capacity
  const waiting: Array<{ readonly cursor: number; readonly ready: Deferred.Deferred<void> }> = []
  const release = () => {
    const next = waiting.shift()
    if (next === undefined) free++
    else Deferred.doneUnsafe(next.ready, Effect.void)
  }
  return {
    withSlot: (cursor, use) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(function* () {
          const entry = { cursor, ready: Deferred.makeUnsafe<void>() }
          if (free > 0) {
            free--
            Deferred.doneUnsafe(entry.ready, Effect.void)
          } else {
            const at = waiting.findIndex((w) => w.cursor > cursor)
            waiting.splice(at < 0 ? waiting.length : at, 0, entry)
          }
          yield* restore(Deferred.await(entry.ready)).pipe(
            Effect.onInterrupt(() =>
              Effect.sync(() => {
                const i = waiting.indexOf(entry)
                if (i >= 0) waiting.splice(i, 1)
                else release() // the slot was handed over as the wait was interrupted: pass it on
              })
            )
          )
          return yield* restore(use).pipe(Effect.ensuring(Effect.sync(release)))
        })
      )
  }
}

/**
 * The Rollout entity's handler over this process's Generator and InferenceEngine. The slots are the runner's, shared
 * by all its entities (the entity's own build runs once per entity id, i.e. per request).
 */
export const layer = (options: HostOptions) => handler(options, makeSlots(options.capacity))

const handler = (options: HostOptions, slots: Slots) =>
  Rollout.toLayer(
    Effect.gen(function* () {
      const generator = yield* Generator
      const engine = yield* InferenceEngine
      const attempts = yield* Attempts
      return Rollout.of({
        RollOut: ({ payload }) =>
          Effect.gen(function* () {
            const attempt = yield* attempts.start(payload.key)
            yield* Effect.logInfo(
              attempt > 1
                ? `runner: rolling out ${payload.key} again (attempt ${attempt})`
                : `runner: rolling out ${payload.key}`
            )
            yield* awaitVersion(engine, payload.minVersion, options.weightsFrom)
            const row = payload.extras === undefined ? payload.row : { ...payload.row, extras: payload.extras }
            const group = yield* slots.withSlot(
              payload.cursor,
              generator.group({ row, cursor: payload.cursor }, { seed: payload.seed }).pipe(Effect.orDie)
            )
            return { group: attempt > 1 ? { ...group, retried: attempt - 1 } : group, runner: options.name }
          })
      })
    }),
    { concurrency: 1 }
  )
