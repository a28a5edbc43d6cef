/**
 * The requests the OpenAI-compatible server (OpenAiServer.ts) refuses, and how it answers them: a status and vLLM's
 * error body (below), as every route family answers a refusal; a failure of the engine maps to a status of its own;
 * a bug is still answered in the error body (500), not with an empty one.
 */
import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import type { InferenceError } from "../domain/Errors.ts"

/**
 * A request the server refuses: answered with `status` and vLLM's error body; `param` names the field at fault,
 * `type` overrides the status's error type (vLLM's LoRA checks say `InvalidUserInput`).
 */
export class BadRequest {
  readonly _tag = "BadRequest"
  readonly message: string
  readonly status: number
  readonly param: string | null
  readonly type: string | undefined
  constructor(message: string, status = 400, param: string | null = null, type?: string) {
    this.message = message
    this.status = status
    this.param = param
    this.type = type
  }
}

/**
 * vLLM's error body since v0.10.1 (vllm-project/vllm#22099, `ErrorResponse`/`ErrorInfo` in
 * vllm/entrypoints/openai/protocol.py; https://github.com/vllm-project/vllm/pull/22099):
 * `{"error": {"message", "type", "param", "code"}}`. Before v0.10.1 the same fields sat at the top level beside
 * `"object": "error"`; OpenAI's own API nests them as here. `type` is the status's name + "Error", as vLLM's
 * `err_type` spells it ("BadRequestError", "NotFoundError", "InternalServerError").
 */
export const errorBody = (e: BadRequest) => ({
  error: {
    message: e.message,
    type: e.type ?? errorTypes[e.status] ?? "BadRequestError",
    param: e.param,
    code: e.status
  }
})

const errorTypes: Record<number, string> = {
  400: "BadRequestError",
  401: "UnauthorizedError",
  403: "ForbiddenError",
  404: "NotFoundError",
  409: "ConflictError",
  405: "MethodNotAllowedError",
  413: "RequestEntityTooLargeError",
  500: "InternalServerError",
  502: "BadGatewayError",
  503: "ServiceUnavailableError"
}

export const fail = (message: string, status = 400, param: string | null = null, type?: string) =>
  Effect.fail(new BadRequest(message, status, param, type))

export const respondError = (e: BadRequest, body: (e: BadRequest) => unknown = errorBody) =>
  HttpServerResponse.jsonUnsafe(body(e), { status: e.status })

export const fromInferenceError = (e: InferenceError) =>
  new BadRequest(
    e.message,
    e.reason === "BadResponse" ? 400 : e.reason === "Overloaded" ? 503 : e.reason === "Unreachable" ? 502 : 500
  )

/** A route's answer with its refusals, and its defects, answered in the error body (`body`: another API's). */
export const handle = <R>(
  effect: Effect.Effect<HttpServerResponse.HttpServerResponse, BadRequest, R>,
  body: (e: BadRequest) => unknown = errorBody
) =>
  effect.pipe(
    Effect.catch((e: BadRequest) => Effect.succeed(respondError(e, body))),
    // a bug is still answered in the error body (500), not with an empty one
    Effect.catchDefect((defect) =>
      Effect.succeed(respondError(new BadRequest(defect instanceof Error ? defect.message : String(defect), 500), body))
    )
  )
