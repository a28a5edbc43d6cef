/**
 * Weight sync to a WorkerEngine (inference in a worker thread of this process): each published snapshot goes to the
 * engine in context (`updateWeights`), which for a WorkerEngine is a write into its shared weight board
 * (inference/WeightBoard.ts); each sync's wall time goes to `onSynced` and the debug log.
 */
import { Clock, Effect, Layer } from "effect"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import { WeightSync, WeightSyncError } from "./WeightSync.ts"

export interface WorkerWeightSyncOptions {
  readonly onSynced?: (timing: { readonly version: number; readonly seconds: number }) => void
}

export const make = Effect.fnUntraced(function* (options: WorkerWeightSyncOptions = {}) {
  const engine = yield* InferenceEngine
  return WeightSync.of({
    kind: "worker",
    publish: Effect.fn("WorkerWeightSync.publish")(function* (update) {
      const startedAt = yield* Clock.currentTimeMillis
      const snapshot = yield* update.snapshot
      yield* engine
        .updateWeights(snapshot)
        .pipe(Effect.mapError((e) => new WeightSyncError({ target: "worker engine", message: e.message })))
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      options.onSynced?.({ version: snapshot.version, seconds })
      yield* Effect.logDebug(`weight sync v${snapshot.version} to the worker in ${seconds}s`)
    })
  })
})

export const layer = (options: WorkerWeightSyncOptions = {}): Layer.Layer<WeightSync, never, InferenceEngine> =>
  Layer.effect(WeightSync, make(options))
