/**
 * The log-probs that completions and chat answers carry (serve/Completions.ts, serve/ChatCompletions.ts), in their
 * wire shapes: the legacy completions `logprobs` object, chat's `logprobs.content` entries, vLLM's `prompt_logprobs`,
 * and the alternatives both list:
 *
 * - Alternatives (`top_logprobs`, legacy `logprobs: k`): the k most likely tokens at each sampled position under
 *   `softmax(z / τ)` (τ = 1 for greedy), most likely first (model/LogProbs.ts `topK`), recomputed after sampling by
 *   one teacher-forced pass on the weights then served. With top-k/top-p the sampler renormalises over the tokens it
 *   keeps, so the sampled token's `logprob` can then exceed its value among the alternatives.
 */
import { Effect } from "effect"
import type { GenerateRequest, GenerateResult } from "../inference/InferenceEngine.ts"
import type * as LogProbs from "../model/LogProbs.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import type { ServedModel } from "./AdapterRegistry.ts"
import * as Refusal from "./Refusal.ts"
import * as RequestBody from "./RequestBody.ts"

/** Per choice, per sampled token, the most likely tokens there (`alternativesOf`). */
export type Alternatives = ReadonlyArray<ReadonlyArray<ReadonlyArray<LogProbs.Alternative>>>

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
export const chatLogprobs = (
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
export const alternativesOf = (
  served: ServedModel,
  requests: ReadonlyArray<GenerateRequest>,
  results: ReadonlyArray<GenerateResult>,
  k: number
) => {
  if (k === 0) return Effect.succeed(undefined)
  const score = served.topLogprobs
  if (score === undefined) return Refusal.fail(`"top_logprobs" is not supported by this server`, 400, "top_logprobs")
  return Effect.forEach(results, (r, i) => {
    const request = requests[i]!
    return Effect.promise(() =>
      score([...request.promptIds, ...r.tokens], request.promptIds.length, k, request.sampling.temperature)
    )
  })
}

/** vLLM's default `--max-logprobs`: the most alternatives a request may ask for. */
export const maxTopLogprobs = 20

/**
 * vLLM's `prompt_logprobs`: per prompt, `null` for the first token, then `{ "<id>": { logprob, rank, decoded_token } }`
 * for each later one (the prompt token only: alternatives are not computed, and `rank` is null).
 */
export const promptLogprobsOf = (
  body: RequestBody.Json,
  score: ServedModel["promptLogprobs"],
  tokenizer: TokenizerImpl,
  prompts: ReadonlyArray<ReadonlyArray<number>>
) =>
  Effect.gen(function* () {
    const wanted = yield* RequestBody.optionalNumber(
      body,
      "prompt_logprobs",
      (v) => Number.isInteger(v) && v >= 0,
      "an integer ≥ 0"
    )
    if (wanted === undefined) return undefined
    if (score === undefined) {
      return yield* Refusal.fail(`"prompt_logprobs" is not supported by this server`, 400, "prompt_logprobs")
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
