/**
 * The training path: per-token log-probs of given token ids, and per-token entropy, differentiable (use inside
 * `tf.variableGrads` or `optimizer.minimize`).
 *
 *   logp[b, t] = log softmax(z[b, t−1] / τ)[ids[b, t]]      for t ≥ 1,  logp[b, 0] = 0
 *   H[b, t]    = −Σ_v p_v log p_v  of that same distribution,  H[b, 0] = 0
 *
 * Outputs are aligned with `ids` (index t scores token t given its prefix), so a loss mask aligned with the ids
 * applies directly. The temperature τ divides the logits exactly as the sampler does, so these match the sampler's
 * behaviour log-probs when top-k/top-p are off.
 *
 * Memory: the head runs on T−1 positions (N = B·(T−1)) and the temperature scales the hidden states [N, D], not the
 * logits. Small problems (N·V ≤ `fusedAbove`, default 2²⁴ ≈ 64 MB of logits) take the plain path: one [N, V] logits
 * tensor plus the log-sum-exp's temporaries (and a softmax and a product for the entropy), all kept by the tape.
 * Larger ones (e.g. the 151k Qwen vocabulary) take the fused head (`fusedHead`): a custom gradient that computes
 * logits chunk by chunk of rows and recomputes them in the backward pass, so no [N, V] tensor is ever alive, at
 * the cost of one more head matmul. With the native kernels every size takes Fused.headLogProbs instead: the same
 * maths in one kernel over blocks of the vocabulary (native/head.cc), reading a tied embedding `[V, D]` as it is rather
 * than transposing it on every forward. The trunk's activations are the other large part: with `input.checkpoint` each
 * decoder layer keeps only its input and is recomputed in the backward pass (Recompute.ts).
 */
import * as tf from "../tensor/Tf.ts"
import * as Decoder from "./Decoder.ts"
import * as Fused from "./Fused.ts"
import type * as Transformer from "./Transformer.ts"
import * as WeightView from "./WeightView.ts"

export interface Options {
  readonly temperature?: number // τ, default 1
  readonly entropy?: boolean // also compute H (default false)
  /** Use the fused chunked head when N·V exceeds this (default 2²⁴; 0 when the native head kernel runs). */
  readonly fusedAbove?: number
  /** Rows per chunk in the fused head (default: as many as fit 2²⁴ logits). */
  readonly chunkRows?: number
  /**
   * [B, T] aligned with the ids (e.g. the loss mask): compute log-probs (and entropy) only where it is 1, 0 elsewhere.
   * The LM head then runs on those positions alone, which is most of the cost with a large vocabulary. Plain arrays,
   * not a tensor: the selection is read on the host inside a tidy, where no download can be awaited.
   */
  readonly only?: ReadonlyArray<ReadonlyArray<number>>
}

export interface TokenLogProbs {
  readonly logprobs: tf.Tensor2D // [B, T]
  readonly entropy?: tf.Tensor2D // [B, T], when asked
}

/**
 * From logits rows and their targets: `logp[n] = z[n, y_n] − logsumexp(z[n])`, optional entropy. Inside tidy.
 * logits [N, V], targets int32 [N].
 */
export const fromLogits = (
  logits: tf.Tensor2D,
  targets: tf.Tensor1D,
  withEntropy: boolean
): { readonly logprobs: tf.Tensor1D; readonly entropy?: tf.Tensor1D } =>
  tf.tidy(() => {
    const [N, V] = logits.shape
    const lse = tf.logSumExp(logits, 1) // [N]
    const flatIndex = tf.add(tf.mul(tf.range(0, N, 1, "int32"), tf.scalar(V, "int32")), tf.cast(targets, "int32")) // [N]
    const picked = tf.gather(tf.reshape(logits, [N * V]), flatIndex) // z[n, y_n]  [N]
    const logprobs = tf.sub(picked, lse) as tf.Tensor1D // [N]
    if (!withEntropy) return { logprobs }
    const p = tf.softmax(logits) // [N, V]
    const entropy = tf.sub(lse, tf.sum(tf.mul(p, logits), 1)) as tf.Tensor1D // H = lse − Σ p z  [N]
    return { logprobs, entropy }
  })

