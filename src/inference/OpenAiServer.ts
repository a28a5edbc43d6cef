/**
 * The OpenAI-compatible HTTP API that `serve` runs over an InferenceEngine (a LocalEngine over a checkpoint).
 * Token ids in, token ids + behaviour log-probs out, in vLLM's wire conventions so that RemoteEngine talks to this
 * server and to vLLM alike:
 *
 * - `POST /v1/completions`: `prompt` is a string, strings, token ids (`number[]`) or batches of them (`number[][]`).
 *   Each choice carries `text`, `finish_reason`, `token_ids` (vLLM's `return_token_ids`), `logprobs` in the legacy
 *   completions shape (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`; with `return_tokens_as_token_ids`
 *   the tokens read `token_id:<id>`, as vLLM writes them) and, our extension, `policy_version_first/last`.
 *   `logprobs: k` (0..20) puts the k most likely tokens and the sampled one in each `top_logprobs` entry.
 * - `POST /v1/chat/completions`: renders the chat template (with `tools`), samples, and reads tool calls out of the
 *   text (env/ToolCallParser.ts, `auto`): a reply with calls has `message.tool_calls` and `finish_reason:
 *   "tool_calls"`, as vLLM's tool parsers give (`--enable-auto-tool-choice --tool-call-parser hermes`), with each
 *   call's `arguments` written as Python's `json.dumps(arguments, ensure_ascii=False)` writes them (vLLM's
 *   `Hermes2ProToolParser`, vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py at
 *   836d1f31211015f62485b0151fbbf85b6cc7a934), so a template that prints them back reproduces what was sampled.
 *   The response carries vLLM's `return_token_ids` fields (always: `prompt_token_ids` at the top level, the prompt
 *   as rendered; `choices[i].token_ids`) and, with `logprobs: true`, `choices[i].logprobs.content` of `{token,
 *   logprob, bytes, top_logprobs}` per sampled token (`token` reads `token_id:<id>` with
 *   `return_tokens_as_token_ids`; `top_logprobs: k` (0..20) lists the k most likely tokens). Shapes as vLLM's
 *   `ChatCompletionResponse` in vllm/entrypoints/openai/chat_completion/protocol.py
 *   (002032ee2b18e1f7bd924ec47b62504ba3866063).
 *   `prompt_logprobs: k` adds vLLM's per-prompt-token entries (the prompt token only, `rank` null).
 *   `tool_choice`: `auto` (the default with `tools`) reads calls; `none` reads none (the tools stay in the prompt, as
 *   vLLM keeps them); `required` and `{"type": "function", "function": {"name"}}` read calls (only the named
 *   function's) and refuse a reply without one with a 400 (param `tool_choice`): vLLM constrains decoding to a call
 *   (guided JSON) instead, which this server does not do. A named function not in `tools`, or `tool_choice` other
 *   than `none` without `tools`, are vLLM's 400s. How the tools reach the prompt is `toolPrompt` (layers/Serve.ts:
 *   as the served run was trained).
 * - Alternatives (`top_logprobs`, legacy `logprobs: k`): the k most likely tokens at each sampled position under
 *   `softmax(z / τ)` (τ = 1 for greedy), most likely first (model/LogProbs.ts `topK`), recomputed after sampling by
 *   one teacher-forced pass on the weights then served. With top-k/top-p the sampler renormalises over the tokens it
 *   keeps, so the sampled token's `logprob` can then exceed its value among the alternatives.
 * - `stream: true` on both: Server-Sent Events (`data: <chunk>` … `data: [DONE]`), chunks as OpenAI's and vLLM's, sent
 *   as the tokens are sampled (LocalEngine's `onToken`; an engine that returns whole completions has its tokens sent
 *   when it returns): completions send one chunk per token (`text`, `logprobs` of that token, vLLM's `token_ids:
 *   [id]`, on a choice's first chunk `prompt_token_ids`, on its last `finish_reason`); chat sends `delta.role` for
 *   every choice first, then one chunk per token (`delta.content`, `logprobs.content`, `token_ids`), then per choice
 *   the content not sent yet, OpenAI's `delta.tool_calls` pair per call (`{index, id, type, function: {name,
 *   arguments: ""}}`, then `{index, function: {arguments}}`) and a chunk with `finish_reason`. With tools offered the
 *   tool parser reads the whole reply, so the calls are sent once the generation ended, and the text from where a
 *   call's marker (`<tool_call>`, `<tool>`, a line starting `Action:`) starts or may start is held back until then
 *   (as is its leading whitespace). Two cases are sent only once the generation ended, replayed in the same chunks:
 *   `tool_choice` `required` or a named function (a reply without the call is still a 400) and alternatives
 *   (`top_logprobs` / `logprobs` k > 0, computed after sampling). A failure after the first chunk is a last event in
 *   the error body below, then `[DONE]`. `stream_options: {include_usage: true}` adds `usage: null` to each chunk
 *   and a last chunk with `choices: []` and the usage (`stream_options` without `stream` is vLLM's 400). Chunk fields
 *   pinned from vLLM's `CompletionResponseStreamChoice` (completion/protocol.py) and
 *   `ChatCompletionResponseStreamChoice` / `ChatCompletionStreamResponse` (chat_completion/protocol.py,
 *   vllm/entrypoints/openai/).
 * - Structured outputs on both (inference/StructuredOutput.ts has the fields and inference/JsonGrammar.ts what is
 *   generated): OpenAI's `response_format` (`json_schema`, `json_object`, `text`) and vLLM's `structured_outputs`
 *   (`json`, `json_object`, `choice`; v0.12+) and `guided_json` / `guided_choice` (before v0.12) constrain decoding:
 *   before each token a mask leaves only the tokens whose bytes keep the schema's automaton live, so the output
 *   always parses and validates. It ends (`finish_reason: "stop"`, no end-of-turn token) as soon as the value is
 *   complete and nothing can follow; a value that could go on (a bare number) also ends at an end-of-turn token,
 *   which the mask allows only there; `max_tokens` running out first is `"length"`, as OpenAI answers. The sampled
 *   tokens' `logprobs` are those of the masked distribution (softmax over the allowed tokens, renormalised);
 *   `top_logprobs` alternatives are recomputed unmasked. A schema keyword the automaton cannot enforce is a 400
 *   naming the keyword and where it is (`param` the field).
 * - `GET /v1/models` (the base, then each LoRA adapter), `GET /v1/models/{id}` (one card; an unknown id is the 404
 *   below), `GET /health` (`{status, policy_version}`). Any other path is a 404 (`Invalid URL (GET /x)`) and a known
 *   path with another method a 405 (`Invalid method for URL (…)`, with `Allow`), both in the error body below, as
 *   OpenAI's API answers them (vLLM answers FastAPI's `{"detail": …}` there).
 * - `model`: absent or the served name samples the base; a loaded LoRA adapter's name samples with it (and the
 *   response's `model` names it); any other name is vLLM's 404 (`The model \`x\` does not exist.`, param `model`).
 * - `POST /v1/weights`: a new WeightSnapshot as safetensors bytes, in one or more chunks (sync/HttpWeightSync.ts
 *   has the protocol), authenticated with `Authorization: Bearer <token>`. The last chunk applies the weights; the
 *   engine swaps them between two decode steps, so requests in flight continue on them. Without a token configured
 *   the endpoint answers 403: weights can never be replaced anonymously.
 *
 * - LoRA adapters at run time (`adapters`, inference/AdapterRegistry.ts), as vLLM serves them with `--enable-lora` and
 *   `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; without `adapters` both routes answer FastAPI's 404 `{"detail": "Not
 *   Found"}`, as vLLM's do when they are not attached.
 *   `POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace?}` reads the PEFT directory at `lora_path` (as the
 *   server sees it) and answers 200 with the plain text `Success: LoRA adapter '<name>' added successfully.`;
 *   `POST /v1/unload_lora_adapter {lora_name}` (`lora_int_id` is ignored) answers `Success: LoRA adapter '<name>'
 *   removed successfully.`. Refusals, in vLLM's error body: a name or path missing, 400 `InvalidUserInput` ("Both
 *   'lora_name' and 'lora_path' must be provided." / "'lora_name' needs to be provided to unload a LoRA adapter.");
 *   a name loaded already without `load_inplace: true`, 400 `InvalidUserInput`; unloading a name not loaded, 404
 *   `NotFoundError` ("The lora adapter '<name>' cannot be found."); a path with no adapter_config.json, 404
 *   `NotFoundError` ("Loading lora <name> failed: No adapter found for <path>"); an adapter that cannot be read or
 *   does not fit the base (rank, shapes, modules), 400 `BadRequestError` naming the file (vLLM up to 0.10 answered
 *   400 `BadRequestError` with its loader's message; later versions answer 500); past `--max-loras`, 400 (our
 *   limit: vLLM instead evicts the least recently used adapter from its `--max-cpu-loras` cache and reads it again
 *   on use, which a trainer that deletes old versions' directories cannot allow).
 *   An adapter named `<anything>-v<N>` reports policy version N; others report the base's version.
 *   Pinned from vLLM's source (https://github.com/vllm-project/vllm): the routes and their plain-text success in
 *   `vllm/entrypoints/serve/lora/api_router.py` (attached only with `VLLM_ALLOW_RUNTIME_LORA_UPDATING`; commit
 *   27873cab97e41ef32a6a8bcf83fa475a23e6e921), the request bodies in `vllm/entrypoints/serve/lora/protocol.py`
 *   (7fd1b43852e1c71c7cde24ab80ccbe46c2c68a18) and, with `load_inplace` (vllm-project/vllm#31326, 2026),
 *   `OpenAIServingModels` in `vllm/entrypoints/openai/models/serving.py` (00153c8b7948077ebdfc5bfa14e403da41aaea6d):
 *   the checks, messages and statuses above, the adapter model cards (`id` the name, `root` the path, `parent` the
 *   base), `check_model`'s 404; the not-found text is `LoRAAdapterNotFoundError` (`vllm/exceptions.py`); the 400 for
 *   unreadable adapters is `vllm/entrypoints/openai/serving_models.py` as of v0.8-v0.10
 *   (0f1457b0e1303e64ea1c1f3a3e6e0bf348348dc2). test/fixtures/vllm-lora-api.json keeps these shapes.
 *
 * Sampling defaults follow vLLM: `max_tokens` 16, `temperature` 1, `top_p` 1, `top_k` off (0 or -1), the tokenizer's
 * end-of-turn ids stop unless `ignore_eos`; `seed` is per request (choice j of prompt i uses `seed + i·n + j`).
 *
 * Limits, answered as vLLM answers them (400 with its error body, below) unless said otherwise:
 * - the body: at most `maxRequestBytes`, else 413; a body is read as it arrives and refused as soon as it passes the
 *   limit (a declared Content-Length past it is refused before any is read), so a client cannot make the server hold
 *   more. Not JSON, or not an object: 400.
 * - context: each prompt's tokens + `max_tokens` ≤ `maxModelLen`, with vLLM's message (chat prompts as rendered). Without `max_tokens` the
 *   default 16 is cut to the room left (vLLM fills the room), and a prompt of `maxModelLen` tokens or more is refused.
 * - `n`: an integer in 1..`maxN`; `max_tokens` / `max_completion_tokens`: an integer ≥ 1.
 */
