/**
 * Weight sync through the engine's own `updateWeights`: for engines that take new weights themselves. One
 * implementation for the two ways they do:
 * - `shared`: the engine samples from the trainer's own variables (a LocalEngine over the policy model), so new
 *   weights are in place when the optimizer steps. Publishing sends a tensor-less snapshot that only advances the
 *   engine's version (LocalEngine rebuilds its fused inference view for it); the update's snapshot is never read.
 * - `copied`: the engine keeps its own copy. Publishing reads the snapshot and hands it over: a WorkerEngine writes it
 *   into its shared weight board (weights/WeightBoard.ts) and returns once the worker has it.
 * Each sync's wall time goes to `onSynced` and the debug log.
 */
import { Clock, Effect, Layer } from "effect"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import { WeightSync, WeightSyncError } from "./WeightSync.ts"

export interface EngineWeightSyncOptions {
  /** `shared`: the engine samples from the trainer's variables (only the version moves); `copied`: its own copy. */
  readonly weights: "shared" | "copied"
  readonly onSynced?: (timing: { readonly version: number; readonly seconds: number }) => void
}

export const make = Effect.fnUntraced(function* (options: EngineWeightSyncOptions) {
  const engine = yield* InferenceEngine
  return WeightSync.of({
    kind: "engine",
    publish: Effect.fn("EngineWeightSync.publish")(function* (update) {
      const startedAt = yield* Clock.currentTimeMillis
      const snapshot =
        options.weights === "shared"
          ? WeightSnapshot.make({ version: update.version, names: [], shapes: [], data: [] })
          : yield* update.snapshot
      yield* engine
        .updateWeights(snapshot)
        .pipe(Effect.mapError((e) => new WeightSyncError({ target: "engine", message: e.message })))
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      options.onSynced?.({ version: snapshot.version, seconds })
      yield* Effect.logDebug(`weight sync v${snapshot.version} to the engine (${options.weights}) in ${seconds}s`)
    })
  })
})

export const layer = (options: EngineWeightSyncOptions): Layer.Layer<WeightSync, never, InferenceEngine> =>
  Layer.effect(WeightSync, make(options))
