/**
 * The models the OpenAI-compatible server (OpenAiServer.ts) lists, and its health:
 *
 * - `GET /v1/models` (the base, then each LoRA adapter), `GET /v1/models/{id}` (one card, served by the catch-all
 *   route, serve/UnknownRoutes.ts, as an id may hold slashes; an unknown id is a 404 in the error body of
 *   serve/Refusal.ts), `GET /health` (`{status, policy_version}`).
 */
import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import * as Refusal from "./Refusal.ts"
import * as Served from "./Served.ts"

/** `GET /health`. */
export const health = (server: Served.Served) =>
  Effect.map(server.base.engine.version, (v) => HttpServerResponse.jsonUnsafe({ status: "ok", policy_version: v }))

/** The model cards: the base, then each LoRA adapter (vLLM's: `root` the adapter's path, `parent` the base). */
const modelCards = (server: Served.Served) =>
  Effect.gen(function* () {
    const { modelName } = server
    const created = yield* Served.secondsNow
    const version = yield* server.base.engine.version
    const adapters = server.adapters === undefined ? [] : yield* server.adapters.list
    return [
      {
        id: modelName,
        object: "model",
        created,
        owned_by: "effect-rl",
        root: modelName,
        parent: null,
        max_model_len: server.maxModelLen,
        policy_version: version
      },
      ...adapters.map((a) => ({
        id: a.name,
        object: "model",
        created,
        owned_by: "effect-rl",
        root: a.path,
        parent: modelName,
        max_model_len: null
      }))
    ]
  })

/** `GET /v1/models`. */
export const list = (server: Served.Served) =>
  Effect.map(modelCards(server), (data) => HttpServerResponse.jsonUnsafe({ object: "list", data }))

/** `GET /v1/models/{id}`: OpenAI's `GET /v1/models/{model}`. */
export const card = (server: Served.Served, id: string) =>
  Effect.gen(function* () {
    const card = (yield* modelCards(server)).find((c) => c.id === id)
    if (card === undefined) return yield* Refusal.fail(`The model \`${id}\` does not exist.`, 404, "model")
    return HttpServerResponse.jsonUnsafe(card)
  })
