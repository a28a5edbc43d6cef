/**
 * The OpenAI-compatible HTTP API that `serve` runs over an InferenceEngine (a LocalEngine over a checkpoint).
 * Token ids in, token ids + behaviour log-probs out, in vLLM's wire conventions so that RemoteEngine talks to this
 * server and to vLLM alike. This module composes the routes; each family has its module, whose header documents its
 * wire:
 *
 * - `POST /v1/completions`: serve/Completions.ts.
 * - `POST /v1/chat/completions`: serve/ChatCompletions.ts (the reply's tool calls and `tool_choice`: ChatReply.ts).
 * - `POST /v1/responses` (OpenAI's Responses API): serve/Responses.ts.
 * - `POST /v1/messages` (Anthropic's Messages API): serve/Messages.ts.
 * - `GET /v1/models`, `GET /v1/models/{id}`, `GET /health`: serve/Models.ts.
 * - `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter` (vLLM's runtime LoRA routes): serve/LoraAdmin.ts.
 * - `POST /v1/weights` (new weights from a trainer): serve/WeightUpdates.ts.
 * - any other path or method (404, 405): serve/UnknownRoutes.ts.
 *
 * What they share: the request's body (RequestBody.ts), the model it names (Served.ts), the engine requests it becomes
 * with vLLM's sampling defaults, limits and structured outputs (EngineRequests.ts), the log-prob shapes
 * (LogprobShapes.ts), streamed answers (Streaming.ts) and vLLM's error body for every refusal (Refusal.ts).
 */
import { Effect } from "effect"
import { HttpRouter } from "effect/http"
import type { InferenceEngine } from "../inference/InferenceEngine.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import type { AdapterRegistry, ServedModel } from "./AdapterRegistry.ts"
import * as ChatCompletions from "./ChatCompletions.ts"
import * as Completions from "./Completions.ts"
import * as LoraAdmin from "./LoraAdmin.ts"
import * as Messages from "./Messages.ts"
import * as Models from "./Models.ts"
import * as Responses from "./Responses.ts"
import type * as Served from "./Served.ts"
import * as UnknownRoutes from "./UnknownRoutes.ts"
import * as WeightUpdates from "./WeightUpdates.ts"

export interface ServerOptions {
  readonly engine: InferenceEngine["Service"]
  readonly tokenizer: TokenizerImpl
  /** The name `/v1/models` lists and responses carry. */
  readonly modelName: string
  /** The context length (`max_model_len`): `/v1/models` lists it, and prompt + `max_tokens` must fit in it. */
  readonly maxModelLen: number
  /** Refuse request bodies larger than this (bytes, 413); default `defaultMaxRequestBytes(maxModelLen)`. */
  readonly maxRequestBytes?: number
  /** The most choices a request may ask for per prompt (`n`); default `defaultMaxN`. */
  readonly maxN?: number
  /** Bearer token of `/v1/weights`; without one the endpoint is closed (403). */
  readonly weightToken?: string
  /** Refuse weight uploads larger than this (bytes); default 4 GiB. */
  readonly maxWeightBytes?: number
  /** `log p(ids[t] | ids[<t])` for t ≥ 1 under the served weights, for `prompt_logprobs`; absent = unsupported. */
  readonly promptLogprobs?: (ids: ReadonlyArray<number>) => Promise<ReadonlyArray<number>>
  /** The `k` most likely tokens per sampled position (LogProbs.topK), for `top_logprobs`; absent = unsupported. */
  readonly topLogprobs?: ServedModel["topLogprobs"]
  /** LoRA adapters loaded at run time (vLLM's `/v1/load_lora_adapter`); absent = those routes answer 404. */
  readonly adapters?: AdapterRegistry
  /** How a chat request's `tools` reach the prompt; default: the chat template renders them (`templateTools`). */
  readonly toolPrompt?: ChatCompletions.ToolPrompt
  /** How many responses' conversations `previous_response_id` can name; default `Responses.defaultMaxStored`. */
  readonly maxStoredResponses?: number
}

/**
 * 32 bytes per token of context, at least 1 MiB: a whole context of text (a token is rarely over 8 characters, a
 * character at most 4 bytes of UTF-8) or of token ids (at most 7 bytes each as JSON) fits, with room for the rest.
 */
export const defaultMaxRequestBytes = (maxModelLen: number): number => Math.max(2 ** 20, 32 * maxModelLen)

/** vLLM sets no bound on `n`; one request still should not fill the engine's batch many times over. */
export const defaultMaxN = 64

/** The routes, as an HttpRouter layer (serve it with `HttpRouter.serve`). */
export const routes = (options: ServerOptions) =>
  HttpRouter.use(
    Effect.fnUntraced(function* (router) {
      const { engine, maxModelLen } = options
      const server: Served.Served = {
        tokenizer: options.tokenizer,
        modelName: options.modelName,
        maxModelLen,
        maxRequestBytes: options.maxRequestBytes ?? defaultMaxRequestBytes(maxModelLen),
        maxN: options.maxN ?? defaultMaxN,
        base: {
          engine,
          ...(options.promptLogprobs === undefined ? {} : { promptLogprobs: options.promptLogprobs }),
          ...(options.topLogprobs === undefined ? {} : { topLogprobs: options.topLogprobs })
        },
        ...(options.adapters === undefined ? {} : { adapters: options.adapters })
      }
      yield* router.add("GET", "/health", Models.health(server))
      yield* router.add("GET", "/v1/models", Models.list(server))
      yield* router.add("POST", "/v1/completions", Completions.handler(server))
      const toolPrompt = options.toolPrompt ?? ChatCompletions.templateTools
      yield* router.add("POST", "/v1/chat/completions", ChatCompletions.handler(server, toolPrompt))
      yield* router.add("POST", "/v1/responses", Responses.handler(server, toolPrompt, options.maxStoredResponses))
      yield* router.add("POST", "/v1/messages", Messages.handler(server, toolPrompt))
      yield* router.add("POST", "/v1/load_lora_adapter", LoraAdmin.load(server))
      yield* router.add("POST", "/v1/unload_lora_adapter", LoraAdmin.unload(server))
      yield* router.add(
        "POST",
        "/v1/weights",
        WeightUpdates.handler(engine, { token: options.weightToken, maxBytes: options.maxWeightBytes ?? 4 * 1024 ** 3 })
      )
      // OpenAI's `GET /v1/models/{model}` and every other route and method
      yield* router.add("*", "*", UnknownRoutes.handler(server))
    })
  )

/** The routes served by an HttpServer in context (NodeHttpServer.layer in `serve`, port 0 in tests). */
export const layer = (options: ServerOptions) => HttpRouter.serve(routes(options), { disableLogger: true })
