/**
 * A request's JSON body, as every POST route of the OpenAI-compatible server (OpenAiServer.ts) reads it, and its
 * plain fields. Bodies are read leniently, as OpenAI servers do: unknown fields are ignored, null = absent.
 *
 * Limits, answered as vLLM answers them (400 with its error body, serve/Refusal.ts) unless said otherwise:
 * - the body: at most `maxRequestBytes`, else 413; a body is read as it arrives and refused as soon as it passes the
 *   limit (a declared Content-Length past it is refused before any is read), so a client cannot make the server hold
 *   more. Not JSON, or not an object: 400.
 */
import { Effect, Stream } from "effect"
import type { HttpServerRequest } from "effect/http"
import * as Refusal from "./Refusal.ts"

export type Json = Record<string, unknown>

/** A JSON object (not null, not an array). */
export const isJson = (value: unknown): value is Json =>
  typeof value === "object" && value !== null && !Array.isArray(value)

export const optionalNumber = (body: Json, key: string, check: (n: number) => boolean, expected: string) => {
  const value = body[key]
  if (value === undefined || value === null) return Effect.succeed(undefined)
  return typeof value === "number" && Number.isFinite(value) && check(value)
    ? Effect.succeed(value)
    : Refusal.fail(`"${key}" must be ${expected}`, 400, key)
}

/** An optional integer in [min, max], refused in the words of vLLM's SamplingParams ("n must be at least 1, got 0."). */
export const optionalInt = (body: Json, key: string, min: number, max = Number.POSITIVE_INFINITY) => {
  const value = body[key]
  if (value === undefined || value === null) return Effect.succeed(undefined)
  if (typeof value !== "number" || !Number.isInteger(value)) {
    return Refusal.fail(`${key} must be an integer, got ${JSON.stringify(value)}.`, 400, key)
  }
  if (value < min) return Refusal.fail(`${key} must be at least ${min}, got ${value}.`, 400, key)
  if (value > max) return Refusal.fail(`${key} must be at most ${max}, got ${value}.`, 400, key)
  return Effect.succeed(value)
}

/** A non-empty string field, else undefined. */
export const nonEmpty = (value: unknown): string | undefined =>
  typeof value === "string" && value.length > 0 ? value : undefined

/**
 * The body as a JSON object, read chunk by chunk and refused (413) as soon as it passes `maxBytes`. The rest is left
 * unread: the HTTP layer closes the connection after the answer rather than drain it (NodeHttpServer's teardown).
 */
export const readJsonBody = (request: HttpServerRequest.HttpServerRequest, maxBytes: number) =>
  Effect.gen(function* () {
    const tooLarge = new Refusal.BadRequest(`the request body exceeds this server's limit of ${maxBytes} bytes`, 413)
    if (Number(request.headers["content-length"]) > maxBytes) return yield* Effect.fail(tooLarge)
    const chunks: Array<Uint8Array> = []
    let bytes = 0
    yield* request.stream.pipe(
      Stream.mapError(() => new Refusal.BadRequest("cannot read the request body")),
      Stream.runForEach((chunk) => {
        bytes += chunk.byteLength
        if (bytes > maxBytes) return Effect.fail(tooLarge)
        chunks.push(chunk)
        return Effect.void
      })
    )
    const body = yield* Effect.try({
      try: () => JSON.parse(Buffer.concat(chunks).toString("utf8")) as unknown,
      catch: (cause) =>
        new Refusal.BadRequest(`the body is not valid JSON: ${cause instanceof Error ? cause.message : ""}`)
    })
    return isJson(body) ? body : yield* Refusal.fail("the body must be a JSON object")
  })
