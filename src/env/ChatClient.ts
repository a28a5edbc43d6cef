/**
 * A client for any OpenAI-compatible chat-completions endpoint (our `serve`, vLLM, a hosted API), for the LLM calls
 * a run makes besides its policy's: an LLM judge, a task generator. Every call leaves an `LlmCallRecord`, and a
 * client in `replay` mode answers from such records with no endpoint, as `ToolIo` does for tool calls.
 *
 * - `live`: POST `<url>/chat/completions` with `{model, messages, response_format?, temperature?, max_tokens?,
 *   seed?}` and a bearer key when one is given (a `Redacted` value: it is never logged or put in an error). At most
 *   `maxConcurrency` calls are in flight; a 429, 502, 503, 504, a refused connection or a timeout is retried up to
 *   `retries` times with exponential backoff from `backoffMs` (doubling each time); anything else fails at once.
 * - `record`: live, and every record of the run is also kept in `recorded`, in completion order.
 * - `replay`: the n-th call with a given request gets the n-th recorded answer to that request (the key is the
 *   request's canonical JSON: the body without URL or key, object keys sorted). A call with no such record fails
 *   with `ReplayMissError`: replay never invents an answer.
 *
 * Usage is the endpoint's `usage.prompt_tokens` / `completion_tokens` (0 when it reports none); `cost` is those
 * tokens at `prices` (per token, e.g. dollars), 0 without prices. Replayed calls report the recorded usage, so a
 * replayed run's token and cost metrics equal the recorded run's.
 */
import { Clock, Config, Effect, Option, Redacted, Schedule, Schema, Semaphore } from "effect"
import type { LlmCallRecord } from "../domain/LlmCall.ts"
import { canonicalJson, ReplayMissError, replayTable } from "./ToolIo.ts"

export interface ChatMessage {
  readonly role: "system" | "user" | "assistant"
  readonly content: string
}

/** One chat completion to ask for. Unset sampling fields take the client's defaults (and are left out if none). */
export interface ChatRequest {
  readonly messages: ReadonlyArray<ChatMessage>
  /** Passed through as `response_format`, e.g. `{ type: "json_schema", json_schema: { name, schema, strict } }`. */
  readonly responseFormat?: unknown
  readonly temperature?: number
  readonly maxTokens?: number
  readonly seed?: number
}

export interface ChatResponse {
  readonly content: string
  readonly finishReason: string
  readonly promptTokens: number
  readonly completionTokens: number
  /** The tokens at the client's prices. */
  readonly cost: number
  /** True when the answer came from a record, not the endpoint. */
  readonly replayed: boolean
  readonly record: LlmCallRecord
}

