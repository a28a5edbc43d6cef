/**
 * The engine requests a completions or chat request becomes (serve/Completions.ts, serve/ChatCompletions.ts): its
 * prompts, its sampling fields, one request per (prompt, sample) within the context, its structured-output
 * constraint; and the engine run over them.
 *
 * Sampling defaults follow vLLM: `max_tokens` 16, `temperature` 1, `top_p` 1, `top_k` off (0 or -1), the tokenizer's
 * end-of-turn ids stop unless `ignore_eos`; `seed` is per request (choice j of prompt i uses `seed + i·n + j`).
 *
 * Limits, answered as vLLM answers them (400 with its error body, serve/Refusal.ts):
 * - context: each prompt's tokens + `max_tokens` ≤ `maxModelLen`, with vLLM's message (chat prompts as rendered).
 *   Without `max_tokens` the default 16 is cut to the room left (vLLM fills the room), and a prompt of `maxModelLen`
 *   tokens or more is refused.
 * - `n`: an integer in 1..`maxN`; `max_tokens` / `max_completion_tokens`: an integer ≥ 1.
 *
 * Structured outputs on both (serve/StructuredOutput.ts has the fields and serve/JsonGrammar.ts what is generated):
 * OpenAI's `response_format` (`json_schema`, `json_object`, `text`) and vLLM's `structured_outputs` (`json`,
 * `json_object`, `choice`; v0.12+) and `guided_json` / `guided_choice` (before v0.12) constrain decoding: before each
 * token a mask leaves only the tokens whose bytes keep the schema's automaton live, so the output always parses and
 * validates. It ends (`finish_reason: "stop"`, no end-of-turn token) as soon as the value is complete and nothing can
 * follow; a value that could go on (a bare number) also ends at an end-of-turn token, which the mask allows only
 * there; `max_tokens` running out first is `"length"`, as OpenAI answers. The sampled tokens' `logprobs` are those of
 * the masked distribution (softmax over the allowed tokens, renormalised); `top_logprobs` alternatives are recomputed
 * unmasked. A schema keyword the automaton cannot enforce is a 400 naming the keyword and where it is (`param` the
 * field).
 */
import { Effect, Random } from "effect"
import type { GenerateRequest, InferenceEngine } from "../inference/InferenceEngine.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import * as Refusal from "./Refusal.ts"
import * as RequestBody from "./RequestBody.ts"
import * as StructuredOutput from "./StructuredOutput.ts"

const isTokenIds = (value: unknown): value is ReadonlyArray<number> =>
  Array.isArray(value) && value.length > 0 && value.every((v) => Number.isInteger(v) && v >= 0)

/** `prompt` as token-id rows. Text is encoded with the tokenizer's own decoration (vLLM's `add_special_tokens`). */
export const promptRows = (body: RequestBody.Json, tokenizer: TokenizerImpl) => {
  const prompt = body["prompt"]
  const encode = (text: string) => tokenizer.encode(text, { addSpecialTokens: true })
  if (typeof prompt === "string") return Effect.succeed([encode(prompt)])
  if (isTokenIds(prompt)) return Effect.succeed([prompt])
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === "string")) return Effect.succeed(prompt.map(encode))
    if (prompt.every(isTokenIds)) return Effect.succeed(prompt as ReadonlyArray<ReadonlyArray<number>>)
  }
  return Refusal.fail(
    `"prompt" must be a string, strings, token ids or lists of token ids, all non-empty`,
    400,
    "prompt"
  )
}

const stopStrings = (body: RequestBody.Json) => {
  const stop = body["stop"]
  if (stop === undefined || stop === null) return Effect.succeed([] as ReadonlyArray<string>)
  if (typeof stop === "string") return Effect.succeed([stop])
  if (Array.isArray(stop) && stop.every((s) => typeof s === "string")) return Effect.succeed(stop as Array<string>)
  return Refusal.fail(`"stop" must be a string or a list of strings`, 400, "stop")
}

export interface Sampling {
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

export const samplingOf = (
  body: RequestBody.Json,
  tokenizer: TokenizerImpl,
  maxTokensKeys: ReadonlyArray<string>,
  maxN: number
) =>
  Effect.gen(function* () {
    const n = (yield* RequestBody.optionalInt(body, "n", 1, maxN)) ?? 1
    let maxTokens: number | undefined
    for (const key of maxTokensKeys) maxTokens = (yield* RequestBody.optionalInt(body, key, 1)) ?? maxTokens
    const temperature = (yield* RequestBody.optionalNumber(body, "temperature", (v) => v >= 0, "≥ 0")) ?? 1
    const topP = (yield* RequestBody.optionalNumber(body, "top_p", (v) => v > 0 && v <= 1, "in (0, 1]")) ?? 1
    const topK =
      (yield* RequestBody.optionalNumber(body, "top_k", (v) => Number.isInteger(v) && v >= -1, "an integer ≥ -1")) ?? 0
    const seed = yield* RequestBody.optionalNumber(body, "seed", Number.isInteger, "an integer")
    const extraStopIds = body["stop_token_ids"]
    if (
      extraStopIds !== undefined &&
      extraStopIds !== null &&
      !isTokenIds(extraStopIds) &&
      !Array.isArray(extraStopIds)
    ) {
      return yield* Refusal.fail(`"stop_token_ids" must be a list of token ids`, 400, "stop_token_ids")
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
      : Refusal.fail(
          `This model's maximum context length is ${maxModelLen} tokens. However, you requested ` +
            `${promptTokens + s.maxTokens} tokens (${promptTokens} in the messages, ${s.maxTokens} in the completion). ` +
            `Please reduce the length of the messages or completion.`,
          400,
          "max_tokens"
        )
  }
  return promptTokens < maxModelLen
    ? Effect.succeed(Math.min(defaultMaxTokens, maxModelLen - promptTokens))
    : Refusal.fail(
        `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${promptTokens} ` +
          `tokens in the messages, Please reduce the length of the messages.`,
        400,
        "input_tokens"
      )
}

/** One engine request per (prompt, sample): choice index `i·n + j`, as vLLM numbers them. */
export const requestsOf = (prompts: ReadonlyArray<ReadonlyArray<number>>, s: Sampling, maxModelLen: number) =>
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

/**
 * The requests with the body's structured-output constraint (StructuredOutput.ts: one automaton per choice, masks
 * memoised across them); a format that cannot be served is a 400 naming the field and the schema keyword.
 */
export const constrained = (
  body: RequestBody.Json,
  tokenizer: TokenizerImpl,
  requests: ReadonlyArray<GenerateRequest>
) =>
  Effect.gen(function* () {
    const grammar = yield* Effect.try({
      try: () => StructuredOutput.grammarOf(body),
      catch: (e) =>
        e instanceof StructuredOutput.FormatError
          ? new Refusal.BadRequest(e.message, 400, e.param)
          : new Refusal.BadRequest(String(e))
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

export const generateAll = (engine: InferenceEngine["Service"], requests: ReadonlyArray<GenerateRequest>) =>
  engine.generate(requests).pipe(Effect.mapError(Refusal.fromInferenceError))

/** An answer's `usage`: the prompt tokens and the sampled ones. */
export const usage = (prompts: number, completions: number) => ({
  prompt_tokens: prompts,
  completion_tokens: completions,
  total_tokens: prompts + completions
})