/**
 * Fused LM head + log-softmax + pick + entropy over row chunks, with a hand-written gradient that recomputes each
 * chunk's logits (never holding [N, V]). h [N, D], W [D, V], targets int32 [N] → logp [N], H [N].
 *
 *   ∂logp_n/∂z_n = onehot(y_n) − p_n          ∂H_n/∂z_n = −p_n ⊙ (log p_n + H_n)
 *   ∂/∂h = g_z Wᵀ,  ∂/∂W = hᵀ g_z   (explicit transposes: untransposed matmuls for XNNPACK)
 */
export const fusedHead = (
  h: tf.Tensor2D,
  w: tf.Tensor2D,
  targets: tf.Tensor1D,
  chunkRows?: number
): { readonly logprobs: tf.Tensor1D; readonly entropy: tf.Tensor1D } =>
  tf.tidy(() => {
    const [N] = h.shape
    const V = w.shape[1]
    const rows = Math.max(1, Math.min(N, chunkRows ?? Math.floor(2 ** 24 / V)))
    const chunks = Array.from(
      { length: Math.ceil(N / rows) },
      (_, i) => [i * rows, Math.min(rows, N - i * rows)] as const
    )
    const targetsF = tf.cast(targets, "float32") // saved for the backward pass (customGrad saves tensors, not ints)
    const op = tf.customGrad(((hIn: tf.Tensor2D, wIn: tf.Tensor2D, save: tf.GradSaveFunc) => {
      save([hIn, wIn, targetsF])
      const perChunk = chunks.map(([start, size]) =>
        tf.tidy(() => {
          const z = tf.matMul(tf.slice(hIn, [start, 0], [size, -1]), wIn) // [c, V]
          const y = tf.slice(targets, [start], [size]) // [c]
          const lse = tf.logSumExp(z, 1) // [c]
          const picked = tf.sum(tf.mul(z, tf.oneHot(y, V).cast("float32")), 1) // z[n, y_n]  [c]
          const p = tf.softmax(z) // [c, V]
          const entropy = tf.sub(lse, tf.sum(tf.mul(p, z), 1)) // H = lse − Σ p z  [c]
          return tf.stack([tf.sub(picked, lse), entropy], 1) // [c, 2]
        })
      )
      return {
        value: tf.concat(perChunk, 0), // [N, 2]: logp, H
        gradFunc: (dy: tf.Tensor2D, saved: Array<tf.Tensor>) => {
          const [hs, ws, ts] = saved as [tf.Tensor2D, tf.Tensor2D, tf.Tensor1D]
          const wT = tf.transpose(ws) // [V, D]
          let dW: tf.Tensor2D = tf.zerosLike(ws)
          const dh = chunks.map(([start, size]) => {
            const { dhc, dWc } = tf.tidy(() => {
              const hc = tf.slice(hs, [start, 0], [size, -1]) as tf.Tensor2D // [c, D]
              const z = tf.matMul(hc, ws) // [c, V]
              const logp = tf.logSoftmax(z) // [c, V]
              const p = tf.exp(logp) // [c, V]
              const entropy = tf.neg(tf.sum(tf.mul(p, logp), 1, true)) // [c, 1]
              const g = tf.slice(dy, [start, 0], [size, 2]) // [c, 2]
              const gLogp = tf.slice(g, [0, 0], [size, 1]) // [c, 1]
              const gH = tf.slice(g, [0, 1], [size, 1]) // [c, 1]
              const onehot = tf.oneHot(tf.cast(tf.slice(ts, [start], [size]), "int32"), V).cast("float32") // [c, V]
              const gz = tf.sub(
                tf.mul(gLogp, tf.sub(onehot, p)),
                tf.mul(gH, tf.mul(p, tf.add(logp, entropy)))
              ) as tf.Tensor2D // [c, V]
              return { dhc: tf.matMul(gz, wT), dWc: tf.matMul(tf.transpose(hc), gz) } // [c, D], [D, V]
            })
            const next = tf.add(dW, dWc) as tf.Tensor2D
            dW.dispose()
            dWc.dispose()
            dW = next
            return dhc
          })
          return [tf.concat(dh, 0), dW]
        }
      }
    }) as unknown as Parameters<typeof tf.customGrad>[0])
    const both = op(h, w) // [N, 2]
    return {
      logprobs: tf.reshape(tf.slice(both, [0, 0], [N, 1]), [N]) as tf.Tensor1D,
      entropy: tf.reshape(tf.slice(both, [0, 1], [N, 1]), [N]) as tf.Tensor1D
    }
  })

