/**
 * Masked reductions over `[B, T]` token tensors, and SkyRL's three loss reductions.
 *
 * SkyRL (`skyrl_train/utils/ppo_utils.py`) applies the loss reduction by rescaling the advantages of a
 * whole mini-batch (`apply_loss_reduction_to_advantages_minibatch`) and then *summing* the masked
 * per-token loss (`reduce_loss`). Every policy loss is linear in Â, so `Σ_t ℓ_t(Â_t·w_t)·m_t` equals
 * `Σ_t ℓ_t(Â_t)·w_t·m_t`: {@link reduceLoss} applies the same weights `w` after the fact, which gives
 * SkyRL's numbers when the batch is the mini-batch. {@link scaleAdvantages} is SkyRL's own path, for
 * trainers that split a mini-batch into micro-batches: pre-scale once, then reduce each micro-batch
 * with `"sum"`.
 *
 * Legend: B sequences, T response tokens. Masks hold 1 for tokens that count and 0 elsewhere.
 */
import * as tf from "../tensor/Tf.ts"

/** SkyRL's `loss_reduction` values. */
export type LossReduction = "token_mean" | "sequence_mean" | "seq_mean_token_sum_norm"

/** A loss reduction, or `"sum"` (SkyRL's `reduce_loss`) for advantages already passed through {@link scaleAdvantages}. */
export type Reduction = LossReduction | "sum"

/** Σ_{b,t} x·m */
export const maskedSum = (x: tf.Tensor, mask: tf.Tensor): tf.Scalar => tf.tidy(() => tf.sum(tf.mul(x, mask)))

/**
 * SkyRL's `masked_mean`: Σ x·m / max(Σ m, 1). The clamp makes an all-masked batch give 0, not NaN.
 */
export const maskedMean = (x: tf.Tensor, mask: tf.Tensor): tf.Scalar =>
  tf.tidy(() => tf.div(tf.sum(tf.mul(x, mask)), tf.maximum(tf.sum(mask), 1)))

/** Per-sequence Σ_t x·m, kept as a column. */
export const maskedRowSum = (x: tf.Tensor, mask: tf.Tensor): tf.Tensor2D =>
  tf.tidy(() => tf.sum<tf.Tensor2D>(tf.mul(x, mask), -1, true)) // [B, 1]

/** Per-sequence masked mean (SkyRL's `masked_mean(x, m, dim=-1)`), kept as a column: Σ_t x·m / max(Σ_t m, 1). */
export const maskedRowMean = (x: tf.Tensor, mask: tf.Tensor): tf.Tensor2D =>
  tf.tidy(() => {
    const total = tf.sum(tf.mul(x, mask), -1, true) // [B, 1]
    const count = tf.maximum(tf.sum(mask, -1, true), 1) // [B, 1]
    return tf.div<tf.Tensor2D>(total, count) // [B, 1]
  })

/**
 * The per-token weight w such that `Σ_{b,t} ℓ·m·w` is the chosen reduction of ℓ, counted on `countMask`:
 * - `token_mean`:              w = 1 / max(Σ_{b,t} m, 1)                 (DAPO)
 * - `sequence_mean`:           w_b = 1 / (B · max(Σ_t m_{b,t}, 1))
 * - `seq_mean_token_sum_norm`: w = 1 / (B · maxSeqLen)                    (Dr. GRPO)
 * - `sum`:                     w = 1
 *
 * Returns `[1, 1]` or `[B, 1]`, broadcastable against `[B, T]`.
 */
export const weights = (countMask: tf.Tensor, reduction: Reduction, maxSeqLen?: number): tf.Tensor2D =>
  tf.tidy(() => {
    const batchSize = countMask.shape[0]
    switch (reduction) {
      case "token_mean":
        return tf.reshape<tf.Rank.R2>(tf.div(1, tf.maximum(tf.sum(countMask), 1)), [1, 1]) // [1, 1]
      case "sequence_mean":
        return tf.div<tf.Tensor2D>(1, tf.mul(batchSize, tf.maximum(tf.sum(countMask, -1, true), 1))) // [B, 1]
      case "seq_mean_token_sum_norm":
        return tf.fill([1, 1], 1 / (batchSize * requireMaxSeqLen(maxSeqLen))) as tf.Tensor2D // [1, 1]
      case "sum":
        return tf.ones([1, 1]) as tf.Tensor2D // [1, 1]
    }
  })

/**
 * Reduce a per-token loss to a scalar: L = Σ_{b,t} ℓ_{b,t} · m_{b,t} · w_{b,t}, with w from {@link weights}
 * counted on `countMask` (default: `lossMask`).
 *
 * **Gotcha:** SkyRL counts tokens on the mini-batch's loss mask *before* off-policy correction drops
 * tokens or sequences, so pass the original mask as `countMask` and the corrected one as `lossMask`.
 */
export const reduceLoss = (
  loss: tf.Tensor,
  lossMask: tf.Tensor,
  reduction: Reduction,
  maxSeqLen?: number,
  countMask: tf.Tensor = lossMask
): tf.Scalar =>
  tf.tidy(() => {
    const w = weights(countMask, reduction, maxSeqLen) // [B, 1] or [1, 1]
    return tf.sum(tf.mul(tf.mul(loss, lossMask), w)) // []
  })

/**
 * SkyRL's `apply_loss_reduction_to_advantages_minibatch`: Â'_{b,t} = Â_{b,t} · w_{b,t}, so that a `"sum"`
 * reduction of any policy loss over Â' equals the chosen reduction over Â. Call it once per mini-batch.
 */
export const scaleAdvantages = (
  advantages: tf.Tensor2D,
  lossMask: tf.Tensor2D,
  reduction: LossReduction,
  maxSeqLen?: number
): tf.Tensor2D => tf.tidy(() => tf.mul<tf.Tensor2D>(advantages, weights(lossMask, reduction, maxSeqLen))) // [B, T]

const requireMaxSeqLen = (maxSeqLen: number | undefined): number => {
  if (maxSeqLen === undefined || !(maxSeqLen > 0)) {
    throw new RangeError(`loss reduction "seq_mean_token_sum_norm" needs a positive maxSeqLen, got ${maxSeqLen}`)
  }
  return maxSeqLen
}
