/**
 * `POST /v1/completions` of the OpenAI-compatible server (OpenAiServer.ts composes the routes), in vLLM's wire
 * conventions: token ids in, token ids + behaviour log-probs out.
 *
 * - `prompt` is a string, strings, token ids (`number[]`) or batches of them (`number[][]`). Each choice carries
 *   `text`, `finish_reason`, `token_ids` (vLLM's `return_token_ids`), `logprobs` in the legacy completions shape
 *   (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`; with `return_tokens_as_token_ids` the tokens read
 *   `token_id:<id>`, as vLLM writes them) and, our extension, `policy_version_first/last`. `logprobs: k` (0..20) puts
 *   the k most likely tokens and the sampled one in each `top_logprobs` entry (serve/LogprobShapes.ts).
 *   `prompt_logprobs: k` adds vLLM's per-prompt-token entries (the prompt token only, `rank` null).
 * - `stream: true` (serve/Streaming.ts): one chunk per token (`text`, `logprobs` of that token, vLLM's `token_ids:
 *   [id]`, on a choice's first chunk `prompt_token_ids`, on its last `finish_reason`). With alternatives (`logprobs`
 *   k > 0, computed after sampling) the chunks are sent once the generation ended. Chunk fields pinned from vLLM's
 *   `CompletionResponseStreamChoice` (vllm/entrypoints/openai/completion/protocol.py).
 */
import { Effect, Random } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import type { GenerateRequest, GenerateResult } from "../inference/InferenceEngine.ts"
import * as EngineRequests from "./EngineRequests.ts"
import * as LogprobShapes from "./LogprobShapes.ts"
import * as Refusal from "./Refusal.ts"
import * as RequestBody from "./RequestBody.ts"
import * as Served from "./Served.ts"
import * as Streaming from "./Streaming.ts"

/** One completions request, read and checked: what its answer, streamed or whole, is built from. */
interface Completion {
  /** The model that answers (`model`). */
  readonly name: string
  readonly id: string
  readonly created: number
  readonly stream: boolean
  readonly includeUsage: boolean
  readonly requests: ReadonlyArray<GenerateRequest>
  /** Legacy `logprobs: k`; undefined: no `logprobs` in the answer. */
  readonly topK: number | undefined
  readonly tokensAsIds: boolean
  /** Choice `index`'s `prompt_token_ids` and `prompt_logprobs`, where asked for. */
  readonly extras: (index: number) => RequestBody.Json
  readonly usageOf: (results: ReadonlyArray<GenerateResult>) => ReturnType<typeof EngineRequests.usage>
  /** The generation, with the alternatives (`alternatives()` once it ended). */
  readonly generate: Streaming.StreamPlan["generate"]
  readonly alternatives: () => LogprobShapes.Alternatives | undefined
}

/** The route's handler. */
export const handler = (server: Served.Served) => (request: HttpServerRequest.HttpServerRequest) =>
  Refusal.handle(
    Streaming.requestScoped((keep) =>
      Effect.gen(function* () {
        const completion = yield* completionOf(request, server)
        if (!completion.stream) return yield* answer(completion, server)
        const plan = streamPlan(completion, server)
        // alternatives are computed after sampling: with them the answer is sent once the generation ended
        return completion.topK !== undefined && completion.topK > 0
          ? yield* Streaming.bufferedStream(plan)
          : Streaming.liveStream(plan, keep())
      })
    )
  )