import { timingSafeEqual } from "node:crypto"
import { Clock, Effect, Exit, Queue, Random, Scope, Stream } from "effect"
import { HttpRouter, type HttpServerRequest, HttpServerResponse } from "effect/http"
import type { InferenceError } from "../domain/Errors.ts"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as ToolCallParser from "../env/ToolCallParser.ts"
import type * as LogProbs from "../model/LogProbs.ts"
import * as Safetensors from "../model/Safetensors.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import type { AdapterError, AdapterRegistry, ServedModel } from "./AdapterRegistry.ts"
import type { GenerateRequest, GenerateResult, InferenceEngine, TokenEvent } from "./InferenceEngine.ts"
import * as StructuredOutput from "./StructuredOutput.ts"
import * as WeightUpload from "./WeightUpload.ts"

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
  readonly toolPrompt?: ToolPrompt
}

/**
 * How the tools a chat request offers are put in front of the model: the messages to render and the tools the chat
 * template is given (none: the template adds no tool prompt). `serve` picks one from the served run's
 * `environment.tool_prompt` (layers/Serve.ts), so the policy sees the tools as it saw them in training.
 */
export type ToolPrompt = (
  messages: ReadonlyArray<Message>,
  tools: ReadonlyArray<ToolDefinition>
) => { readonly messages: ReadonlyArray<Message>; readonly tools: ReadonlyArray<ToolDefinition> }

/** The chat template renders the tools (its own tool system prompt): `tool_prompt: template`, and vLLM's way. */
export const templateTools: ToolPrompt = (messages, tools) => ({ messages, tools })

/**
 * 32 bytes per token of context, at least 1 MiB: a whole context of text (a token is rarely over 8 characters, a
 * character at most 4 bytes of UTF-8) or of token ids (at most 7 bytes each as JSON) fits, with room for the rest.
 */
export const defaultMaxRequestBytes = (maxModelLen: number): number => Math.max(2 ** 20, 32 * maxModelLen)

/** vLLM sets no bound on `n`; one request still should not fill the engine's batch many times over. */
export const defaultMaxN = 64

/**
 * A request the server refuses: answered with `status` and vLLM's error body; `param` names the field at fault,
 * `type` overrides the status's error type (vLLM's LoRA checks say `InvalidUserInput`).
 */
class BadRequest {
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
const errorBody = (e: BadRequest) => ({
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

const fail = (message: string, status = 400, param: string | null = null, type?: string) =>
  Effect.fail(new BadRequest(message, status, param, type))

const respondError = (e: BadRequest) => HttpServerResponse.jsonUnsafe(errorBody(e), { status: e.status })

const fromInferenceError = (e: InferenceError) =>
  new BadRequest(
    e.message,
    e.reason === "BadResponse" ? 400 : e.reason === "Overloaded" ? 503 : e.reason === "Unreachable" ? 502 : 500
  )

// ---------------------------------------------------------------------------------------------------------------
// Request fields. Bodies are read leniently, as OpenAI servers do: unknown fields are ignored, null = absent.

type Json = Record<string, unknown>

const optionalNumber = (body: Json, key: string, check: (n: number) => boolean, expected: string) => {
  const value = body[key]
  if (value === undefined || value === null) return Effect.succeed(undefined)
  return typeof value === "number" && Number.isFinite(value) && check(value)
    ? Effect.succeed(value)
    : fail(`"${key}" must be ${expected}`, 400, key)
}

/** An optional integer in [min, max], refused in the words of vLLM's SamplingParams ("n must be at least 1, got 0."). */
const optionalInt = (body: Json, key: string, min: number, max = Number.POSITIVE_INFINITY) => {
  const value = body[key]
  if (value === undefined || value === null) return Effect.succeed(undefined)
  if (typeof value !== "number" || !Number.isInteger(value)) {
    return fail(`${key} must be an integer, got ${JSON.stringify(value)}.`, 400, key)
  }
  if (value < min) return fail(`${key} must be at least ${min}, got ${value}.`, 400, key)
  if (value > max) return fail(`${key} must be at most ${max}, got ${value}.`, 400, key)
  return Effect.succeed(value)
}

const isTokenIds = (value: unknown): value is ReadonlyArray<number> =>
  Array.isArray(value) && value.length > 0 && value.every((v) => Number.isInteger(v) && v >= 0)

/** `prompt` as token-id rows. Text is encoded with the tokenizer's own decoration (vLLM's `add_special_tokens`). */
const promptRows = (body: Json, tokenizer: TokenizerImpl) => {
  const prompt = body["prompt"]
  const encode = (text: string) => tokenizer.encode(text, { addSpecialTokens: true })
  if (typeof prompt === "string") return Effect.succeed([encode(prompt)])
  if (isTokenIds(prompt)) return Effect.succeed([prompt])
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === "string")) return Effect.succeed(prompt.map(encode))
    if (prompt.every(isTokenIds)) return Effect.succeed(prompt as ReadonlyArray<ReadonlyArray<number>>)
  }
  return fail(`"prompt" must be a string, strings, token ids or lists of token ids, all non-empty`, 400, "prompt")
}

