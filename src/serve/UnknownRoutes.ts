/**
 * The OpenAI-compatible server's catch-all route (OpenAiServer.ts adds it after the others): OpenAI's
 * `GET /v1/models/{model}` (serve/Models.ts; an id may hold slashes, so the rest of the path is the id), and every
 * other path and method. Any other path is a 404 (`Invalid URL (GET /x)`) and a known path with another method a 405
 * (`Invalid method for URL (…)`, with `Allow`), both in the error body of serve/Refusal.ts, as OpenAI's API answers
 * them (vLLM answers FastAPI's `{"detail": …}` there).
 */
import { Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import * as Models from "./Models.ts"
import * as Refusal from "./Refusal.ts"
import type * as Served from "./Served.ts"

/** The paths this API serves and their methods, for the 405s of the catch-all route. */
const knownRoutes: Record<string, ReadonlyArray<string>> = {
  "/health": ["GET"],
  "/v1/models": ["GET"],
  "/v1/completions": ["POST"],
  "/v1/chat/completions": ["POST"],
  "/v1/weights": ["POST"],
  "/v1/load_lora_adapter": ["POST"],
  "/v1/unload_lora_adapter": ["POST"]
}

/** The catch-all route's handler. */
export const handler = (server: Served.Served) => (request: HttpServerRequest.HttpServerRequest) =>
  Refusal.handle(
    Effect.gen(function* () {
      const at = request.url.split("?")[0]!
      if (request.method === "GET" && at.startsWith("/v1/models/")) {
        return yield* Models.card(server, decodeURIComponent(at.slice("/v1/models/".length)))
      }
      const methods = knownRoutes[at] ?? (at.startsWith("/v1/models/") ? ["GET"] : undefined)
      return methods === undefined
        ? Refusal.respondError(new Refusal.BadRequest(`Invalid URL (${request.method} ${at})`, 404))
        : Refusal.respondError(new Refusal.BadRequest(`Invalid method for URL (${request.method} ${at})`, 405)).pipe(
            HttpServerResponse.setHeader("allow", methods.join(", "))
          )
    })
  )
