/**
 * New weights for the OpenAI-compatible server (OpenAiServer.ts), uploaded by a trainer:
 *
 * - `POST /v1/weights`: a new WeightSnapshot as safetensors bytes, in one or more chunks (sync/HttpWeightSync.ts
 *   has the protocol, weights/WeightUpload.ts both its ends), authenticated with `Authorization: Bearer <token>`.
 *   The last chunk applies the weights; the engine swaps them between two decode steps, so requests in flight
 *   continue on them. Without a token configured the endpoint answers 403: weights can never be replaced
 *   anonymously. Refusals are in the error body of serve/Refusal.ts.
 */
import { timingSafeEqual } from "node:crypto"
import { Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import type { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as Safetensors from "../model/Safetensors.ts"
import * as WeightUpload from "../weights/WeightUpload.ts"
import * as Refusal from "./Refusal.ts"

export interface WeightUpdatesOptions {
  /** Bearer token of `/v1/weights`; without one the endpoint is closed (403). */
  readonly token: string | undefined
  /** Refuse weight uploads larger than this (bytes). */
  readonly maxBytes: number
}

/** Constant-time check of `Authorization: Bearer <token>`. */
const authorised = (request: HttpServerRequest.HttpServerRequest, token: string): boolean => {
  const header = request.headers["authorization"] ?? ""
  const given = Buffer.from(header.startsWith("Bearer ") ? header.slice(7).trim() : "")
  const expected = Buffer.from(token)
  return given.length === expected.length && timingSafeEqual(given, expected)
}

/** `POST /v1/weights` onto `engine`: one upload assembler for the route, gathering each version's chunks. */
export const handler = (engine: InferenceEngine["Service"], options: WeightUpdatesOptions) => {
  const uploads = WeightUpload.assembler({ maxBytes: options.maxBytes })
  return (request: HttpServerRequest.HttpServerRequest) =>
    Refusal.handle(
      Effect.gen(function* () {
        const token = options.token
        if (token === undefined) {
          return yield* Refusal.fail("weight updates are disabled: the server was started without a token", 403)
        }
        if (!authorised(request, token)) return yield* Refusal.fail("missing or wrong bearer token", 401)
        const header = yield* Effect.mapError(
          WeightUpload.readHeaders(request.headers),
          (message) => new Refusal.BadRequest(message)
        )
        const bytes = yield* request.arrayBuffer.pipe(
          Effect.mapError(() => new Refusal.BadRequest("cannot read the request body"))
        )
        const received = yield* Effect.mapError(
          Effect.try({
            try: () => uploads.add(header, new Uint8Array(bytes)),
            catch: (cause) => (cause instanceof Error ? cause.message : String(cause))
          }),
          (message) => new Refusal.BadRequest(message, message.includes("exceeds") ? 413 : 400)
        )
        if (received.complete === undefined) {
          return HttpServerResponse.jsonUnsafe({
            applied: false,
            version: header.version,
            received: received.chunks,
            of: header.chunkCount
          })
        }
        const snapshot = yield* Effect.try({
          try: () => snapshotOf(header.version, received.complete!),
          catch: (cause) => new Refusal.BadRequest(cause instanceof Error ? cause.message : String(cause))
        })
        const current = yield* engine.version
        if (snapshot.version < current) {
          return yield* Refusal.fail(`version ${snapshot.version} is older than the engine's ${current}`, 409)
        }
        yield* engine.updateWeights(snapshot).pipe(Effect.mapError(Refusal.fromInferenceError))
        return HttpServerResponse.jsonUnsafe({
          applied: true,
          version: snapshot.version,
          bytes: received.complete!.byteLength,
          tensors: snapshot.names.length
        })
      })
    )
}

/** Safetensors bytes → snapshot (an empty body: a version-only update). */
const snapshotOf = (version: number, bytes: Uint8Array): WeightSnapshot.WeightSnapshot => {
  if (bytes.byteLength === 0) {
    return WeightSnapshot.make({ version: PolicyVersion.make(version), names: [], shapes: [], data: [] })
  }
  const decoded = Safetensors.decode(bytes, "upload")
  const names = [...decoded.tensors.keys()]
  return WeightSnapshot.make({
    version: PolicyVersion.make(version),
    names,
    shapes: names.map((n) => decoded.tensors.get(n)!.shape),
    data: names.map((n) => decoded.tensors.get(n)!.data)
  })
}
