/**
 * In-process weight sync: trainer and LocalEngine share one Transformer's variables, so new weights are already in
 * place when the optimizer steps. Publishing sends the engine a tensor-less snapshot that only advances its version
 * (LocalEngine rebuilds its fused inference view for the new version).
 */
import { Effect, Layer } from "effect"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import { WeightSync, WeightSyncError } from "./WeightSync.ts"

export const make = Effect.gen(function* () {
  const engine = yield* InferenceEngine
  return WeightSync.of({
    kind: "inprocess",
    publish: (update) =>
      engine
        .updateWeights(WeightSnapshot.make({ version: update.version, names: [], shapes: [], data: [] }))
        .pipe(Effect.mapError((e) => new WeightSyncError({ target: "local engine", message: e.message })))
  })
})

export const layer: Layer.Layer<WeightSync, never, InferenceEngine> = Layer.effect(WeightSync, make)
