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
 * Memory: the head runs on T−1 positions; the temperature scales the hidden states [N, D], not the logits; the
 * picked logit is a gather, so the forward holds one [N, V] logits tensor plus the log-sum-exp's temporaries, and the
 * entropy (when asked) one softmax and one product more.
 */
import * as tf from "@tensorflow/tfjs"
import * as Transformer from "./Transformer.ts"

export interface Options {
  readonly temperature?: number // τ, default 1
  readonly entropy?: boolean // also compute H (default false)
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

/** Per-token log-probs (and entropy) of `input.ids` under the model's current weights. Differentiable. */
export const ofSequences = (
  model: Transformer.Transformer,
  input: Transformer.ForwardInput,
  options: Options = {}
): TokenLogProbs =>
  tf.tidy(() => {
    const tau = options.temperature ?? 1
    if (!(tau > 0)) throw new Error(`LogProbs.ofSequences: temperature must be > 0, got ${tau}`)
    const view = Transformer.trainingView(model)
    const { ids, keyMask, positions } = Transformer.prepare(input)
    const [B, T] = ids.shape
    const D = model.config.hiddenSize
    const { hidden } = Transformer.step(model, view, {
      ids,
      keyMask,
      positions,
      ...(input.training !== undefined ? { training: input.training } : {})
    }) // [B·T, D]
    if (T < 2) {
      const zeros = tf.zeros([B, T]) as tf.Tensor2D
      return options.entropy === true
        ? { logprobs: zeros, entropy: tf.zeros([B, T]) as tf.Tensor2D }
        : { logprobs: zeros }
    }
    const N = B * (T - 1)
    const h = tf.reshape(tf.slice(tf.reshape(hidden, [B, T, D]), [0, 0, 0], [B, T - 1, D]), [N, D]) as tf.Tensor2D // [N, D], drops the last position
    const scaled = tau === 1 ? h : (tf.mul(h, 1 / tau) as tf.Tensor2D) // [N, D]
    const logits = Transformer.logitsOf(view, scaled) // z / τ  [N, V]
    const targets = tf.reshape(tf.slice(ids, [0, 1], [B, T - 1]), [N]) as tf.Tensor1D // [N]
    const out = fromLogits(logits, targets, options.entropy === true)
    const pad = (x: tf.Tensor1D): tf.Tensor2D =>
      tf.concat([tf.zeros([B, 1]), tf.reshape(x, [B, T - 1])], 1) as tf.Tensor2D // [B, T]
    return out.entropy === undefined
      ? { logprobs: pad(out.logprobs) }
      : { logprobs: pad(out.logprobs), entropy: pad(out.entropy) }
  })

/** `log p(ids[t] | ids[<t])` for t = 1 … n−1 of one sequence, as plain numbers (what `model logprobs` prints). */
export const ofIds = (model: Transformer.Transformer, ids: ReadonlyArray<number>): Array<number> => {
  if (ids.length < 2) return []
  const { logprobs } = ofSequences(model, { ids: [ids] })
  const values = Array.from(logprobs.dataSync()).slice(1)
  logprobs.dispose()
  return values
}