const stopStrings = (body: Json) => {
  const stop = body["stop"]
  if (stop === undefined || stop === null) return Effect.succeed([] as ReadonlyArray<string>)
  if (typeof stop === "string") return Effect.succeed([stop])
  if (Array.isArray(stop) && stop.every((s) => typeof s === "string")) return Effect.succeed(stop as Array<string>)
  return fail(`"stop" must be a string or a list of strings`, 400, "stop")
}

interface Sampling {
  readonly n: number
  /** As asked; undefined: the default, cut to the room each prompt leaves (`budget`). */
  readonly maxTokens: number | undefined
  readonly temperature: number
  readonly topP: number
  readonly topK: number
  readonly seed: number | undefined
  readonly stopStrings: ReadonlyArray<string>
  readonly stopTokenIds: ReadonlyArray<number>
}

const samplingOf = (body: Json, tokenizer: TokenizerImpl, maxTokensKeys: ReadonlyArray<string>, maxN: number) =>
  Effect.gen(function* () {
    const n = (yield* optionalInt(body, "n", 1, maxN)) ?? 1
    let maxTokens: number | undefined
    for (const key of maxTokensKeys) maxTokens = (yield* optionalInt(body, key, 1)) ?? maxTokens
    const temperature = (yield* optionalNumber(body, "temperature", (v) => v >= 0, "≥ 0")) ?? 1
    const topP = (yield* optionalNumber(body, "top_p", (v) => v > 0 && v <= 1, "in (0, 1]")) ?? 1
    const topK = (yield* optionalNumber(body, "top_k", (v) => Number.isInteger(v) && v >= -1, "an integer ≥ -1")) ?? 0
    const seed = yield* optionalNumber(body, "seed", Number.isInteger, "an integer")
    const extraStopIds = body["stop_token_ids"]
    if (
      extraStopIds !== undefined &&
      extraStopIds !== null &&
      !isTokenIds(extraStopIds) &&
      !Array.isArray(extraStopIds)
    ) {
      return yield* fail(`"stop_token_ids" must be a list of token ids`, 400, "stop_token_ids")
    }
    const ids = Array.isArray(extraStopIds) ? (extraStopIds as ReadonlyArray<number>) : []
    const stopTokenIds = body["ignore_eos"] === true ? ids : [...new Set([...tokenizer.eosIds, ...ids])]
    return {
      n,
      maxTokens,
      temperature,
      topP,
      topK: Math.max(0, topK), // -1 (vLLM) and 0 (ours) both mean off
      seed,
      stopStrings: yield* stopStrings(body),
      stopTokenIds
    } satisfies Sampling
  })

const defaultMaxTokens = 16

/**
 * The tokens a prompt may be continued by: `max_tokens` when prompt + it fit in the context, else vLLM's 400 (the
 * messages of v0.10.1's `OpenAIServing._validate_input`, vllm/entrypoints/openai/serving_engine.py; `param` as later
 * versions name it). Without `max_tokens`, the default cut to the room left.
 */
const budget = (promptTokens: number, s: Sampling, maxModelLen: number) => {
  if (s.maxTokens !== undefined) {
    return promptTokens + s.maxTokens <= maxModelLen
      ? Effect.succeed(s.maxTokens)
      : fail(
          `This model's maximum context length is ${maxModelLen} tokens. However, you requested ` +
            `${promptTokens + s.maxTokens} tokens (${promptTokens} in the messages, ${s.maxTokens} in the completion). ` +
            `Please reduce the length of the messages or completion.`,
          400,
          "max_tokens"
        )
  }
  return promptTokens < maxModelLen
    ? Effect.succeed(Math.min(defaultMaxTokens, maxModelLen - promptTokens))
    : fail(
        `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${promptTokens} ` +
          `tokens in the messages, Please reduce the length of the messages.`,
        400,
        "input_tokens"
      )
}

/** One engine request per (prompt, sample): choice index `i·n + j`, as vLLM numbers them. */
const requestsOf = (prompts: ReadonlyArray<ReadonlyArray<number>>, s: Sampling, maxModelLen: number) =>
  Effect.gen(function* () {
    const budgets = yield* Effect.forEach(prompts, (promptIds) => budget(promptIds.length, s, maxModelLen))
    const base = s.seed ?? (yield* Random.nextIntBetween(0, 2 ** 31 - 1))
    return prompts.flatMap((promptIds, i) =>
      Array.from(
        { length: s.n },
        (_, j): GenerateRequest => ({
          promptIds,
          sampling: {
            maxNewTokens: budgets[i]!,
            temperature: s.temperature,
            topK: s.topK,
            topP: s.topP,
            stopTokenIds: s.stopTokenIds,
            stopStrings: s.stopStrings,
            seed: (base + i * s.n + j) % 2 ** 31
          }
        })
      )
    )
  })

// ---------------------------------------------------------------------------------------------------------------
// Responses

/** The legacy completions `logprobs` object for one choice. */
export const completionLogprobs = (
  tokenizer: TokenizerImpl,
  result: Pick<GenerateResult, "tokens" | "logprobs">,
  tokensAsIds: boolean,
  alternatives?: ReadonlyArray<ReadonlyArray<LogProbs.Alternative>>,
  offset = 0
) => {
  const name = (id: number) => (tokensAsIds ? `token_id:${id}` : tokenizer.decode([id]))
  const pieces = result.tokens.map((id) => tokenizer.decode([id]))
  const tokens = result.tokens.map(name)
  const textOffset: Array<number> = []
  let at = offset
  for (const piece of pieces) {
    textOffset.push(at)
    at += piece.length
  }
  return {
    tokens,
    token_logprobs: [...result.logprobs],
    // vLLM's: the k most likely tokens and the sampled one (k + 1 entries when it is not among them)
    top_logprobs: tokens.map((t, i) => {
      const top: Record<string, number> = {}
      for (const a of alternatives?.[i] ?? []) top[name(a.id)] ??= a.logprob
      top[t] ??= result.logprobs[i]!
      return top
    }),
    text_offset: textOffset
  }
}

/** The chat `logprobs.content` entries of sampled tokens, with their `top_logprobs` alternatives. */
const chatLogprobs = (
  tokenizer: TokenizerImpl,
  tokens: ReadonlyArray<number>,
  logprobs: ReadonlyArray<number>,
  tokensAsIds: boolean,
  alternatives?: ReadonlyArray<ReadonlyArray<LogProbs.Alternative>>
) => {
  const entry = (id: number, logprob: number) => {
    const piece = tokenizer.decode([id])
    return { token: tokensAsIds ? `token_id:${id}` : piece, logprob, bytes: [...Buffer.from(piece, "utf8")] }
  }
  return tokens.map((id, i) => ({
    ...entry(id, logprobs[i]!),
    top_logprobs: (alternatives?.[i] ?? []).map((a) => entry(a.id, a.logprob))
  }))
}

/**
 * The alternatives of every result (`k` per sampled token), or undefined for k = 0. Computed after sampling by one
 * teacher-forced pass over prompt + completion on the weights as they are then (a weight update during the request
 * makes them the new weights' alternatives).
 */