/** The request's body read and checked, in the order its refusals are given. */
const completionOf = (request: HttpServerRequest.HttpServerRequest, server: Served.Served) =>
  Effect.gen(function* () {
    const { tokenizer, maxModelLen } = server
    const body = yield* RequestBody.readJsonBody(request, server.maxRequestBytes)
    const { name, served } = yield* Served.servedFor(body, server)
    const { stream, includeUsage } = yield* Streaming.streamingOf(body)
    const prompts = yield* EngineRequests.promptRows(body, tokenizer)
    const sampling = yield* EngineRequests.samplingOf(body, tokenizer, ["max_tokens"], server.maxN)
    // legacy `logprobs: k`: the sampled token's log-prob and the k most likely tokens
    const topK = yield* RequestBody.optionalInt(body, "logprobs", 0, LogprobShapes.maxTopLogprobs)
    const requests = yield* EngineRequests.constrained(
      body,
      tokenizer,
      yield* EngineRequests.requestsOf(prompts, sampling, maxModelLen)
    )
    const tokensAsIds = body["return_tokens_as_token_ids"] === true
    const returnTokenIds = body["return_token_ids"] === true
    const promptLogprobs = yield* LogprobShapes.promptLogprobsOf(body, served.promptLogprobs, tokenizer, prompts)
    const created = yield* Served.secondsNow
    const id = `cmpl-${created}-${(yield* Random.nextInt).toString(16)}`
    const usageOf = (results: ReadonlyArray<GenerateResult>) =>
      EngineRequests.usage(
        requests.reduce((n, r) => n + r.promptIds.length, 0),
        results.reduce((n, r) => n + r.tokens.length, 0)
      )
    const extras = (index: number) => ({
      ...(returnTokenIds ? { prompt_token_ids: [...requests[index]!.promptIds] } : {}),
      ...(promptLogprobs === undefined ? {} : { prompt_logprobs: promptLogprobs[Math.floor(index / sampling.n)] })
    })
    let alternatives: LogprobShapes.Alternatives | undefined
    const generate = (rs: ReadonlyArray<GenerateRequest>) =>
      Effect.gen(function* () {
        const results = yield* EngineRequests.generateAll(served.engine, rs)
        alternatives = yield* LogprobShapes.alternativesOf(served, rs, results, topK ?? 0)
        return results
      })
    return {
      name,
      id,
      created,
      stream,
      includeUsage,
      requests,
      topK,
      tokensAsIds,
      extras,
      usageOf,
      generate,
      alternatives: () => alternatives
    } satisfies Completion
  })

/** The whole answer (`stream` off). */
const answer = (completion: Completion, { tokenizer }: Served.Served) =>
  Effect.gen(function* () {
    const { topK, tokensAsIds, extras } = completion
    const results = yield* completion.generate(completion.requests)
    const alternatives = completion.alternatives()
    const choices = results.map((r, index) => ({
      index,
      text: tokenizer.decode(r.tokens),
      logprobs:
        topK === undefined ? null : LogprobShapes.completionLogprobs(tokenizer, r, tokensAsIds, alternatives?.[index]),
      finish_reason: r.finishReason,
      stop_reason: null,
      token_ids: [...r.tokens],
      ...extras(index),
      policy_version_first: r.policyVersionFirst,
      policy_version_last: r.policyVersionLast
    }))
    return HttpServerResponse.jsonUnsafe({
      id: completion.id,
      object: "text_completion",
      created: completion.created,
      model: completion.name,
      choices,
      usage: completion.usageOf(results)
    })
  })

/**
 * vLLM's CompletionStreamResponse: one chunk per token, `token_ids` of that token, the prompt's ids on a choice's
 * first chunk, the finish reason on its last (vllm/entrypoints/openai/completion/protocol.py,
 * `CompletionResponseStreamChoice`).
 */
const streamPlan = (completion: Completion, { tokenizer }: Served.Served): Streaming.StreamPlan => {
  const { requests, topK, tokensAsIds, extras, includeUsage } = completion
  const chunk = Streaming.chunkOf(
    { id: completion.id, object: "text_completion", created: completion.created, model: completion.name },
    includeUsage
  )
  const texts = requests.map(() => Streaming.textDeltas(tokenizer))
  const offsets = requests.map(() => 0)
  const firstVersion = requests.map(() => 0)
  const finished = requests.map(() => false)
  return {
    requests,
    generate: completion.generate,
    start: [],
    token: (index, t, event) => {
      const last = event.finishReason !== undefined
      if (t === 0) firstVersion[index] = event.version
      finished[index] = last
      const alternatives = completion.alternatives()
      const logprobs =
        topK === undefined
          ? null
          : LogprobShapes.completionLogprobs(
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
            ...(last ? { policy_version_first: firstVersion[index], policy_version_last: event.version } : {})
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
      ...(includeUsage ? [chunk([], { usage: completion.usageOf(results) })] : [])
    ]
  }
}
