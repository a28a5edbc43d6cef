/**
 * The wire of one RemoteEngine call to an OpenAI-compatible server (our `serve`, vLLM or SGLang): the request bodies,
 * the readers of the server's answers (token ids + behaviour log-probs, never re-tokenised), the POST that carries
 * them, and the engine's failures.
 *
 * Each GenerateRequest is one completions call (the server batches concurrent calls itself), for the model given or
 * else the first one `/v1/models` lists, sent as vLLM expects:
 *   `prompt: number[]`, `max_tokens`, `temperature`, `top_p`, `top_k` (-1 = off), `seed`, `stop`, `stop_token_ids`,
 *   `ignore_eos: true` (only the request's own stop ids end it), `logprobs: 0` (the sampled token's log-prob),
 *   `return_token_ids: true` (vLLM ≥ 0.10.2: `choices[i].token_ids`), `return_tokens_as_token_ids: true` (older vLLM:
 *   `logprobs.tokens` read `token_id:<id>`, the fallback), `include_stop_str_in_output`, `skip_special_tokens: false`.
 * The response's `token_ids` (else the ids in `logprobs.tokens`) and `logprobs.token_logprobs` become the result.
 * Behaviour log-probs from vLLM are comparable to the trainer's only when vLLM runs with
 * `--logprobs-mode processed_logprobs` (its default is raw logits' log-softmax, before temperature).
 * Our server also reports `policy_version_first/last` per choice.
 *
 * Chat: one turn is one `/v1/chat/completions` call with `messages`, `tools` + `tool_choice: "auto"` (vLLM started with
 * `--enable-auto-tool-choice --tool-call-parser hermes` reads the calls), the same sampling fields as above,
 * `logprobs: true`, `top_logprobs: 0`, `return_token_ids: true` and `return_tokens_as_token_ids: true`. The result is
 * the response's top-level `prompt_token_ids` (the prompt the server rendered), `choices[0].token_ids`,
 * `choices[0].logprobs.content[i].logprob` and `choices[0].message` (`content`, `tool_calls`); `finish_reason:
 * "tool_calls"` is a stop. Pinned from vLLM's source, where these fields are `ChatCompletionRequest.return_token_ids`,
 * `ChatCompletionResponse.prompt_token_ids` and `ChatCompletionResponseChoice.token_ids` (vLLM ≥ 0.10.2):
 * vllm/entrypoints/openai/chat_completion/protocol.py at
 * https://github.com/vllm-project/vllm/blob/002032ee2b18e1f7bd924ec47b62504ba3866063/vllm/entrypoints/openai/chat_completion/protocol.py
 * (`ChatCompletionLogProbs.content` of `{token, logprob, bytes, top_logprobs}`).
 *
 * Failures: no connection, timeouts, 429/503 are `InferenceError` Unreachable/Overloaded (retryable, retried with
 * backoff `maxRetries` times); other statuses and malformed bodies are BadResponse (4xx) or Internal (5xx).
 */
import { Duration, Effect, Schedule } from "effect"
import { type HttpClient, HttpClientRequest } from "effect/http"
import { InferenceError } from "../domain/Errors.ts"
import type { ToolCallWire } from "../domain/Message.ts"
import type { FinishReason } from "../domain/Trajectory.ts"
import type { ChatRequest, GenerateRequest } from "./InferenceEngine.ts"

const engineName = "remote"

export const error = (reason: InferenceError["reason"], message: string) =>
  new InferenceError({ engine: engineName, reason, message })

export const statusError = (status: number, body: string) =>
  error(
    status === 429 || status === 503 ? "Overloaded" : status >= 500 ? "Internal" : "BadResponse",
    `HTTP ${status}: ${body.slice(0, 500)}`
  )

interface Choice {
  readonly tokens: ReadonlyArray<number>
  readonly logprobs: ReadonlyArray<number>
  readonly finishReason: FinishReason | "abort"
  readonly versionFirst: number | undefined
  readonly versionLast: number | undefined
}