/** A call that got no usable answer from the endpoint; `endpoint` is the URL posted to. */
export class ChatClientError extends Schema.TaggedError<ChatClientError>()("ChatClientError", {
  endpoint: Schema.String,
  reason: Schema.Literals(["RateLimited", "Unavailable", "Connection", "Timeout", "Http", "BadResponse"]),
  status: Schema.optionalKey(Schema.Int),
  message: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {
  /** Worth another try: the endpoint was busy, starting, or unreachable for a moment. */
  get isRetryable() {
    return (
      this.reason === "RateLimited" ||
      this.reason === "Unavailable" ||
      this.reason === "Connection" ||
      this.reason === "Timeout"
    )
  }
}

export interface Prices {
  /** Per prompt token. */
  readonly prompt: number
  /** Per completion token. */
  readonly completion: number
}

export interface ChatClientOptions {
  /** Base URL of the API, e.g. `http://localhost:8000/v1`; calls go to `<url>/chat/completions`. */
  readonly url: string
  readonly model: string
  readonly apiKey?: Redacted.Redacted<string> | undefined
  readonly temperature?: number | undefined
  readonly maxTokens?: number | undefined
  readonly seed?: number | undefined
  /** Calls in flight at once (default 4). */
  readonly maxConcurrency?: number | undefined
  /** Retries of a retryable failure (default 3). */
  readonly retries?: number | undefined
  /** First backoff; each retry waits twice the previous (default 250 ms). */
  readonly backoffMs?: number | undefined
  /** Per attempt (default 120 s). */
  readonly timeoutMs?: number | undefined
  readonly prices?: Prices | undefined
  readonly mode?: "live" | "record" | "replay" | undefined
  /** What `replay` answers from. */
  readonly records?: ReadonlyArray<LlmCallRecord> | undefined
}

export interface ChatClient {
  readonly mode: "live" | "record" | "replay"
  /** The URL calls go to (`<url>/chat/completions`), for messages; in replay nothing is posted there. */
  readonly endpoint: string
  readonly model: string
  readonly complete: (request: ChatRequest) => Effect.Effect<ChatResponse, ChatClientError | ReplayMissError>
  /** Every record so far (`record` mode), in completion order; empty in the other modes. */
  readonly recorded: Effect.Effect<ReadonlyArray<LlmCallRecord>>
}

/** The body sent for `request`: the endpoint-independent part, which is also the replay key. */
export const requestBody = (options: ChatClientOptions, request: ChatRequest): Record<string, unknown> => {
  const temperature = request.temperature ?? options.temperature
  const maxTokens = request.maxTokens ?? options.maxTokens
  const seed = request.seed ?? options.seed
  return {
    model: options.model,
    messages: request.messages.map((m) => ({ role: m.role, content: m.content })),
    ...(request.responseFormat === undefined ? {} : { response_format: request.responseFormat }),
    ...(temperature === undefined ? {} : { temperature }),
    ...(maxTokens === undefined ? {} : { max_tokens: maxTokens }),
    ...(seed === undefined ? {} : { seed })
  }
}

/** The replay key of a request body. */
export const keyOf = (body: unknown): string => canonicalJson(body)

interface Answer {
  readonly content: string
  readonly finishReason: string
  readonly promptTokens: number
  readonly completionTokens: number
}

const parseAnswer = (endpoint: string, status: number, text: string): Effect.Effect<Answer, ChatClientError> => {
  const fail = (reason: ChatClientError["reason"], message: string) =>
    Effect.fail(new ChatClientError({ endpoint, reason, status, message }))
  const head = text.slice(0, 300)
  if (status === 429) return fail("RateLimited", `${endpoint}: HTTP 429 (rate limited): ${head}`)
  if (status === 502 || status === 503 || status === 504) {
    return fail("Unavailable", `${endpoint}: HTTP ${status} (unavailable): ${head}`)
  }
  if (status >= 400) {
    return fail("Http", `${endpoint}: HTTP ${status}: ${head}; check the endpoint's url, model and api key`)
  }
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    return fail("BadResponse", `${endpoint}: the answer is not JSON: ${head}`)
  }
  const b = body as {
    choices?: ReadonlyArray<{ message?: { content?: unknown }; finish_reason?: unknown }>
    usage?: { prompt_tokens?: unknown; completion_tokens?: unknown }
  }
  const choice = b.choices?.[0]
  const content = choice?.message?.content
  if (typeof content !== "string") {
    return fail("BadResponse", `${endpoint}: no choices[0].message.content in ${head}`)
  }
  const count = (v: unknown) => (typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : 0)
  return Effect.succeed({
    content,
    finishReason: typeof choice?.finish_reason === "string" ? choice.finish_reason : "stop",
    promptTokens: count(b.usage?.prompt_tokens),
    completionTokens: count(b.usage?.completion_tokens)
  })
}

const post = (
  endpoint: string,
  apiKey: Redacted.Redacted<string> | undefined,
  timeoutMs: number,
  body: Record<string, unknown>
): Effect.Effect<Answer, ChatClientError> =>
  Effect.tryPromise({
    try: async (signal) => {
      const response = await fetch(endpoint, {
        method: "POST",
        signal: AbortSignal.any([signal, AbortSignal.timeout(timeoutMs)]),
        headers: {
          "content-type": "application/json",
          ...(apiKey === undefined ? {} : { authorization: `Bearer ${Redacted.value(apiKey)}` })
        },
        body: JSON.stringify(body)
      })
      return { status: response.status, text: await response.text() }
    },
    catch: (cause) => {
      const timeout = cause instanceof Error && cause.name === "TimeoutError"
      return new ChatClientError({
        endpoint,
        reason: timeout ? "Timeout" : "Connection",
        message: timeout
          ? `${endpoint}: no answer within ${timeoutMs} ms`
          : `${endpoint}: request failed (${cause instanceof Error ? (cause.cause instanceof Error ? cause.cause.message : cause.message) : "unknown"}); is the endpoint running?`,
        cause
      })
    }
  }).pipe(Effect.flatMap(({ status, text }) => parseAnswer(endpoint, status, text)))

const costOf = (prices: Prices | undefined, promptTokens: number, completionTokens: number) =>
  prices === undefined ? 0 : promptTokens * prices.prompt + completionTokens * prices.completion

/** A client over `options` (live, record, or replay from `options.records`). */
export const make = (options: ChatClientOptions): ChatClient => {
  const mode = options.mode ?? "live"
  const endpoint = `${options.url.replace(/\/+$/, "")}/chat/completions`
  const retries = options.retries ?? 3
  const backoffMs = options.backoffMs ?? 250
  const timeoutMs = options.timeoutMs ?? 120_000
  const permits = Semaphore.makeUnsafe(options.maxConcurrency ?? 4)
  const kept: Array<LlmCallRecord> = []

  const respond = (record: LlmCallRecord, replayed: boolean): ChatResponse => ({
    content: record.content,
    finishReason: record.finishReason,
    promptTokens: record.promptTokens,
    completionTokens: record.completionTokens,
    cost: costOf(options.prices, record.promptTokens, record.completionTokens),
    replayed,
    record
  })

  if (mode === "replay") {
    const table = replayTable(options.records ?? [], (r) => keyOf(r.request))
    const next = table.session()
    const complete = (request: ChatRequest) =>
      Effect.suspend(() => {
        const key = keyOf(requestBody(options, request))
        const { hit, occurrence } = next(key)
        if (hit === undefined) {
          return Effect.fail(
            new ReplayMissError({
              tool: `llm:${options.model}`,
              arguments: key,
              occurrence,
              message: `no recorded answer for call #${occurrence + 1} of this request to ${options.model} (${table.keys} recorded requests): replay answers only what the recorded run asked`
            })
          )
        }
        return Effect.succeed(respond(hit, true))
      })
    return { mode, endpoint, model: options.model, complete, recorded: Effect.succeed([]) }
  }

  const complete = (request: ChatRequest) =>
    Effect.gen(function* () {
      const body = requestBody(options, request)
      const start = yield* Clock.currentTimeMillis
      const answer = yield* post(endpoint, options.apiKey, timeoutMs, body).pipe(
        Effect.retry({
          schedule: Schedule.exponential(`${backoffMs} millis`),
          times: retries,
          while: (e) => e.isRetryable
        }),
        Effect.mapError((e) =>
          e.isRetryable
            ? new ChatClientError({
                endpoint: e.endpoint,
                reason: e.reason,
                ...(e.status === undefined ? {} : { status: e.status }),
                message: `${e.message} (gave up after ${retries + 1} attempts)`,
                cause: e.cause
              })
            : e
        ),
        permits.withPermits(1)
      )
      const record: LlmCallRecord = { request: body, ...answer, ms: (yield* Clock.currentTimeMillis) - start }
      if (mode === "record") kept.push(record)
      return respond(record, false)
    })
  return { mode, endpoint, model: options.model, complete, recorded: Effect.sync(() => [...kept]) }
}

/** Reads an API key named by a config `{ env: NAME }` reference through Effect's Config (environment by default). */
export const apiKey = (
  ref: { readonly env: string } | undefined
): Effect.Effect<Redacted.Redacted<string> | undefined, Config.ConfigError> =>
  ref === undefined
    ? Effect.succeed(undefined)
    : Effect.map(Config.option(Config.Redacted(ref.env)), (v) => (Option.isSome(v) ? v.value : undefined))