const alternativesOf = (
  served: ServedModel,
  requests: ReadonlyArray<GenerateRequest>,
  results: ReadonlyArray<GenerateResult>,
  k: number
) => {
  if (k === 0) return Effect.succeed(undefined)
  const score = served.topLogprobs
  if (score === undefined) return fail(`"top_logprobs" is not supported by this server`, 400, "top_logprobs")
  return Effect.forEach(results, (r, i) => {
    const request = requests[i]!
    return Effect.promise(() =>
      score([...request.promptIds, ...r.tokens], request.promptIds.length, k, request.sampling.temperature)
    )
  })
}

/** vLLM's default `--max-logprobs`: the most alternatives a request may ask for. */
const maxTopLogprobs = 20

/**
 * A streamed choice's text, token by token: each call adds a token and returns its share of the text (the text
 * decoded so far minus what earlier deltas gave); a piece that ends inside a UTF-8 character (U+FFFD at the end)
 * waits for the tokens that complete it, unless it is the last. `upTo` may hold back the text's tail (chat replies
 * that may turn into tool calls).
 */
const textDeltas = (tokenizer: TokenizerImpl, upTo: (text: string) => string = (text) => text) => {
  const tokens: Array<number> = []
  let sent = ""
  return {
    /** Add `token` (undefined: nothing visible, e.g. the end-of-turn token) and return the new text. */
    add: (token: number | undefined, last: boolean): string => {
      if (token !== undefined) tokens.push(token)
      const text = tokenizer.decode(tokens)
      if (!last && text.endsWith("\uFFFD")) return ""
      const shown = upTo(text)
      if (!shown.startsWith(sent)) return ""
      const delta = shown.slice(sent.length)
      sent = shown
      return delta
    },
    /** The text sent so far. */
    sent: () => sent,
    /** The whole text decoded. */
    text: () => tokenizer.decode(tokens)
  }
}

/** Where a tool call may begin in a reply (env/ToolCallParser.ts `auto`): tags anywhere, ReAct's words at a line start. */
const callTags = ["<tool_call>", "<tool>"]
const callWords = ["Action:"]

/**
 * The part of a reply that cannot belong to a tool call, streamed while a chat turn with tools is sampled: the text
 * before the first place a call's marker starts or may start (a partial tag at the end, a line that may become
 * `Action:`), without leading and trailing whitespace (the parsed reply's content is trimmed).
 */
export const beforeCalls = (text: string): string => {
  let cut = text.length
  for (const tag of callTags) {
    const at = text.indexOf(tag)
    if (at >= 0) cut = Math.min(cut, at)
    for (let k = Math.min(tag.length - 1, text.length); k > 0; k--) {
      if (text.endsWith(tag.slice(0, k))) {
        cut = Math.min(cut, text.length - k)
        break
      }
    }
  }
  let lineStart = 0
  const lines = text.split("\n")
  for (const [i, line] of lines.entries()) {
    const partial = i === lines.length - 1 && line.length > 0
    if (callWords.some((w) => line.startsWith(w) || (partial && w.startsWith(line)))) {
      cut = Math.min(cut, lineStart)
      break
    }
    lineStart += line.length + 1
  }
  return text.slice(0, cut).trim()
}

/** The common fields of every chunk of one streamed answer (OpenAI's and vLLM's `*.chunk` objects). */
const chunkOf =
  (
    head: { readonly id: string; readonly object: string; readonly created: number; readonly model: string },
    includeUsage: boolean
  ) =>
  (choices: ReadonlyArray<unknown>, extra: Json = {}) => ({
    ...head,
    choices,
    ...(includeUsage ? { usage: null } : {}),
    ...extra
  })

/** How a streamed answer is built: its first events, each token's events, and the events once all choices ended. */
interface StreamPlan {
  readonly requests: ReadonlyArray<GenerateRequest>
  /** The generation (and whatever is computed from its results, e.g. alternatives). */
  readonly generate: (
    requests: ReadonlyArray<GenerateRequest>
  ) => Effect.Effect<ReadonlyArray<GenerateResult>, BadRequest>
  readonly start: ReadonlyArray<unknown>
  /** Choice `index`'s token `t`, in order; `finishReason` is set on its last token. */
  readonly token: (index: number, t: number, event: TokenEvent) => ReadonlyArray<unknown>
  readonly end: (results: ReadonlyArray<GenerateResult>) => ReadonlyArray<unknown>
}

/** Result tokens from `from` on as token events (the last carries the finish reason). */
const tokenEvents = (r: GenerateResult, from: number): Array<TokenEvent> =>
  r.tokens.slice(from).map((token, k) => {
    const t = from + k
    const last = t === r.tokens.length - 1
    return {
      token,
      logprob: r.logprobs[t]!,
      version: last ? r.policyVersionLast : r.policyVersionFirst,
      ...(last ? { finishReason: r.finishReason } : {})
    }
  })

const encoder = new TextEncoder()
const sseLine = (event: unknown) => encoder.encode(`data: ${event === "[DONE]" ? event : JSON.stringify(event)}\n\n`)

const sseResponse = (body: Stream.Stream<Uint8Array>) =>
  HttpServerResponse.stream(body, { contentType: "text/event-stream", headers: { "cache-control": "no-cache" } })

/**
 * A Server-Sent Events answer (`data: <json>` per event, then `data: [DONE]`, as OpenAI and vLLM stream), generated
 * as it is sent: each token's events leave as the engine samples it (`GenerateRequest.onToken`; tokens of an engine
 * that returns whole completions are sent when it returns). The request's scope (an adapter held) closes when the
 * stream ends. A failure after the first event is sent as a last event in the error body, before `[DONE]`.
 */
const liveStream = (plan: StreamPlan, scope: Scope.Closeable) =>
  sseResponse(
    Stream.callback<Uint8Array>((queue) =>
      Effect.gen(function* () {
        const emit = (event: unknown) => {
          Queue.offerUnsafe(queue, sseLine(event))
        }
        plan.start.forEach(emit)
        const sent = plan.requests.map(() => 0)
        const hooked = plan.requests.map(
          (r, i): GenerateRequest => ({
            ...r,
            onToken: (event) => plan.token(i, sent[i]!++, event).forEach(emit)
          })
        )
        const result = yield* plan.generate(hooked).pipe(
          Effect.catchDefect((defect) =>
            Effect.fail(new BadRequest(defect instanceof Error ? defect.message : String(defect), 500))
          ),
          Effect.result
        )
        if (result._tag === "Failure") emit(errorBody(result.failure))
        else {
          result.success.forEach((r, i) => {
            for (const event of tokenEvents(r, sent[i]!)) plan.token(i, sent[i]!++, event).forEach(emit)
          })
          plan.end(result.success).forEach(emit)
        }
        emit("[DONE]")
        yield* Queue.end(queue)
      })
    ).pipe(Stream.ensuring(Scope.close(scope, Exit.void)))
  )

/** The same answer with the generation run first (so it can still be refused with a status): replayed from results. */
const bufferedStream = (plan: StreamPlan) =>
  Effect.map(plan.generate(plan.requests), (results) => {
    const events = [
      ...plan.start,
      ...results.flatMap((r, i) => tokenEvents(r, 0).flatMap((event, t) => plan.token(i, t, event))),
      ...plan.end(results),
      "[DONE]"
    ]
    return sseResponse(Stream.fromIterable(events.map(sseLine)))
  })

/**
 * Run a handler in a scope of its own: closed when the handler returns, unless the handler takes it (`keep`) for a
 * streamed answer that outlives it.
 */
const requestScoped = <R>(
  handler: (keep: () => Scope.Closeable) => Effect.Effect<HttpServerResponse.HttpServerResponse, BadRequest, R>
) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    let kept = false
    const exit = yield* handler(() => {
      kept = true
      return scope
    }).pipe(Scope.provide(scope), Effect.exit)
    if (!kept || exit._tag === "Failure") yield* Scope.close(scope, exit)
    return yield* exit
  })

