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
import { Clock, Context, Duration, Effect, Layer, Semaphore } from "effect"
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

/** The Rollout entity's handler over this process's Generator and InferenceEngine. */
export const layer = (options: HostOptions) =>
  Rollout.toLayer(
    Effect.gen(function* () {
      const generator = yield* Generator
      const engine = yield* InferenceEngine
      const attempts = yield* Attempts
      const slots = yield* Semaphore.make(options.capacity)
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
            const group = yield* slots.withPermit(
              generator.group({ row, cursor: payload.cursor }, { seed: payload.seed }).pipe(Effect.orDie)
            )
            return attempt > 1 ? { ...group, retried: attempt - 1 } : group
          })
      })
    }),
    { concurrency: 1 }
  )
