/**
 * Weight sync to a remote `serve`: each published version is encoded as one safetensors file (HF names and shapes,
 * F32), cut into chunks and POSTed to `/v1/weights` with the bearer token (sync/WeightUpload.ts has the protocol).
 * The server applies the weights between two decode steps when the last chunk arrives; `publish` returns then.
 * Afterwards the engine in context (a RemoteEngine) is told the new version with a tensor-less snapshot, so that
 * its `version` and the versions it reports follow.
 *
 * Each sync reports its size and wall time to `onSynced` (the bench reads it) and to the debug log.
 */
import { Clock, Effect, Layer, Random } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest } from "effect/http"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as Safetensors from "../model/Safetensors.ts"
import { WeightSync, WeightSyncError } from "./WeightSync.ts"
import * as WeightUpload from "./WeightUpload.ts"

export interface HttpWeightSyncOptions {
  /** The server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted). */
  readonly url: string
  /** The server's weight token (`serve --token-env`). */
  readonly token: string
  /** Bytes per request; default 8 MiB. */
  readonly chunkBytes?: number
  /** Called after each sync with what it moved and how long it took. */
  readonly onSynced?: (timing: SyncTiming) => void
}

export interface SyncTiming {
  readonly version: number
  readonly bytes: number
  readonly chunks: number
  readonly seconds: number
}

/** `http://host:port[/v1][/]` → `http://host:port`. */
export const baseUrl = (url: string): string => url.replace(/\/+$/, "").replace(/\/v1$/, "")

const syncError = (url: string, message: string) => new WeightSyncError({ target: url, message })

/** The safetensors file a snapshot travels as (an empty file for a version-only snapshot). */
export const encode = (snapshot: WeightSnapshot.WeightSnapshot): Uint8Array =>
  snapshot.names.length === 0
    ? new Uint8Array(0)
    : Safetensors.encode(
        snapshot.names.map((name, i) => ({ name, shape: snapshot.shapes[i]!, data: snapshot.data[i]! })),
        "F32"
      )

/**
 * Upload one snapshot to `url`'s `/v1/weights`, chunk by chunk (each retried on transport failure). Fails with the
 * server's message on 401 (token), 409 (older version), 413 (too large) and the like.
 */
export const upload = Effect.fnUntraced(function* (
  options: Pick<HttpWeightSyncOptions, "url" | "token" | "chunkBytes">,
  snapshot: WeightSnapshot.WeightSnapshot
) {
  const client = yield* HttpClient.HttpClient
  const url = `${baseUrl(options.url)}/v1/weights`
  const startedAt = yield* Clock.currentTimeMillis
  const file = encode(snapshot)
  const parts = WeightUpload.chunks(file, options.chunkBytes ?? 8 * 1024 * 1024)
  const uploadId = `${snapshot.version}-${startedAt}-${(yield* Random.nextInt).toString(36)}`
  for (const [chunkIndex, part] of parts.entries()) {
    const request = HttpClientRequest.post(url).pipe(
      HttpClientRequest.bearerToken(options.token),
      HttpClientRequest.setHeaders(
        WeightUpload.toHeaders({
          version: snapshot.version,
          uploadId,
          chunkIndex,
          chunkCount: parts.length,
          chunkOffset: part.offset,
          totalBytes: file.byteLength
        })
      ),
      HttpClientRequest.bodyUint8Array(part.bytes, "application/octet-stream")
    )
    const response = yield* client.execute(request).pipe(
      Effect.retry({ times: 3, while: (e) => e.reason._tag === "TransportError" }),
      Effect.mapError((e) => syncError(url, `chunk ${chunkIndex + 1}/${parts.length}: ${e.message}`))
    )
    if (response.status !== 200) {
      const body = yield* response.text.pipe(Effect.orElseSucceed(() => ""))
      return yield* syncError(url, `chunk ${chunkIndex + 1}/${parts.length}: HTTP ${response.status} ${body}`)
    }
  }
  const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
  return { version: snapshot.version, bytes: file.byteLength, chunks: parts.length, seconds } satisfies SyncTiming
})

export const make = Effect.fnUntraced(function* (options: HttpWeightSyncOptions) {
  const engine = yield* InferenceEngine
  const client = yield* HttpClient.HttpClient
  return WeightSync.of({
    kind: "http",
    publish: Effect.fn("HttpWeightSync.publish")(function* (update) {
      const snapshot = yield* update.snapshot
      const timing = yield* upload(options, snapshot).pipe(Effect.provideService(HttpClient.HttpClient, client))
      options.onSynced?.(timing)
      yield* Effect.logDebug(
        `weight sync v${timing.version}: ${timing.bytes} bytes in ${timing.chunks} chunks, ${timing.seconds}s`
      )
      yield* engine
        .updateWeights(
          WeightSnapshot.make({ version: PolicyVersion.make(update.version), names: [], shapes: [], data: [] })
        )
        .pipe(Effect.mapError((e) => syncError(options.url, e.message)))
    })
  })
})

/** Over Node's fetch. */
export const layer = (options: HttpWeightSyncOptions): Layer.Layer<WeightSync, never, InferenceEngine> =>
  Layer.effect(WeightSync, make(options)).pipe(Layer.provide(FetchHttpClient.layer))