/** `stream` and `stream_options.include_usage`. */
const streamingOf = (body: Json) => {
  const stream = body["stream"] === true
  const options = body["stream_options"]
  const includeUsage = typeof options === "object" && options !== null && (options as Json)["include_usage"] === true
  if (!stream && options !== undefined && options !== null) {
    return fail("Stream options can only be defined when `stream=True`.", 400, "stream_options")
  }
  return Effect.succeed({ stream, includeUsage })
}

/** What `tool_choice` asks of a chat reply. */
type ToolChoice = { readonly kind: "none" | "auto" | "required" } | { readonly kind: "named"; readonly name: string }

/** `tool_choice` read and checked against `tools`, with vLLM's refusals. Absent: `auto` with tools, else `none`. */
const toolChoiceOf = (body: Json, tools: ReadonlyArray<ToolDefinition>) => {
  const choice = body["tool_choice"]
  if (choice === undefined || choice === null)
    return Effect.succeed<ToolChoice>({ kind: tools.length > 0 ? "auto" : "none" })
  if (choice === "none") return Effect.succeed<ToolChoice>({ kind: "none" })
  if (tools.length === 0) {
    return fail("When using `tool_choice`, `tools` must be set.", 400, "tool_choice")
  }
  if (choice === "auto" || choice === "required") return Effect.succeed<ToolChoice>({ kind: choice })
  const name =
    typeof choice === "object" && (choice as Json)["type"] === "function"
      ? ((choice as Json)["function"] as Json | undefined)?.["name"]
      : undefined
  if (typeof name !== "string") {
    return fail(
      `"tool_choice" must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}`,
      400,
      "tool_choice"
    )
  }
  if (!tools.some((t) => t.function.name === name)) {
    return fail(`Tool '${name}' has not been passed in \`tools\`.`, 400, "tool_choice")
  }
  return Effect.succeed<ToolChoice>({ kind: "named", name })
}

/**
 * vLLM's `prompt_logprobs`: per prompt, `null` for the first token, then `{ "<id>": { logprob, rank, decoded_token } }`
 * for each later one (the prompt token only: alternatives are not computed, and `rank` is null).
 */
const promptLogprobsOf = (
  body: Json,
  score: ServedModel["promptLogprobs"],
  tokenizer: TokenizerImpl,
  prompts: ReadonlyArray<ReadonlyArray<number>>
) =>
  Effect.gen(function* () {
    const wanted = yield* optionalNumber(
      body,
      "prompt_logprobs",
      (v) => Number.isInteger(v) && v >= 0,
      "an integer ≥ 0"
    )
    if (wanted === undefined) return undefined
    if (score === undefined) {
      return yield* fail(`"prompt_logprobs" is not supported by this server`, 400, "prompt_logprobs")
    }
    return yield* Effect.forEach(prompts, (ids) =>
      Effect.map(
        Effect.promise(() => score(ids)),
        (values) => [
          null,
          ...values.map((logprob, t) => ({
            [String(ids[t + 1])]: { logprob, rank: null, decoded_token: tokenizer.decode([ids[t + 1]!]) }
          }))
        ]
      )
    )
  })

/** The assistant message of a chat completion: tool calls read out of the text when the request offered tools. */
export const chatMessage = (
  text: string,
  toolsOffered: boolean,
  only?: string
): { readonly message: Json; readonly finishReason: "tool_calls" | undefined } => {
  if (!toolsOffered) return { message: { role: "assistant", content: text }, finishReason: undefined }
  const parsed = ToolCallParser.parse(text, "auto")
  const calls = only === undefined ? parsed.calls : parsed.calls.filter((call) => call.name === only)
  if (calls.length === 0) return { message: { role: "assistant", content: text }, finishReason: undefined }
  const toolCalls: Array<ToolCallWire> = calls.map((call) => ({
    id: call.id,
    type: "function",
    function: { name: call.name, arguments: ToolCallParser.pythonJson(call.arguments) }
  }))
  // vLLM's tool parsers keep the text before the first call as content (null when there is none)
  const before = text.split(/<tool_call>|<tool>|^Action:/m)[0]!.trim()
  return {
    message: { role: "assistant", content: before === "" ? null : before, tool_calls: toolCalls },
    finishReason: "tool_calls"
  }
}

const readMessages = (body: Json) => {
  const messages = body["messages"]
  if (!Array.isArray(messages) || messages.length === 0) {
    return fail(`"messages" must be a non-empty list`, 400, "messages")
  }
  const out: Array<Message> = []
  for (const [i, m] of messages.entries()) {
    if (typeof m !== "object" || m === null) return fail(`messages[${i}] must be an object`, 400, "messages")
    const { role, content, tool_calls, tool_call_id, name } = m as Json
    if (role !== "system" && role !== "user" && role !== "assistant" && role !== "tool") {
      return fail(`messages[${i}].role must be system, user, assistant or tool`, 400, "messages")
    }
    // content: a string, null (an assistant turn with only tool calls) or OpenAI's list of text parts
    const text =
      typeof content === "string"
        ? content
        : content === null || content === undefined
          ? ""
          : Array.isArray(content)
            ? content.map((part) => (typeof part?.text === "string" ? part.text : "")).join("")
            : undefined
    if (text === undefined) {
      return fail(`messages[${i}].content must be a string or a list of text parts`, 400, "messages")
    }
    out.push({
      role,
      content: text,
      ...(Array.isArray(tool_calls) ? { tool_calls: tool_calls as Array<ToolCallWire> } : {}),
      ...(typeof tool_call_id === "string" ? { tool_call_id } : {}),
      ...(typeof name === "string" ? { name } : {})
    })
  }
  return Effect.succeed(out)
}

// ---------------------------------------------------------------------------------------------------------------

const secondsNow = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))

/**
 * The model a request names (`model`): absent, empty or the served name is the base; a loaded adapter is held for
 * the request's scope (an unload meanwhile frees it only after the request); anything else is vLLM's 404.
 */
const servedFor = (
  body: Json,
  options: ServerOptions,
  base: ServedModel
): Effect.Effect<{ readonly name: string; readonly served: ServedModel }, BadRequest, Scope.Scope> =>
  Effect.gen(function* () {
    const name = body["model"]
    if (name === undefined || name === null || name === "" || name === options.modelName) {
      return { name: options.modelName, served: base }
    }
    if (typeof name !== "string") return yield* fail(`"model" must be a string`, 400, "model")
    const adapter = options.adapters === undefined ? undefined : yield* options.adapters.use(name)
    if (adapter === undefined)
      return yield* fail(`The model \`${name}\` does not exist.`, 404, "model", "NotFoundError")
    return { name, served: adapter }
  })

/** What vLLM answers for each refused load or unload (see the module header). */
const fromAdapterError = (e: AdapterError, path: string) => {
  switch (e.reason) {
    case "AlreadyLoaded":
      return new BadRequest(
        `The lora adapter '${e.name}' has already been loaded. If you want to load the adapter in place, set ` +
          `'load_inplace' to True.`,
        400,
        null,
        "InvalidUserInput"
      )
    case "NotFound":
      return new BadRequest(`The lora adapter '${e.name}' cannot be found.`, 404)
    case "NoAdapter":
      return new BadRequest(`Loading lora ${e.name} failed: No adapter found for ${path}`, 404)
    case "Unreadable":
      return new BadRequest(`Loading lora ${e.name} failed: ${e.detail}`)
    case "TooMany":
      return new BadRequest(`Loading lora ${e.name} failed: ${e.detail}`)
  }
}

/** FastAPI's answer for a route that is not there: what vLLM's LoRA routes are without runtime updating. */
const routeNotFound = () => HttpServerResponse.jsonUnsafe({ detail: "Not Found" }, { status: 404 })

/** A non-empty string field, else undefined. */
const nonEmpty = (value: unknown): string | undefined =>
  typeof value === "string" && value.length > 0 ? value : undefined

