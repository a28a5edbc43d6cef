/**
 * Batched generation over ragged prompts: a KV-cache path (prefill once, then one token per row per step) and a
 * no-cache reference path (recompute the whole sequence every step) that tests hold the cache path to.
 *
 * Per row and step: logits z → temperature τ → top-k → top-p (nucleus) → renormalise → draw with the request's own
 * PRNG (`Prng.make(seed)`, one uniform per step), so the same seed and weights give the same tokens whatever else is
 * in the batch. τ = 0 is greedy (argmax, no draw).
 *
 * Log-probs (`logprobsMode`):
 * - `"processed"` (default): log of the probability the token was actually drawn with, i.e. of softmax(z/τ) restricted
 *   to the top-k ∩ top-p set and renormalised (vLLM's `logprobs_mode="processed_logprobs"`). With top-k/top-p off this
 *   equals `LogProbs.ofSequences(..., { temperature: τ })`, which is what the trainer recomputes. vLLM's default is
 *   `raw_logprobs` (log softmax(z), before temperature), so behaviour log-probs from a remote vLLM must be asked for
 *   `processed_logprobs` to be comparable.
 * - `"raw"`: log softmax(z), before temperature and truncation.
 * Greedy (τ = 0) has a degenerate processed distribution (log 1 = 0), so greedy tokens report the raw log-prob in both
 * modes.
 *
 * Stops: a token in `stopTokenIds` (kept in the output), a stop string appearing in `decode(generated)` (the token
 * that completed it is kept), the request's `constraint` saying its output is complete (finish reason `stop`),
 * `maxNewTokens`, or the context limit (`max_position_embeddings`), the last two giving finish reason `length`.
 *
 * In-flight weight updates: `beforeStep` runs before the prefill and before every decode step; it may change the
 * model's variables (e.g. `Snapshot.load`) and returns the weights' version. When the version changes, the fused
 * inference view is rebuilt; cached keys/values of earlier tokens are kept. Each token records the version that
 * produced its logits.
 */

import * as tf from "../tensor/Tf.ts"
import * as Decoder from "./Decoder.ts"
import * as KvCache from "./KvCache.ts"
import * as Prng from "./Prng.ts"
import type * as Transformer from "./Transformer.ts"
import * as WeightView from "./WeightView.ts"

export interface SamplingParams {
  readonly maxNewTokens: number
  readonly temperature: number // 0 = greedy
  readonly topK: number // 0 = off
  readonly topP: number // 1 = off
  readonly stopTokenIds: ReadonlyArray<number>
  readonly stopStrings: ReadonlyArray<string>
  readonly seed: number
}

export const defaultParams: SamplingParams = {
  maxNewTokens: 64,
  temperature: 1,
  topK: 0,
  topP: 1,
  stopTokenIds: [],
  stopStrings: [],
  seed: 0
}

export interface Request {
  readonly promptIds: ReadonlyArray<number>
  readonly sampling: SamplingParams
  /** Constrained decoding (structured outputs): which tokens may come next; absent: any. One per request (stateful). */
  readonly constraint?: Constraint
}

/**
 * A per-request token mask (e.g. a JSON-schema automaton, serve/StructuredOutput.ts). Before each draw, `mask` sets
 * the logits of tokens that may not come next to -Infinity, so greedy and sampled tokens, and their log-probs (both
 * modes), are those of the masked distribution: softmax over the allowed tokens only. `accept` records the drawn token
 * and says whether the constrained output is complete: the row then stops with finish reason `stop` (a stop token the
 * mask allowed stops it as usual). When `mask` allows nothing the row stops with `length`.
 */
export interface Constraint {
  /** Mask the logits row in place; false when no token is allowed. */
  readonly mask: (logits: Float32Array) => boolean
  /** The drawn token; true when the output is complete. */
  readonly accept: (token: number) => boolean
}

export type FinishReason = "stop" | "length"

export interface Completion {
  readonly tokens: ReadonlyArray<number> // generated ids, including the stop token that ended the request
  readonly logprobs: ReadonlyArray<number> // one per token, see logprobsMode
  readonly versions: ReadonlyArray<number> // weights version that produced each token
  readonly finishReason: FinishReason
}

export interface Options {
  /** Needed for stop strings: token ids → text. */
  readonly decode?: (ids: ReadonlyArray<number>) => string
  /** Called before each forward; may update the weights in place; returns their version. */
  readonly beforeStep?: () => number | Promise<number>
  readonly logprobsMode?: "processed" | "raw"
  /** false = the no-cache reference path (slow; for tests). Default true. */
  readonly useCache?: boolean
}