/** Whether a gradient may flow into `w`: a frozen variable (LoRA's base) needs none; any other tensor may. */
const trainable = (w: tf.Tensor): boolean => !(w instanceof tf.Variable) || w.trainable

/** The logp and H columns of a head's `[N, 2]` output. */
const columns = (both: tf.Tensor2D): { readonly logprobs: tf.Tensor1D; readonly entropy: tf.Tensor1D } => {
  const N = both.shape[0]
  return {
    logprobs: tf.reshape(tf.slice(both, [0, 0], [N, 1]), [N]) as tf.Tensor1D,
    entropy: tf.reshape(tf.slice(both, [0, 1], [N, 1]), [N]) as tf.Tensor1D
  }
}

/** Per-token log-probs (and entropy) of `input.ids` under the model's current weights. Differentiable. */
export const ofSequences = (
  model: Transformer.Transformer,
  input: Decoder.ForwardInput,
  options: Options = {}
): TokenLogProbs =>
  tf.tidy(() => {
    const tau = options.temperature ?? 1
    if (!(tau > 0)) throw new Error(`LogProbs.ofSequences: temperature must be > 0, got ${tau}`)
    const view = WeightView.training(model)
    const prepared = Decoder.prepare(input)
    const ids = prepared.ids
    const [B, T] = ids.shape
    const D = model.config.hiddenSize
    const { hidden } = Decoder.step(model, view, prepared) // [B·T, D]
    if (T < 2) {
      const zeros = tf.zeros([B, T]) as tf.Tensor2D
      return options.entropy === true
        ? { logprobs: zeros, entropy: tf.zeros([B, T]) as tf.Tensor2D }
        : { logprobs: zeros }
    }
    const rows = B * (T - 1)
    let h = tf.reshape(tf.slice(tf.reshape(hidden, [B, T, D]), [0, 0, 0], [B, T - 1, D]), [rows, D]) as tf.Tensor2D // [B·(T−1), D], drops the last position
    let targets = tf.reshape(tf.slice(ids, [0, 1], [B, T - 1]), [rows]) as tf.Tensor1D // [B·(T−1)]
    // with `only`, the head runs on the selected positions alone; `back` scatters their results into [B, T − 1]
    let back: tf.Tensor1D | undefined
    if (options.only !== undefined) {
      const only = options.only.flat()
      const selected: Array<number> = []
      const backIndex = new Int32Array(rows) // 0 = not selected (a zero row), k + 1 = k-th selected
      for (let b = 0; b < B; b++) {
        for (let t = 1; t < T; t++) {
          if (only[b * T + t]! > 0) {
            selected.push(b * (T - 1) + t - 1)
            backIndex[b * (T - 1) + t - 1] = selected.length
          }
        }
      }
      const index = tf.tensor1d(Int32Array.from(selected), "int32")
      h = tf.gather(h, index) as tf.Tensor2D // [N, D]
      targets = tf.gather(targets, index) as tf.Tensor1D // [N]
      back = tf.tensor1d(backIndex, "int32")
    }
    const N = h.shape[0]
    const scaled = tau === 1 ? h : (tf.mul(h, 1 / tau) as tf.Tensor2D) // [N, D]
    const V = model.config.vocabSize
    // the native head kernel holds no [N, V] tensor at any size, and reads a tied embedding as it is
    const native = Fused.headAvailable()
    const out =
      N * V > (options.fusedAbove ?? (native ? 0 : 2 ** 24))
        ? native
          ? columns(
              Fused.headLogProbs(scaled, view.head ?? view.embed, targets, {
                transposed: view.head === undefined,
                trainW: trainable(view.head ?? view.embed)
              })
            )
          : fusedHead(scaled, view.head ?? (tf.transpose(view.embed) as tf.Tensor2D), targets, options.chunkRows)
        : fromLogits(Decoder.logitsOf(view, scaled), targets, options.entropy === true) // z / τ  [N, V]
    const pad = (x: tf.Tensor1D): tf.Tensor2D => {
      const full = back === undefined ? x : (tf.gather(tf.concat([tf.zeros([1]), x]), back) as tf.Tensor1D) // [B·(T−1)]
      return tf.concat([tf.zeros([B, 1]), tf.reshape(full, [B, T - 1])], 1) as tf.Tensor2D // [B, T]
    }
    return options.entropy === true && out.entropy !== undefined
      ? { logprobs: pad(out.logprobs), entropy: pad(out.entropy) }
      : { logprobs: pad(out.logprobs) }
  })

