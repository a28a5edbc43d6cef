/**
 * The chunked weight-upload protocol of `POST /v1/weights`, both ends: serve/WeightUpdates.ts receives it
 * (`readHeaders`, `assembler`); `upload` sends it, for inference/ReplicaWeights.ts (a remote engine's weights, with
 * a weight token) and sync/HttpWeightSync.ts. A snapshot travels as one safetensors file (HF names and shapes, F32)
 * cut into chunks of at most `chunkBytes`, each a binary POST body with these headers:
 *
 *   Authorization: Bearer <token>
 *   X-Weights-Version: <policy version>       X-Upload-Id: <id, the same for every chunk of one upload>
 *   X-Chunk-Index: <0-based>     X-Chunk-Count: <n>     X-Chunk-Offset: <byte offset>     X-Total-Bytes: <file size>
 *
 * The server keeps one upload at a time (a new id drops an unfinished one), accepts chunks in any order, and applies
 * the weights when the last one arrives. An empty file (X-Total-Bytes: 0, one empty chunk) advances the version
 * only. Chunking bounds each request's size (proxies, body limits) and lets a failed chunk be retried alone.
 */
import { Clock, Effect, Random, Schema } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import type * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as Safetensors from "../model/Safetensors.ts"

export const headerNames = {
  version: "x-weights-version",
  uploadId: "x-upload-id",
  chunkIndex: "x-chunk-index",
  chunkCount: "x-chunk-count",
  chunkOffset: "x-chunk-offset",
  totalBytes: "x-total-bytes"
} as const

export interface ChunkHeader {
  readonly version: number
  readonly uploadId: string
  readonly chunkIndex: number
  readonly chunkCount: number
  readonly chunkOffset: number
  readonly totalBytes: number
}

/** The headers of one chunk (lower-case names, as Node hands them over). */
export const toHeaders = (h: ChunkHeader): Record<string, string> => ({
  [headerNames.version]: String(h.version),
  [headerNames.uploadId]: h.uploadId,
  [headerNames.chunkIndex]: String(h.chunkIndex),
  [headerNames.chunkCount]: String(h.chunkCount),
  [headerNames.chunkOffset]: String(h.chunkOffset),
  [headerNames.totalBytes]: String(h.totalBytes)
})

/** Reads and checks the protocol headers; fails with what is wrong. */
export const readHeaders = (
  headers: Readonly<Record<string, string | undefined>>
): Effect.Effect<ChunkHeader, string> => {
  const int = (name: string, min: number): number | string => {
    const raw = headers[name]
    const value = raw === undefined ? Number.NaN : Number(raw)
    return Number.isInteger(value) && value >= min ? value : `header ${name} must be an integer ≥ ${min}, got ${raw}`
  }
  const version = int(headerNames.version, 0)
  const chunkIndex = int(headerNames.chunkIndex, 0)
  const chunkCount = int(headerNames.chunkCount, 1)
  const chunkOffset = int(headerNames.chunkOffset, 0)
  const totalBytes = int(headerNames.totalBytes, 0)
  const uploadId = headers[headerNames.uploadId] ?? ""
  for (const v of [version, chunkIndex, chunkCount, chunkOffset, totalBytes])
    if (typeof v === "string") return Effect.fail(v)
  if (uploadId === "") return Effect.fail(`header ${headerNames.uploadId} is missing`)
  if ((chunkIndex as number) >= (chunkCount as number)) {
    return Effect.fail(`chunk ${chunkIndex} is out of range for ${chunkCount} chunks`)
  }
  return Effect.succeed({
    version: version as number,
    uploadId,
    chunkIndex: chunkIndex as number,
    chunkCount: chunkCount as number,
    chunkOffset: chunkOffset as number,
    totalBytes: totalBytes as number
  })
}

/** Cuts `bytes` into views of at most `chunkBytes`, with their offsets (an empty file is one empty chunk). */
export const chunks = (
  bytes: Uint8Array,
  chunkBytes: number
): Array<{ readonly offset: number; readonly bytes: Uint8Array }> => {
  if (bytes.byteLength === 0) return [{ offset: 0, bytes }]
  const out: Array<{ readonly offset: number; readonly bytes: Uint8Array }> = []
  for (let at = 0; at < bytes.byteLength; at += chunkBytes)
    out.push({ offset: at, bytes: bytes.subarray(at, at + chunkBytes) })
  return out
}

/** `http://host:port[/v1][/]` → `http://host:port`. */
export const baseUrl = (url: string): string => url.replace(/\/+$/, "").replace(/\/v1$/, "")