/** Draw one token from a logits row. Exported for tests. */
export const pick = (
  z: Float32Array,
  params: Pick<SamplingParams, "temperature" | "topK" | "topP">,
  prng: Prng.Prng,
  mode: "processed" | "raw" = "processed"
): { readonly token: number; readonly logprob: number } => {
  const V = z.length
  let zMax = Number.NEGATIVE_INFINITY
  let argmax = 0
  for (let i = 0; i < V; i++) {
    if (z[i]! > zMax) {
      zMax = z[i]!
      argmax = i
    }
  }
  const rawLogprob = (token: number): number => {
    let rawSum = 0
    for (let i = 0; i < V; i++) rawSum += Math.exp(z[i]! - zMax)
    return z[token]! - zMax - Math.log(rawSum)
  }
  if (params.temperature <= 0) return { token: argmax, logprob: rawLogprob(argmax) }

  const tau = params.temperature
  const w = new Float64Array(V) // unnormalised softmax(z / τ)
  let totalAll = 0
  for (let i = 0; i < V; i++) {
    w[i] = Math.exp((z[i]! - zMax) / tau)
    totalAll += w[i]!
  }
  const useTopK = params.topK > 0 && params.topK < V
  const useTopP = params.topP < 1
  // candidates: every token, or (truncating) a prefix of the tokens sorted by logit that provably contains the top-k
  // and nucleus sets; `setTotal` is the mass of the whole top-k set (or of all tokens) that top-p fractions refer to.
  let candidates: ArrayLike<number>
  let setTotal = totalAll
  if (!useTopK && !useTopP) {
    candidates = { length: V } as ArrayLike<number>
  } else {
    candidates = sortedPrefix(z, w, totalAll, useTopK ? params.topK : 0, params.topP)
    if (useTopK) {
      candidates = Array.prototype.slice.call(candidates, 0, params.topK) as Array<number>
      setTotal = 0
      for (let i = 0; i < candidates.length; i++) setTotal += w[candidates[i]!]!
    }
  }
  const idx = (i: number): number => (useTopK || useTopP ? candidates[i]! : i)
  let kept = candidates.length
  let total = setTotal
  if (useTopP) {
    // keep the smallest prefix whose mass reaches topP (at least one token)
    let mass = 0
    for (let i = 0; i < candidates.length; i++) {
      mass += w[idx(i)]!
      if (mass >= params.topP * setTotal) {
        kept = i + 1
        break
      }
    }
    total = 0
    for (let i = 0; i < kept; i++) total += w[idx(i)]!
  }
  const u = prng.next() * total
  let acc = 0
  let token = idx(kept - 1)
  for (let i = 0; i < kept; i++) {
    acc += w[idx(i)]!
    if (u < acc) {
      token = idx(i)
      break
    }
  }
  return { token, logprob: mode === "raw" ? rawLogprob(token) : Math.log(w[token]! / total) }
}

/**
 * The tokens above a logit threshold, sorted by logit (descending, ties by id): a prefix of the full sorted order.
 * Tries thresholds w ≥ 1e-4 and w ≥ 1e-12 (relative to the top token) before sorting everything, and accepts a prefix
 * only when it provably holds the top-k set (≥ k tokens) or, without top-k, the nucleus (mass ≥ topP). Exact, and
 * avoids sorting a 150k vocabulary every step.
 */
const sortedPrefix = (
  z: Float32Array,
  w: Float64Array,
  totalAll: number,
  topK: number,
  topP: number
): Array<number> => {
  const byLogit = (a: number, b: number) => z[b]! - z[a]! || a - b
  for (const eps of [1e-4, 1e-12]) {
    const prefix: Array<number> = []
    let mass = 0
    for (let i = 0; i < w.length; i++) {
      if (w[i]! >= eps) {
        prefix.push(i)
        mass += w[i]!
      }
    }
    if (topK > 0 ? prefix.length >= topK : mass >= topP * totalAll) return prefix.sort(byLogit)
  }
  return Array.from({ length: w.length }, (_, i) => i).sort(byLogit)
}

/** What produces next-token logits for the active rows: the KV cache or the recompute-everything reference. */
interface Stepper {
  /** Logits [B_active, V] for the rows' next tokens. `appended` = the token each active row just got (absent first). */
  readonly next: (view: WeightView.WeightView, appended?: ReadonlyArray<number>) => Promise<Float32Array>
  /** Keep these active-row indices (in order). */
  readonly keep: (rows: ReadonlyArray<number>) => void
  readonly dispose: () => void
}

const cacheStepper = (model: Transformer.Transformer, prompts: ReadonlyArray<ReadonlyArray<number>>): Stepper => {
  let cache: KvCache.KvCache | undefined
  return {
    next: async (view, appended) => {
      const stepped =
        cache === undefined || appended === undefined
          ? await KvCache.prefill(model, view, prompts)
          : await KvCache.extend(model, view, cache, appended)
      cache = stepped.cache
      return stepped.logits
    },
    keep: (rows) => {
      if (cache !== undefined) cache = KvCache.select(cache, rows)
    },
    dispose: () => {
      if (cache !== undefined) KvCache.dispose(cache)
    }
  }
}

