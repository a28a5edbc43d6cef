/**
 * Weight sync to a remote `serve`: each published version is uploaded to `/v1/weights` with the bearer token
 * (weights/WeightUpload.ts has the protocol and `upload`). The server applies the weights between two decode steps
 * when the last chunk arrives; `publish` returns then. Afterwards the engine in context (a RemoteEngine) is told the
 * new version with a tensor-less snapshot, so that its `version` and the versions it reports follow.
 *
 * Each sync reports its size and wall time to `onSynced` (the bench reads it) and to the debug log.
 */
import { Effect, Layer } from "effect"
import { FetchHttpClient, HttpClient } from "effect/http"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as WeightUpload from "../weights/WeightUpload.ts"
import { WeightSync, WeightSyncError } from "./WeightSync.ts"

export interface HttpWeightSyncOptions extends WeightUpload.UploadOptions {
  /** Called after each sync with what it moved and how long it took. */
  readonly onSynced?: (timing: WeightUpload.Timing) => void
}

export const make = Effect.fnUntraced(function* (options: HttpWeightSyncOptions) {
  const engine = yield* InferenceEngine
  const client = yield* HttpClient.HttpClient
  return WeightSync.of({
    kind: "http",
    publish: Effect.fn("HttpWeightSync.publish")(function* (update) {
      const snapshot = yield* update.snapshot
      const timing = yield* WeightUpload.upload(options, snapshot).pipe(
        Effect.provideService(HttpClient.HttpClient, client),
        Effect.mapError((e) => new WeightSyncError({ target: e.url, message: e.message }))
      )
      options.onSynced?.(timing)
      yield* Effect.logDebug(
        `weight sync v${timing.version}: ${timing.bytes} bytes in ${timing.chunks} chunks, ${timing.seconds}s`
      )
      yield* engine
        .updateWeights(
          WeightSnapshot.make({ version: PolicyVersion.make(update.version), names: [], shapes: [], data: [] })
        )
        .pipe(Effect.mapError((e) => new WeightSyncError({ target: options.url, message: e.message })))
    })
  })
})

/** Over Node's fetch. */
export const layer = (options: HttpWeightSyncOptions): Layer.Layer<WeightSync, never, InferenceEngine> =>
  Layer.effect(WeightSync, make(options)).pipe(Layer.provide(FetchHttpClient.layer))
