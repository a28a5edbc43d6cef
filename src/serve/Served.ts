/**
 * What the routes of the OpenAI-compatible server read, resolved once from its options (OpenAiServer.ts): the
 * tokenizer, the base model and the LoRA adapters loaded beside it (serve/AdapterRegistry.ts), and the request
 * limits; and which of those models a request names:
 *
 * - `model`: absent or the served name samples the base; a loaded LoRA adapter's name samples with it (and the
 *   response's `model` names it); any other name is vLLM's 404 (`The model \`x\` does not exist.`, param `model`),
 *   except behind a gateway, where every name is the policy.
 */
import { Clock, Effect, type Scope } from "effect"
import type { Message } from "../domain/Message.ts"
import type { GenerateResult } from "../inference/InferenceEngine.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import type { AdapterRegistry, ServedModel } from "./AdapterRegistry.ts"
import * as Refusal from "./Refusal.ts"
import type * as RequestBody from "./RequestBody.ts"

export interface Served {
  readonly tokenizer: TokenizerImpl
  /** The name `/v1/models` lists and responses carry. */
  readonly modelName: string
  /** The context length (`max_model_len`): `/v1/models` lists it, and prompt + `max_tokens` must fit in it. */
  readonly maxModelLen: number
  /** Request bodies larger than this (bytes) are refused (413). */
  readonly maxRequestBytes: number
  /** The most choices a request may ask for per prompt (`n`). */
  readonly maxN: number
  /** The base model: the served engine, with the log-prob scorers the server has. */
  readonly base: ServedModel
  /** LoRA adapters loaded at run time (vLLM's `/v1/load_lora_adapter`); absent = those routes answer 404. */
  readonly adapters?: AdapterRegistry
  /**
   * A gateway's settings (generator/AgentGateway.ts), absent for `serve`: any `model` name is the base, each chat turn's
   * fields and conversation are rewritten before they are read (the run's sampling), `max_tokens` is cut to the room
   * the prompt leaves instead of refused, and each turn answered is observed.
   */
  readonly gateway?: Gateway
}

/** One chat turn a gateway saw answered: the conversation as chat messages, the prompt as rendered, what was sampled. */
export interface ServedTurn {
  readonly messages: ReadonlyArray<Message>
  readonly promptIds: ReadonlyArray<number>
  readonly results: ReadonlyArray<GenerateResult>
  /** Each result's assistant message as the tool parser read it (`content`, `tool_calls`). */
  readonly replies: ReadonlyArray<RequestBody.Json>
  readonly llmMs: number
}

export interface Gateway {
  readonly rewrite: (body: RequestBody.Json) => RequestBody.Json
  /** The conversation as the gateway wants it rendered. */
  readonly messages: (messages: ReadonlyArray<Message>) => ReadonlyArray<Message>
  readonly observe: (turn: ServedTurn) => void
}

/** Now in whole seconds, as the `created` of responses and model cards. */
export const secondsNow = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))

/**
 * The model a request names (`model`): absent, empty or the served name is the base; a loaded adapter is held for
 * the request's scope (an unload meanwhile frees it only after the request); anything else is vLLM's 404.
 */
export const servedFor = (
  body: RequestBody.Json,
  served: Served
): Effect.Effect<{ readonly name: string; readonly served: ServedModel }, Refusal.BadRequest, Scope.Scope> =>
  Effect.gen(function* () {
    const name = body["model"]
    if (name === undefined || name === null || name === "" || name === served.modelName || served.gateway) {
      return { name: served.modelName, served: served.base }
    }
    if (typeof name !== "string") return yield* Refusal.fail(`"model" must be a string`, 400, "model")
    const adapter = served.adapters === undefined ? undefined : yield* served.adapters.use(name)
    if (adapter === undefined)
      return yield* Refusal.fail(`The model \`${name}\` does not exist.`, 404, "model", "NotFoundError")
    return { name, served: adapter }
  })