/**
 * `log p(ids[t] | ids[<t])` for t = 1 … n−1 of one sequence, as plain numbers (what `model logprobs` prints). Async:
 * webgpu has no synchronous download.
 */
export const ofIds = async (model: Transformer.Transformer, ids: ReadonlyArray<number>): Promise<Array<number>> => {
  if (ids.length < 2) return []
  const { logprobs } = ofSequences(model, { ids: [ids] }) // [1, n]
  const values = await logprobs.data().finally(() => logprobs.dispose())
  return Array.from(values).slice(1)
}

/** One alternative at a position: a token id and its log-prob. */
export interface Alternative {
  readonly id: number
  readonly logprob: number
}

/**
 * The `k` most likely tokens at each position t ≥ `from` of one sequence (what came before them being `ids[<t]`), most
 * likely first, under `log softmax(z / τ)`: the sampler's distribution before top-k/top-p truncation (τ ≤ 0, greedy,
 * reads τ = 1, as the sampler's log-probs do). Teacher-forced on the weights as they are now. Async: webgpu has no
 * synchronous download.
 */
export const topK = async (
  model: Transformer.Transformer,
  ids: ReadonlyArray<number>,
  from: number,
  k: number,
  temperature: number
): Promise<Array<Array<Alternative>>> => {
  const positions = ids.length - from
  if (positions <= 0 || k <= 0) return Array.from({ length: Math.max(0, positions) }, () => [])
  const tau = temperature > 0 ? temperature : 1
  const kept = Math.min(k, model.config.vocabSize)
  const { values, indices } = tf.tidy(() => {
    const hidden = Decoder.hiddenStates(model, { ids: [ids] }) // [T, D]
    const rows = tf.slice(hidden, [from - 1, 0], [positions, hidden.shape[1]]) as tf.Tensor2D // [P, D]
    const z = tf.div(Decoder.logitsOf(WeightView.training(model), rows), tau) as tf.Tensor2D // [P, V]
    return tf.topk(tf.logSoftmax(z), kept) // [P, k]
  })
  const [v, i] = await Promise.all([values.data(), indices.data()]).finally(() => {
    values.dispose()
    indices.dispose()
  })
  return Array.from({ length: positions }, (_, p) =>
    Array.from({ length: kept }, (_, j) => ({ id: i[p * kept + j]!, logprob: v[p * kept + j]! }))
  )
}
