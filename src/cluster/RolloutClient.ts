/**
 * The trainer's side of the rollout cluster: `rollOut(prompt, { seed, minVersion })` sends the group's request to
 * the Rollout entity keyed `<run>/<cursor>/v<minVersion>` and waits for its TrajectoryGroup, wherever the cluster
 * runs it (and re-runs it, when its runner dies). `run` names this trainer process's requests: a fresh key space per
 * trainer start, so a resumed run never takes a group an earlier process asked for at other weights.
 */
import { randomBytes } from "node:crypto"
import { Context, Effect, Layer } from "effect"
import type { Sharding } from "effect/cluster"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import type { Prompt } from "../generator/Generator.ts"
import { Rollout, requestKey } from "./RolloutEntity.ts"

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

export const layer: Layer.Layer<RolloutClient, never, Sharding.Sharding> = Layer.effect(
  RolloutClient,
  Effect.gen(function* () {
    const clientFor = yield* Rollout.client
    const run = randomBytes(6).toString("hex")
    return RolloutClient.of({
      run,
      rollOut: (prompt, options) => {
        const key = requestKey(run, prompt.cursor, options.minVersion)
        const { extras, ...row } = prompt.row
        return clientFor(key)
          .RollOut({
            key,
            cursor: prompt.cursor,
            row,
            ...(extras === undefined ? {} : { extras: { ...extras } }),
            seed: options.seed,
            minVersion: options.minVersion
          })
          .pipe(Effect.orDie, Effect.withSpan("RolloutClient.rollOut", { attributes: { key } }))
      }
    })
  })
)