/** Reads choice 0 of a completions response (vLLM or ours). */
export const readChoice = (body: unknown): Choice | string => {
  const choice = (body as { choices?: ReadonlyArray<Record<string, unknown>> } | null)?.choices?.[0]
  if (choice === undefined) return "no choices in the response"
  const lp = choice["logprobs"] as { tokens?: ReadonlyArray<string>; token_logprobs?: ReadonlyArray<number> } | null
  let tokens = choice["token_ids"] as ReadonlyArray<number> | undefined
  if (!Array.isArray(tokens)) {
    const named = lp?.tokens
    if (!Array.isArray(named) || named.some((t) => !/^token_id:\d+$/.test(t))) {
      return "the response has neither token_ids nor token_id:<id> logprob tokens (vLLM return_token_ids)"
    }
    tokens = named.map((t) => Number(t.slice("token_id:".length)))
  }
  const logprobs = lp?.token_logprobs
  if (!Array.isArray(logprobs) || logprobs.length !== tokens.length || logprobs.some((v) => typeof v !== "number")) {
    return `the response has ${Array.isArray(logprobs) ? logprobs.length : "no"} log-probs for ${tokens.length} tokens`
  }
  const finish = choice["finish_reason"]
  if (finish !== "stop" && finish !== "length" && finish !== "abort") return `unknown finish_reason ${String(finish)}`
  const int = (v: unknown) => (Number.isInteger(v) ? (v as number) : undefined)
  return {
    tokens,
    logprobs,
    finishReason: finish,
    versionFirst: int(choice["policy_version_first"]),
    versionLast: int(choice["policy_version_last"])
  }
}

interface ChatChoice extends Choice {
  readonly promptIds: ReadonlyArray<number>
  readonly content: string | null
  readonly toolCalls: ReadonlyArray<ToolCallWire>
}

/** Reads choice 0 of a chat completions response (vLLM ≥ 0.10.2 with `return_token_ids`, or ours). */
export const readChatChoice = (body: unknown): ChatChoice | string => {
  const promptIds = (body as { prompt_token_ids?: unknown } | null)?.prompt_token_ids
  if (!Array.isArray(promptIds) || !promptIds.every(Number.isInteger)) {
    return "the chat response has no prompt_token_ids (vLLM ≥ 0.10.2 with return_token_ids)"
  }
  const choice = (body as { choices?: ReadonlyArray<Record<string, unknown>> } | null)?.choices?.[0]
  if (choice === undefined) return "no choices in the response"
  const tokens = choice["token_ids"]
  if (!Array.isArray(tokens) || !tokens.every(Number.isInteger)) {
    return "the chat response has no choices[0].token_ids (vLLM ≥ 0.10.2 with return_token_ids)"
  }
  const content = (choice["logprobs"] as { content?: ReadonlyArray<{ logprob?: unknown }> } | null)?.content
  const logprobs = Array.isArray(content) ? content.map((c) => c.logprob) : undefined
  if (logprobs === undefined || logprobs.length !== tokens.length || logprobs.some((v) => typeof v !== "number")) {
    return `the chat response has ${logprobs === undefined ? "no" : logprobs.length} log-probs for ${tokens.length} tokens`
  }
  const finish = choice["finish_reason"]
  if (finish !== "stop" && finish !== "length" && finish !== "abort" && finish !== "tool_calls") {
    return `unknown finish_reason ${String(finish)}`
  }
  const message = (choice["message"] ?? {}) as { content?: unknown; tool_calls?: unknown }
  const calls = Array.isArray(message.tool_calls) ? (message.tool_calls as ReadonlyArray<ToolCallWire>) : []
  if (calls.some((c) => typeof c?.function?.name !== "string" || typeof c.function.arguments !== "string")) {
    return "a tool call in the chat response has no function name or arguments"
  }
  const int = (v: unknown) => (Number.isInteger(v) ? (v as number) : undefined)
  return {
    promptIds: promptIds as ReadonlyArray<number>,
    tokens: tokens as ReadonlyArray<number>,
    logprobs: logprobs as ReadonlyArray<number>,
    finishReason: finish === "tool_calls" ? "stop" : finish,
    content: typeof message.content === "string" ? message.content : null,
    toolCalls: calls.map((c, i) => ({
      id: typeof c.id === "string" && c.id !== "" ? c.id : `call_${i}`,
      type: "function",
      function: { name: c.function.name, arguments: c.function.arguments }
    })),
    versionFirst: int(choice["policy_version_first"]),
    versionLast: int(choice["policy_version_last"])
  }
}

/** The sampling fields both request bodies send, in vLLM's names (only the request's own stop ids end it). */
const samplingFields = (s: GenerateRequest["sampling"]) => ({
  max_tokens: s.maxNewTokens,
  temperature: s.temperature,
  top_p: s.topP,
  top_k: s.topK === 0 ? -1 : s.topK,
  seed: s.seed,
  stop: [...s.stopStrings],
  stop_token_ids: [...s.stopTokenIds],
  ignore_eos: true
})