/**
 * The body as a JSON object, read chunk by chunk and refused (413) as soon as it passes `maxBytes`. The rest is left
 * unread: the HTTP layer closes the connection after the answer rather than drain it (NodeHttpServer's teardown).
 */
const readJsonBody = (request: HttpServerRequest.HttpServerRequest, maxBytes: number) =>
  Effect.gen(function* () {
    const tooLarge = new BadRequest(`the request body exceeds this server's limit of ${maxBytes} bytes`, 413)
    if (Number(request.headers["content-length"]) > maxBytes) return yield* Effect.fail(tooLarge)
    const chunks: Array<Uint8Array> = []
    let bytes = 0
    yield* request.stream.pipe(
      Stream.mapError(() => new BadRequest("cannot read the request body")),
      Stream.runForEach((chunk) => {
        bytes += chunk.byteLength
        if (bytes > maxBytes) return Effect.fail(tooLarge)
        chunks.push(chunk)
        return Effect.void
      })
    )
    const body = yield* Effect.try({
      try: () => JSON.parse(Buffer.concat(chunks).toString("utf8")) as unknown,
      catch: (cause) => new BadRequest(`the body is not valid JSON: ${cause instanceof Error ? cause.message : ""}`)
    })
    return typeof body === "object" && body !== null && !Array.isArray(body)
      ? (body as Json)
      : yield* fail("the body must be a JSON object")
  })

/**
 * The requests with the body's structured-output constraint (StructuredOutput.ts: one automaton per choice, masks
 * memoised across them); a format that cannot be served is a 400 naming the field and the schema keyword.
 */
const constrained = (body: Json, tokenizer: TokenizerImpl, requests: ReadonlyArray<GenerateRequest>) =>
  Effect.gen(function* () {
    const grammar = yield* Effect.try({
      try: () => StructuredOutput.grammarOf(body),
      catch: (e) =>
        e instanceof StructuredOutput.FormatError ? new BadRequest(e.message, 400, e.param) : new BadRequest(String(e))
    })
    if (grammar === undefined) return requests
    const trie = StructuredOutput.trieOf(tokenizer)
    // masks depend on the grammar and the stop tokens: the same request format reuses them across requests
    const format = ["response_format", "structured_outputs", "guided_json", "guided_choice"].map((k) => body[k])
    const memo = StructuredOutput.memoFor(trie, JSON.stringify([format, requests[0]?.sampling.stopTokenIds]))
    return requests.map(
      (r): GenerateRequest => ({
        ...r,
        constraint: StructuredOutput.constraint(grammar, trie, r.sampling.stopTokenIds, memo)
      })
    )
  })

const generateAll = (engine: InferenceEngine["Service"], requests: ReadonlyArray<GenerateRequest>) =>
  engine.generate(requests).pipe(Effect.mapError(fromInferenceError))

const usage = (prompts: number, completions: number) => ({
  prompt_tokens: prompts,
  completion_tokens: completions,
  total_tokens: prompts + completions
})

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

/** Constant-time check of `Authorization: Bearer <token>`. */
const authorised = (request: HttpServerRequest.HttpServerRequest, token: string): boolean => {
  const header = request.headers["authorization"] ?? ""
  const given = Buffer.from(header.startsWith("Bearer ") ? header.slice(7).trim() : "")
  const expected = Buffer.from(token)
  return given.length === expected.length && timingSafeEqual(given, expected)
}