const referenceStepper = (model: Transformer.Transformer, prompts: ReadonlyArray<ReadonlyArray<number>>): Stepper => {
  let sequences = prompts.map((p) => [...p])
  return {
    next: async (view, appended) => {
      if (appended !== undefined) sequences.forEach((s, i) => s.push(appended[i]!))
      const B = sequences.length
      const T = Math.max(...sequences.map((s) => s.length))
      const ids = sequences.map((s) => [...new Array<number>(T - s.length).fill(0), ...s])
      const attentionMask = sequences.map((s) => [...new Array<number>(T - s.length).fill(0), ...s.map(() => 1)])
      const logits = tf.tidy(() => {
        const hidden = Decoder.hiddenStates(model, { ids, attentionMask }, view) // [B·T, D]
        const D = hidden.shape[1]
        const last = tf.reshape(tf.slice(tf.reshape(hidden, [B, T, D]), [0, T - 1, 0], [B, 1, D]), [
          B,
          D
        ]) as tf.Tensor2D
        return Decoder.logitsOf(view, last) // [B, V]
      })
      // read outside the tidy (it would walk every index)
      return (await logits.data().finally(() => logits.dispose())) as Float32Array
    },
    keep: (rows) => {
      sequences = rows.map((r) => sequences[r]!)
    },
    dispose: () => {}
  }
}

/** One request's generation state (exported for engines that schedule rows themselves, e.g. LocalEngine). */
export interface Row {
  readonly request: Request
  readonly prng: Prng.Prng
  readonly tokens: Array<number>
  readonly logprobs: Array<number>
  readonly versions: Array<number>
  finishReason?: FinishReason
}

/** A fresh row; already finished (`length`) when it may not generate at all (maxNewTokens 0, prompt fills context). */
export const startRow = (request: Request, maxContext: number): Row => {
  if (request.promptIds.length === 0) throw new Error("Sampling: empty prompt")
  const row: Row = { request, prng: Prng.make(request.sampling.seed), tokens: [], logprobs: [], versions: [] }
  if (request.sampling.maxNewTokens <= 0 || request.promptIds.length >= maxContext) row.finishReason = "length"
  return row
}

/**
 * Draw the row's next token from its logits and apply the stop rules. Returns the token, or undefined when the row
 * has finished (the token that finished it is recorded).
 */
export const advance = (
  row: Row,
  logits: Float32Array,
  version: number,
  maxContext: number,
  options: Pick<Options, "decode" | "logprobsMode"> = {}
): number | undefined => {
  const s = row.request.sampling
  const constraint = row.request.constraint
  if (constraint !== undefined && !constraint.mask(logits)) {
    row.finishReason = "length"
    return undefined
  }
  const { token, logprob } = pick(logits, s, row.prng, options.logprobsMode ?? "processed")
  row.tokens.push(token)
  row.logprobs.push(logprob)
  row.versions.push(version)
  if (s.stopTokenIds.includes(token)) row.finishReason = "stop"
  else if (constraint?.accept(token) === true) row.finishReason = "stop"
  else if (s.stopStrings.length > 0 && options.decode !== undefined) {
    const text = options.decode(row.tokens)
    if (s.stopStrings.some((stop) => stop.length > 0 && text.includes(stop))) row.finishReason = "stop"
  }
  if (row.finishReason === undefined) {
    if (row.tokens.length >= s.maxNewTokens || row.request.promptIds.length + row.tokens.length >= maxContext) {
      row.finishReason = "length"
    }
  }
  return row.finishReason === undefined ? token : undefined
}

export const toCompletion = (row: Row): Completion => ({
  tokens: row.tokens,
  logprobs: row.logprobs,
  versions: row.versions,
  finishReason: row.finishReason ?? "length"
})

/** Generate for a batch of requests; results in request order. Rejects on an empty prompt. */
export const generate = async (
  model: Transformer.Transformer,
  requests: ReadonlyArray<Request>,
  options: Options = {}
): Promise<Array<Completion>> => {
  const maxContext = model.config.maxPositionEmbeddings
  const rows = requests.map((request) => startRow(request, maxContext))
  let active = rows.map((_, i) => i).filter((i) => rows[i]!.finishReason === undefined)
  if (active.length === 0) return rows.map(toCompletion)

  const prompts = active.map((i) => rows[i]!.request.promptIds)
  const stepper = options.useCache === false ? referenceStepper(model, prompts) : cacheStepper(model, prompts)
  let version: number | undefined
  let view: WeightView.WeightView | undefined
  try {
    let appended: Array<number> | undefined
    while (active.length > 0) {
      const v = options.beforeStep === undefined ? 0 : await options.beforeStep()
      if (view === undefined || v !== version) {
        if (view !== undefined) WeightView.dispose(view)
        view = WeightView.inference(model)
        version = v
      }
      const logits = await stepper.next(view, appended)
      const V = logits.length / active.length
      const still: Array<number> = []
      appended = []
      active.forEach((r, i) => {
        const token = advance(rows[r]!, logits.subarray(i * V, (i + 1) * V), v, maxContext, options)
        if (token !== undefined) {
          still.push(i)
          appended!.push(token)
        }
      })
      if (still.length === 0) break
      if (still.length < active.length) stepper.keep(still)
      active = still.map((i) => active[i]!)
    }
  } finally {
    stepper.dispose()
    if (view !== undefined) WeightView.dispose(view)
  }
  return rows.map(toCompletion)
}