/** The chat completions body for one turn (see the module header). */
export const chatBody = (model: string, request: ChatRequest) => {
  const s = request.sampling
  const tools = request.tools ?? []
  return {
    model,
    messages: request.messages.map((m) => ({
      role: m.role,
      content: m.content,
      ...(m.tool_calls === undefined || m.tool_calls.length === 0 ? {} : { tool_calls: m.tool_calls }),
      ...(m.tool_call_id === undefined ? {} : { tool_call_id: m.tool_call_id }),
      ...(m.name === undefined ? {} : { name: m.name })
    })),
    ...(tools.length === 0 ? {} : { tools, tool_choice: "auto" }),
    ...samplingFields(s),
    logprobs: true,
    top_logprobs: 0,
    return_token_ids: true,
    return_tokens_as_token_ids: true,
    include_stop_str_in_output: true,
    n: 1
  }
}

/** The completions body for one request (see the module header). */
export const requestBody = (model: string, request: GenerateRequest) => {
  const s = request.sampling
  return {
    model,
    prompt: [...request.promptIds],
    ...samplingFields(s),
    logprobs: 0,
    return_token_ids: true,
    return_tokens_as_token_ids: true,
    include_stop_str_in_output: true,
    skip_special_tokens: false,
    n: 1
  }
}

/** The first model a server lists at `/v1/models`. */
export const servedModel = (client: HttpClient.HttpClient, base: string, apiKey: string | undefined) =>
  Effect.gen(function* () {
    const request = HttpClientRequest.get(`${base}/v1/models`).pipe(
      apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(apiKey)
    )
    const response = yield* client.execute(request)
    const body = (yield* response.json) as { data?: ReadonlyArray<{ id?: unknown }> } | null
    const id = body?.data?.[0]?.id
    if (response.status !== 200 || typeof id !== "string") {
      return yield* error("BadResponse", `${base}/v1/models lists no model (HTTP ${response.status})`)
    }
    return id
  }).pipe(
    Effect.catchTag("HttpClientError", (e) => Effect.fail(error("Unreachable", `${base}: ${e.message}`))),
    Effect.retry({ times: 3, schedule: Schedule.exponential("200 millis"), while: (e) => e.isRetryable })
  )

/** How the engine reaches its servers: one HTTP client, the key, the per-call timeout and the retries. */
export interface Connection {
  readonly client: HttpClient.HttpClient
  /** Sent as `Authorization: Bearer` on completions and control routes (vLLM `--api-key`). */
  readonly apiKey: string | undefined
  /** Per completions call. */
  readonly timeout: Duration.Duration
  /** Retries of a retryable failure. */
  readonly maxRetries: number
}

/** `effect` retried with backoff while its failure is retryable. */
export const retry =
  (connection: Connection) =>
  <A>(effect: Effect.Effect<A, InferenceError>) =>
    effect.pipe(
      Effect.retry({
        times: connection.maxRetries,
        schedule: Schedule.exponential("200 millis"),
        while: (e) => e.isRetryable
      })
    )

/** POST `body` to `route` on the server at `base` and read the answer with `read`, retried while retryable. */
export const post = <A>(
  connection: Connection,
  base: string,
  route: string,
  body: unknown,
  read: (body: unknown) => A | string
) =>
  Effect.gen(function* () {
    const http = HttpClientRequest.post(`${base}${route}`).pipe(
      connection.apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(connection.apiKey),
      HttpClientRequest.bodyJsonUnsafe(body)
    )
    const response = yield* connection.client
      .execute(http)
      .pipe(Effect.mapError((e) => error("Unreachable", `${base}: ${e.message}`)))
    const text = yield* response.text.pipe(Effect.mapError((e) => error("Unreachable", `${base}: ${e.message}`)))
    if (response.status !== 200) return yield* statusError(response.status, text)
    const parsed = yield* Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: () => error("BadResponse", `the response is not JSON: ${text.slice(0, 200)}`)
    })
    const value = read(parsed)
    if (typeof value === "string") return yield* error("BadResponse", value)
    return value
  }).pipe(
    Effect.timeoutOrElse({
      duration: connection.timeout,
      orElse: () => Effect.fail(error("Unreachable", `${base}: no answer in ${Duration.format(connection.timeout)}`))
    }),
    retry(connection)
  )

/** One completions call for `model` on the server at `base`. */
export const complete = (connection: Connection, base: string, model: string, request: GenerateRequest) =>
  post(connection, base, "/v1/completions", requestBody(model, request), readChoice)

/** One chat completions call (one turn) for `model` on the server at `base`. */
export const completeChat = (connection: Connection, base: string, model: string, request: ChatRequest) =>
  post(connection, base, "/v1/chat/completions", chatBody(model, request), readChatChoice)