/** The safetensors file a snapshot travels as (an empty file for a version-only snapshot). */
export const encode = (snapshot: WeightSnapshot.WeightSnapshot): Uint8Array =>
  snapshot.names.length === 0
    ? new Uint8Array(0)
    : Safetensors.encode(
        snapshot.names.map((name, i) => ({ name, shape: snapshot.shapes[i]!, data: snapshot.data[i]! })),
        "F32"
      )

export interface UploadOptions {
  /** The server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted). */
  readonly url: string
  /** The server's weight token (`serve --token-env`). */
  readonly token: string
  /** Bytes per request; default 8 MiB. */
  readonly chunkBytes?: number
}

/** What one upload moved and how long it took. */
export interface Timing {
  readonly version: number
  readonly bytes: number
  readonly chunks: number
  readonly seconds: number
}

/** An upload the server refused, or one that did not reach it; `url` is the weights endpoint. */
export class WeightUploadError extends Schema.TaggedError<WeightUploadError>()("WeightUploadError", {
  url: Schema.String,
  message: Schema.String
}) {}

/**
 * Upload one snapshot to `url`'s `/v1/weights`, chunk by chunk (each retried on transport failure). Fails with the
 * server's message on 401 (token), 409 (older version), 413 (too large) and the like.
 */
export const upload = Effect.fnUntraced(function* (options: UploadOptions, snapshot: WeightSnapshot.WeightSnapshot) {
  const client = yield* HttpClient.HttpClient
  const url = `${baseUrl(options.url)}/v1/weights`
  const startedAt = yield* Clock.currentTimeMillis
  const file = encode(snapshot)
  const parts = chunks(file, options.chunkBytes ?? 8 * 1024 * 1024)
  const uploadId = `${snapshot.version}-${startedAt}-${(yield* Random.nextInt).toString(36)}`
  for (const [chunkIndex, part] of parts.entries()) {
    const request = HttpClientRequest.post(url).pipe(
      HttpClientRequest.bearerToken(options.token),
      HttpClientRequest.setHeaders(
        toHeaders({
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
      Effect.mapError(
        (e) => new WeightUploadError({ url, message: `chunk ${chunkIndex + 1}/${parts.length}: ${e.message}` })
      )
    )
    if (response.status !== 200) {
      const body = yield* response.text.pipe(Effect.orElseSucceed(() => ""))
      return yield* new WeightUploadError({
        url,
        message: `chunk ${chunkIndex + 1}/${parts.length}: HTTP ${response.status} ${body}`
      })
    }
  }
  const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
  return { version: snapshot.version, bytes: file.byteLength, chunks: parts.length, seconds } satisfies Timing
})

export interface Received {
  /** chunks of the current upload received so far */
  readonly chunks: number
  /** the whole file, once every chunk is in */
  readonly complete: Uint8Array | undefined
}

/** Server side: collects the chunks of one upload at a time. `add` throws on an inconsistent chunk. */
export const assembler = (options: { readonly maxBytes: number }) => {
  let current:
    | {
        readonly header: ChunkHeader
        readonly file: Uint8Array
        readonly seen: Array<boolean>
        count: number
      }
    | undefined
  const add = (header: ChunkHeader, body: Uint8Array): Received => {
    if (header.totalBytes > options.maxBytes) {
      throw new Error(`upload of ${header.totalBytes} bytes exceeds the limit of ${options.maxBytes}`)
    }
    if (current === undefined || current.header.uploadId !== header.uploadId) {
      current = {
        header,
        file: new Uint8Array(header.totalBytes),
        seen: Array.from({ length: header.chunkCount }, () => false),
        count: 0
      }
    }
    const h = current.header
    if (h.version !== header.version || h.chunkCount !== header.chunkCount || h.totalBytes !== header.totalBytes) {
      throw new Error(`chunk ${header.chunkIndex} disagrees with the upload's version, chunk count or size`)
    }
    const at = header.chunkOffset
    if (at + body.byteLength > header.totalBytes) {
      throw new Error(
        `chunk ${header.chunkIndex} (${body.byteLength} bytes at ${at}) overruns ${header.totalBytes} bytes`
      )
    }
    current.file.set(body, at)
    if (!current.seen[header.chunkIndex]) {
      current.seen[header.chunkIndex] = true
      current.count++
    }
    const done = current.count === h.chunkCount
    const result: Received = { chunks: current.count, complete: done ? current.file : undefined }
    if (done) current = undefined
    return result
  }
  return { add }
}