/** The routes, as an HttpRouter layer (serve it with `HttpRouter.serve`). */
export const routes = (options: ServerOptions) =>
  HttpRouter.use(
    Effect.fnUntraced(function* (router) {
      const { engine, tokenizer, modelName, maxModelLen } = options
      const maxRequestBytes = options.maxRequestBytes ?? defaultMaxRequestBytes(maxModelLen)
      const maxN = options.maxN ?? defaultMaxN
      const uploads = WeightUpload.assembler({ maxBytes: options.maxWeightBytes ?? 4 * 1024 ** 3 })
      const base: ServedModel = {
        engine,
        ...(options.promptLogprobs === undefined ? {} : { promptLogprobs: options.promptLogprobs }),
        ...(options.topLogprobs === undefined ? {} : { topLogprobs: options.topLogprobs })
      }
      const toolPrompt = options.toolPrompt ?? templateTools
      const handle = <R>(effect: Effect.Effect<HttpServerResponse.HttpServerResponse, BadRequest, R>) =>
        effect.pipe(
          Effect.catch((e: BadRequest) => Effect.succeed(respondError(e))),
          // a bug is still answered in the error body (500), not with an empty one
          Effect.catchDefect((defect) =>
            Effect.succeed(respondError(new BadRequest(defect instanceof Error ? defect.message : String(defect), 500)))
          )
        )

      yield* router.add(
        "GET",
        "/health",
        Effect.map(engine.version, (v) => HttpServerResponse.jsonUnsafe({ status: "ok", policy_version: v }))
      )

      /** The model cards: the base, then each LoRA adapter (vLLM's: `root` the adapter's path, `parent` the base). */
      const modelCards = Effect.gen(function* () {
        const created = yield* secondsNow
        const version = yield* engine.version
        const adapters = options.adapters === undefined ? [] : yield* options.adapters.list
        return [
          {
            id: modelName,
            object: "model",
            created,
            owned_by: "effect-rl",
            root: modelName,
            parent: null,
            max_model_len: maxModelLen,
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

      yield* router.add(
        "GET",
        "/v1/models",
        Effect.map(modelCards, (data) => HttpServerResponse.jsonUnsafe({ object: "list", data }))
      )

      yield* router.add("POST", "/v1/completions", (request) =>
        handle(
          requestScoped((keep) =>
            Effect.gen(function* () {
              const body = yield* readJsonBody(request, maxRequestBytes)
              const { name, served } = yield* servedFor(body, options, base)
              const { stream, includeUsage } = yield* streamingOf(body)
              const prompts = yield* promptRows(body, tokenizer)
              const sampling = yield* samplingOf(body, tokenizer, ["max_tokens"], maxN)
              // legacy `logprobs: k`: the sampled token's log-prob and the k most likely tokens
              const topK = yield* optionalInt(body, "logprobs", 0, maxTopLogprobs)
              const requests = yield* constrained(body, tokenizer, yield* requestsOf(prompts, sampling, maxModelLen))
              const tokensAsIds = body["return_tokens_as_token_ids"] === true
              const returnTokenIds = body["return_token_ids"] === true
              const promptLogprobs = yield* promptLogprobsOf(body, served.promptLogprobs, tokenizer, prompts)
              const created = yield* secondsNow
              const id = `cmpl-${created}-${(yield* Random.nextInt).toString(16)}`
              const usageOf = (results: ReadonlyArray<GenerateResult>) =>
                usage(
                  requests.reduce((n, r) => n + r.promptIds.length, 0),
                  results.reduce((n, r) => n + r.tokens.length, 0)
                )
              const extras = (index: number) => ({
                ...(returnTokenIds ? { prompt_token_ids: [...requests[index]!.promptIds] } : {}),
                ...(promptLogprobs === undefined
                  ? {}
                  : { prompt_logprobs: promptLogprobs[Math.floor(index / sampling.n)] })
              })
              let alternatives: ReadonlyArray<ReadonlyArray<ReadonlyArray<LogProbs.Alternative>>> | undefined
              const generate = (rs: ReadonlyArray<GenerateRequest>) =>
                Effect.gen(function* () {
                  const results = yield* generateAll(served.engine, rs)
                  alternatives = yield* alternativesOf(served, rs, results, topK ?? 0)
                  return results
                })
              if (!stream) {
                const results = yield* generate(requests)
                const choices = results.map((r, index) => ({
                  index,
                  text: tokenizer.decode(r.tokens),
                  logprobs:
                    topK === undefined ? null : completionLogprobs(tokenizer, r, tokensAsIds, alternatives?.[index]),
                  finish_reason: r.finishReason,
                  stop_reason: null,
                  token_ids: [...r.tokens],
                  ...extras(index),
                  policy_version_first: r.policyVersionFirst,
                  policy_version_last: r.policyVersionLast
                }))
                return HttpServerResponse.jsonUnsafe({
                  id,
                  object: "text_completion",
                  created,
                  model: name,
                  choices,
                  usage: usageOf(results)
                })
              }
              // vLLM's CompletionStreamResponse: one chunk per token, `token_ids` of that token, the prompt's ids on a
              // choice's first chunk, the finish reason on its last (vllm/entrypoints/openai/completion/protocol.py,
              // `CompletionResponseStreamChoice`)
              const chunk = chunkOf({ id, object: "text_completion", created, model: name }, includeUsage)
              const texts = requests.map(() => textDeltas(tokenizer))
              const offsets = requests.map(() => 0)
              const firstVersion = requests.map(() => 0)
              const finished = requests.map(() => false)
              const plan: StreamPlan = {
                requests,
                generate,
                start: [],
                token: (index, t, event) => {
                  const last = event.finishReason !== undefined
                  if (t === 0) firstVersion[index] = event.version
                  finished[index] = last
                  const logprobs =
                    topK === undefined
                      ? null
                      : completionLogprobs(
                          tokenizer,
                          { tokens: [event.token], logprobs: [event.logprob] },
                          tokensAsIds,
                          alternatives === undefined ? undefined : [alternatives[index]![t]!],
                          offsets[index]
                        )
                  offsets[index]! += tokenizer.decode([event.token]).length
                  return [
                    chunk([
                      {
                        index,
                        text: texts[index]!.add(event.token, last),
                        logprobs,
                        finish_reason: event.finishReason ?? null,
                        stop_reason: null,
                        token_ids: [event.token],
                        ...(t === 0 ? extras(index) : {}),
                        ...(last
                          ? { policy_version_first: firstVersion[index], policy_version_last: event.version }
                          : {})
                      }
                    ])
                  ]
                },
                end: (results) => [
                  // a choice that ended without a token of its own (nothing allowed, or no room) still says why
                  ...results.flatMap((r, index) =>
                    finished[index]
                      ? []
                      : [
                          chunk([
                            {
                              index,
                              text: "",
                              logprobs: null,
                              finish_reason: r.finishReason,
                              stop_reason: null,
                              token_ids: [],
                              ...(r.tokens.length === 0 ? extras(index) : {}),
                              policy_version_first: r.policyVersionFirst,
                              policy_version_last: r.policyVersionLast
                            }
                          ])
                        ]
                  ),
                  ...(includeUsage ? [chunk([], { usage: usageOf(results) })] : [])
                ]
              }
              // alternatives are computed after sampling: with them the answer is sent once the generation ended
              return topK !== undefined && topK > 0 ? yield* bufferedStream(plan) : liveStream(plan, keep())
            })
          )
        )
      )

      yield* router.add("POST", "/v1/chat/completions", (request) =>
        handle(
          requestScoped((keep) =>
            Effect.gen(function* () {
              const body = yield* readJsonBody(request, maxRequestBytes)
              const { name, served } = yield* servedFor(body, options, base)
              const { stream, includeUsage } = yield* streamingOf(body)
              const messages = yield* readMessages(body)
              const tools = Array.isArray(body["tools"]) ? (body["tools"] as ReadonlyArray<ToolDefinition>) : []
              const toolChoice = yield* toolChoiceOf(body, tools)
              const wantLogprobs = body["logprobs"] === true
              const topK = (yield* optionalInt(body, "top_logprobs", 0, maxTopLogprobs)) ?? 0
              if (topK > 0 && !wantLogprobs) {
                return yield* fail("when using `top_logprobs`, `logprobs` must be set to true.", 400, "top_logprobs")
              }
              // the tools reach the prompt as the served policy was trained to see them (`toolPrompt`)
              const prompt = tools.length > 0 ? toolPrompt(messages, tools) : { messages, tools: [] }
              const promptIds = yield* Effect.try({
                try: () =>
                  tokenizer.applyChatTemplateIds(prompt.messages, {
                    addGenerationPrompt: true,
                    ...(prompt.tools.length > 0 ? { tools: prompt.tools } : {}),
                    ...(typeof body["chat_template_kwargs"] === "object" && body["chat_template_kwargs"] !== null
                      ? (body["chat_template_kwargs"] as Json)
                      : {})
                  }),
                catch: (cause) => new BadRequest(cause instanceof Error ? cause.message : "chat template failed")
              })
              const sampling = yield* samplingOf(body, tokenizer, ["max_tokens", "max_completion_tokens"], maxN)
              const requests = yield* constrained(
                body,
                tokenizer,
                yield* requestsOf([promptIds], sampling, maxModelLen)
              )
              const created = yield* secondsNow
              const id = `chatcmpl-${created}-${(yield* Random.nextInt).toString(16)}`
              const eos = new Set(tokenizer.eosIds)
              const tokensAsIds = body["return_tokens_as_token_ids"] === true
              const toolsOn = toolChoice.kind !== "none"
              const usageOf = (results: ReadonlyArray<GenerateResult>) =>
                usage(
                  promptIds.length * requests.length,
                  results.reduce((n, r) => n + r.tokens.length, 0)
                )
              let alternatives: ReadonlyArray<ReadonlyArray<ReadonlyArray<LogProbs.Alternative>>> | undefined
              let replies: ReadonlyArray<ReturnType<typeof chatMessage>> = []
              const generate = (rs: ReadonlyArray<GenerateRequest>) =>
                Effect.gen(function* () {
                  const results = yield* generateAll(served.engine, rs)
                  alternatives = wantLogprobs ? yield* alternativesOf(served, rs, results, topK) : undefined
                  replies = results.map((r) => {
                    // the end-of-turn token is markup, not content (vLLM's skip_special_tokens)
                    const visible = r.tokens.filter((id, i) => !(i === r.tokens.length - 1 && eos.has(id)))
                    return chatMessage(
                      tokenizer.decode(visible),
                      toolsOn,
                      toolChoice.kind === "named" ? toolChoice.name : undefined
                    )
                  })
                  // `required` / a named function: vLLM constrains decoding to a call; we sample freely and refuse a
                  // reply without the call asked for
                  if (toolChoice.kind === "required" || toolChoice.kind === "named") {
                    const missing = replies.findIndex((reply) => reply.finishReason !== "tool_calls")
                    if (missing >= 0) {
                      return yield* fail(
                        `tool_choice ${toolChoice.kind === "named" ? `"${toolChoice.name}"` : '"required"'}: choice ` +
                          `${missing} has no ${toolChoice.kind === "named" ? `call to ${toolChoice.name}` : "tool call"} ` +
                          `(this server does not constrain decoding to tool calls; sample again or use "auto")`,
                        400,
                        "tool_choice"
                      )
                    }
                  }
                  return results
                })
              const logprobsOf = (
                index: number,
                tokens: ReadonlyArray<number>,
                logprobs: ReadonlyArray<number>,
                from: number
              ) =>
                chatLogprobs(
                  tokenizer,
                  tokens,
                  logprobs,
                  tokensAsIds,
                  alternatives?.[index]?.slice(from, from + tokens.length)
                )
              if (!stream) {
                const results = yield* generate(requests)
                const choices = results.map((r, index) => {
                  const { message, finishReason } = replies[index]!
                  return {
                    index,
                    message,
                    logprobs: wantLogprobs ? { content: logprobsOf(index, r.tokens, r.logprobs, 0) } : null,
                    finish_reason: finishReason ?? r.finishReason,
                    stop_reason: null,
                    token_ids: [...r.tokens],
                    policy_version_first: r.policyVersionFirst,
                    policy_version_last: r.policyVersionLast
                  }
                })
                return HttpServerResponse.jsonUnsafe({
                  id,
                  object: "chat.completion",
                  created,
                  model: name,
                  choices,
                  prompt_token_ids: promptIds,
                  usage: usageOf(results)
                })
              }
              // vLLM's ChatCompletionStreamResponse: `token_ids` per choice chunk, `prompt_token_ids` on the first chunk
              // (vllm/entrypoints/openai/chat_completion/protocol.py, `ChatCompletionResponseStreamChoice`)
              const chunk = chunkOf({ id, object: "chat.completion.chunk", created, model: name }, includeUsage)
              const choice = (index: number, delta: Json, more: Json = {}) => ({
                index,
                delta,
                logprobs: null,
                finish_reason: null,
                ...more
              })
              // with tools offered, text that may be the start of a call is held back until the reply is parsed
              const texts = requests.map(() => textDeltas(tokenizer, toolsOn ? beforeCalls : undefined))
              const plan: StreamPlan = {
                requests,
                generate,
                start: requests.map((_, index) =>
                  chunk(
                    [choice(index, { role: "assistant", content: "" })],
                    index === 0 ? { prompt_token_ids: promptIds } : {}
                  )
                ),
                token: (index, t, event) => {
                  const last = event.finishReason !== undefined
                  const visible = !(last && eos.has(event.token))
                  return [
                    chunk([
                      choice(
                        index,
                        { content: texts[index]!.add(visible ? event.token : undefined, last) },
                        {
                          logprobs: wantLogprobs
                            ? { content: logprobsOf(index, [event.token], [event.logprob], t) }
                            : null,
                          token_ids: [event.token]
                        }
                      )
                    ])
                  ]
                },
                end: (results) => [
                  ...results.flatMap((r, index) => {
                    const { message, finishReason } = replies[index]!
                    const calls = message["tool_calls"] as ReadonlyArray<ToolCallWire> | undefined
                    const content = typeof message["content"] === "string" ? message["content"] : ""
                    const sent = texts[index]!.sent()
                    // the content not sent yet: after what was sent (which skipped leading whitespace with tools on)
                    const rest =
                      sent === ""
                        ? content
                        : calls === undefined
                          ? content.slice(content.indexOf(sent) + sent.length)
                          : content.startsWith(sent)
                            ? content.slice(sent.length)
                            : ""
                    return [
                      ...(rest === "" ? [] : [chunk([choice(index, { content: rest })])]),
                      // OpenAI's tool-call deltas, each call's head (id, name) and then its arguments
                      ...(calls ?? []).flatMap((call, j) => [
                        chunk([
                          choice(index, {
                            tool_calls: [
                              {
                                index: j,
                                id: call.id,
                                type: "function",
                                function: { name: call.function.name, arguments: "" }
                              }
                            ]
                          })
                        ]),
                        chunk([
                          choice(index, {
                            tool_calls: [{ index: j, function: { arguments: call.function.arguments } }]
                          })
                        ])
                      ]),
                      chunk([
                        choice(
                          index,
                          {},
                          {
                            finish_reason: finishReason ?? r.finishReason,
                            stop_reason: null,
                            policy_version_first: r.policyVersionFirst,
                            policy_version_last: r.policyVersionLast
                          }
                        )
                      ])
                    ]
                  }),
                  ...(includeUsage ? [chunk([], { usage: usageOf(results) })] : [])
                ]
              }
              // `required` / a named function may refuse the reply, and alternatives are computed after sampling: the
              // answer is then sent once the generation ended
              return toolChoice.kind === "required" || toolChoice.kind === "named" || topK > 0
                ? yield* bufferedStream(plan)
                : liveStream(plan, keep())
            })
          )
        )
      )

      yield* router.add("POST", "/v1/load_lora_adapter", (request) =>
        handle(
          Effect.gen(function* () {
            const adapters = options.adapters
            if (adapters === undefined) return routeNotFound()
            const body = yield* readJsonBody(request, maxRequestBytes)
            const name = nonEmpty(body["lora_name"])
            const dir = nonEmpty(body["lora_path"])
            if (name === undefined || dir === undefined) {
              return yield* fail("Both 'lora_name' and 'lora_path' must be provided.", 400, null, "InvalidUserInput")
            }
            yield* adapters
              .load(name, dir, body["load_inplace"] === true)
              .pipe(Effect.mapError((e) => fromAdapterError(e, dir)))
            return HttpServerResponse.text(`Success: LoRA adapter '${name}' added successfully.`)
          })
        )
      )

      yield* router.add("POST", "/v1/unload_lora_adapter", (request) =>
        handle(
          Effect.gen(function* () {
            const adapters = options.adapters
            if (adapters === undefined) return routeNotFound()
            const body = yield* readJsonBody(request, maxRequestBytes)
            const name = nonEmpty(body["lora_name"])
            if (name === undefined) {
              return yield* fail(
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                400,
                null,
                "InvalidUserInput"
              )
            }
            yield* adapters.unload(name).pipe(Effect.mapError((e) => fromAdapterError(e, "")))
            return HttpServerResponse.text(`Success: LoRA adapter '${name}' removed successfully.`)
          })
        )
      )

      yield* router.add("POST", "/v1/weights", (request) =>
        handle(
          Effect.gen(function* () {
            const token = options.weightToken
            if (token === undefined) {
              return yield* fail("weight updates are disabled: the server was started without a token", 403)
            }
            if (!authorised(request, token)) return yield* fail("missing or wrong bearer token", 401)
            const header = yield* Effect.mapError(
              WeightUpload.readHeaders(request.headers),
              (message) => new BadRequest(message)
            )
            const bytes = yield* request.arrayBuffer.pipe(
              Effect.mapError(() => new BadRequest("cannot read the request body"))
            )
            const received = yield* Effect.mapError(
              Effect.try({
                try: () => uploads.add(header, new Uint8Array(bytes)),
                catch: (cause) => (cause instanceof Error ? cause.message : String(cause))
              }),
              (message) => new BadRequest(message, message.includes("exceeds") ? 413 : 400)
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
              catch: (cause) => new BadRequest(cause instanceof Error ? cause.message : String(cause))
            })
            const current = yield* engine.version
            if (snapshot.version < current) {
              return yield* fail(`version ${snapshot.version} is older than the engine's ${current}`, 409)
            }
            yield* engine.updateWeights(snapshot).pipe(Effect.mapError(fromInferenceError))
            return HttpServerResponse.jsonUnsafe({
              applied: true,
              version: snapshot.version,
              bytes: received.complete!.byteLength,
              tensors: snapshot.names.length
            })
          })
        )
      )

      // OpenAI's `GET /v1/models/{model}` (an id may hold slashes: the rest of the path is the id), and every other
      // route and method: OpenAI's error body, 405 where the path exists for another method
      yield* router.add("*", "*", (request) =>
        handle(
          Effect.gen(function* () {
            const at = request.url.split("?")[0]!
            if (request.method === "GET" && at.startsWith("/v1/models/")) {
              const id = decodeURIComponent(at.slice("/v1/models/".length))
              const card = (yield* modelCards).find((c) => c.id === id)
              if (card === undefined) return yield* fail(`The model \`${id}\` does not exist.`, 404, "model")
              return HttpServerResponse.jsonUnsafe(card)
            }
            const methods = knownRoutes[at] ?? (at.startsWith("/v1/models/") ? ["GET"] : undefined)
            return methods === undefined
              ? respondError(new BadRequest(`Invalid URL (${request.method} ${at})`, 404))
              : respondError(new BadRequest(`Invalid method for URL (${request.method} ${at})`, 405)).pipe(
                  HttpServerResponse.setHeader("allow", methods.join(", "))
                )
          })
        )
      )
    })
  )

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

/** The routes served by an HttpServer in context (NodeHttpServer.layer in `serve`, port 0 in tests). */
export const layer = (options: ServerOptions) => HttpRouter.serve(routes(options), { disableLogger: true })
