/**
 * Streamed answers of the completions, chat, responses and messages routes (each route's module has its events), and
 * the request scope a streamed answer outlives its handler in:
 *
 * - `stream: true`: Server-Sent Events (`data: <chunk>` … `data: [DONE]`), chunks as OpenAI's and vLLM's, sent as the
 *   tokens are sampled (LocalEngine's `onToken`; an engine that returns whole completions has its tokens sent when it
 *   returns). An answer that may still be refused, or that needs the whole generation, is sent only once the
 *   generation ended, replayed in the same chunks. A failure after the first chunk is a last event in the error body
 *   (serve/Refusal.ts), then `[DONE]`. `stream_options: {include_usage: true}` adds `usage: null` to each chunk and a
 *   last chunk with `choices: []` and the usage (`stream_options` without `stream` is vLLM's 400).
 * - The Responses API and Anthropic's Messages API name each event (`event: <type>` before its `data:`) and send no
 *   `[DONE]` (`namedEvents`).
 */
import { Effect, Exit, Queue, Scope, Stream } from "effect"
import { HttpServerResponse } from "effect/http"
import type { GenerateRequest, GenerateResult, TokenEvent } from "../inference/InferenceEngine.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import * as Refusal from "./Refusal.ts"
import type * as RequestBody from "./RequestBody.ts"

/** `stream` and `stream_options.include_usage`. */
export const streamingOf = (body: RequestBody.Json) => {
  const stream = body["stream"] === true
  const options = body["stream_options"]
  const includeUsage =
    typeof options === "object" && options !== null && (options as RequestBody.Json)["include_usage"] === true
  if (!stream && options !== undefined && options !== null) {
    return Refusal.fail("Stream options can only be defined when `stream=True`.", 400, "stream_options")
  }
  return Effect.succeed({ stream, includeUsage })
}

/**
 * A streamed choice's text, token by token: each call adds a token and returns its share of the text (the text
 * decoded so far minus what earlier deltas gave); a piece that ends inside a UTF-8 character (U+FFFD at the end)
 * waits for the tokens that complete it, unless it is the last. `upTo` may hold back the text's tail (chat replies
 * that may turn into tool calls).
 */
export const textDeltas = (tokenizer: TokenizerImpl, upTo: (text: string) => string = (text) => text) => {
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

/** The common fields of every chunk of one streamed answer (OpenAI's and vLLM's `*.chunk` objects). */
export const chunkOf =
  (
    head: { readonly id: string; readonly object: string; readonly created: number; readonly model: string },
    includeUsage: boolean
  ) =>
  (choices: ReadonlyArray<unknown>, extra: RequestBody.Json = {}) => ({
    ...head,
    choices,
    ...(includeUsage ? { usage: null } : {}),
    ...extra
  })

/** How a streamed answer is built: its first events, each token's events, and the events once all choices ended. */
export interface StreamPlan {
  readonly requests: ReadonlyArray<GenerateRequest>
  /** The generation (and whatever is computed from its results, e.g. alternatives). */
  readonly generate: (
    requests: ReadonlyArray<GenerateRequest>
  ) => Effect.Effect<ReadonlyArray<GenerateResult>, Refusal.BadRequest>
  readonly start: ReadonlyArray<unknown>
  /** Choice `index`'s token `t`, in order; `finishReason` is set on its last token. */
  readonly token: (index: number, t: number, event: TokenEvent) => ReadonlyArray<unknown>
  readonly end: (results: ReadonlyArray<GenerateResult>) => ReadonlyArray<unknown>
  /** How events are written; default `dataLines` (chat and completions). */
  readonly framing?: Framing
}

/** How a stream's events are written as Server-Sent Events. */
export interface Framing {
  readonly line: (event: unknown) => Uint8Array
  /** The event a failure after the first event is sent as. */
  readonly error: (e: Refusal.BadRequest) => unknown
  /** Whether `data: [DONE]` ends the stream. */
  readonly done: boolean
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

/** OpenAI's chat and completions streams: `data: <json>` per event, the error body on failure, `data: [DONE]` last. */
export const dataLines: Framing = {
  line: (event) => encoder.encode(`data: ${event === "[DONE]" ? event : JSON.stringify(event)}\n\n`),
  error: Refusal.errorBody,
  done: true
}

/**
 * The Responses API's and Anthropic's streams: `event: <type>` and `data: <json>` per event (each event's `type`
 * names it), `error` its failure event, no `[DONE]`.
 */
export const namedEvents = (error: (e: Refusal.BadRequest) => unknown): Framing => ({
  line: (event) => encoder.encode(`event: ${(event as { type: string }).type}\ndata: ${JSON.stringify(event)}\n\n`),
  error,
  done: false
})

const sseResponse = (body: Stream.Stream<Uint8Array>) =>
  HttpServerResponse.stream(body, { contentType: "text/event-stream", headers: { "cache-control": "no-cache" } })

/**
 * A Server-Sent Events answer (`data: <json>` per event, then `data: [DONE]`, as OpenAI and vLLM stream), generated
 * as it is sent: each token's events leave as the engine samples it (`GenerateRequest.onToken`; tokens of an engine
 * that returns whole completions are sent when it returns). The request's scope (an adapter held) closes when the
 * stream ends. A failure after the first event is sent as a last event in the error body, before `[DONE]`.
 */
export const liveStream = (plan: StreamPlan, scope: Scope.Closeable) =>
  sseResponse(
    Stream.callback<Uint8Array>((queue) =>
      Effect.gen(function* () {
        const framing = plan.framing ?? dataLines
        const emit = (event: unknown) => {
          Queue.offerUnsafe(queue, framing.line(event))
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
            Effect.fail(new Refusal.BadRequest(defect instanceof Error ? defect.message : String(defect), 500))
          ),
          Effect.result
        )
        if (result._tag === "Failure") emit(framing.error(result.failure))
        else {
          result.success.forEach((r, i) => {
            for (const event of tokenEvents(r, sent[i]!)) plan.token(i, sent[i]!++, event).forEach(emit)
          })
          plan.end(result.success).forEach(emit)
        }
        if (framing.done) emit("[DONE]")
        yield* Queue.end(queue)
      })
    ).pipe(Stream.ensuring(Scope.close(scope, Exit.void)))
  )

/** The same answer with the generation run first (so it can still be refused with a status): replayed from results. */
export const bufferedStream = (plan: StreamPlan) =>
  Effect.map(plan.generate(plan.requests), (results) => {
    const framing = plan.framing ?? dataLines
    const events = [
      ...plan.start,
      ...results.flatMap((r, i) => tokenEvents(r, 0).flatMap((event, t) => plan.token(i, t, event))),
      ...plan.end(results),
      ...(framing.done ? ["[DONE]"] : [])
    ]
    return sseResponse(Stream.fromIterable(events.map(framing.line)))
  })

/**
 * Run a handler in a scope of its own: closed when the handler returns, unless the handler takes it (`keep`) for a
 * streamed answer that outlives it.
 */
export const requestScoped = <R>(
  handler: (keep: () => Scope.Closeable) => Effect.Effect<HttpServerResponse.HttpServerResponse, Refusal.BadRequest, R>
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
