/**
 * Policy entropy from logits, as SkyRL's policy worker reports it (`policy_entropy`) and optionally adds it as a
 * bonus (`use_entropy_loss`, `entropy_loss_coef`).
 *
 * Per token, in logsumexp form (one softmax, no log of a probability that underflowed to 0):
 * H_t = −Σ_v p_v log p_v = logsumexp(z) − Σ_v softmax(z)_v · z_v. SkyRL divides logits by the sampling
 * temperature first; pass the tempered logits.
 *
 * Legend: B sequences, T tokens, V vocabulary.
 */
import * as tf from "../tensor/Tf.ts"
import * as Reduction from "./Reduction.ts"

/** H_t = logsumexp(z_t) − Σ_v softmax(z_t)_v z_{t,v}. logits: [B, T, V] → [B, T]. Differentiable. */
export const fromLogits = (logits: tf.Tensor3D): tf.Tensor2D =>
  tf.tidy(() => {
    const logNormalizer = tf.logSumExp(logits, -1) // logsumexp(z)      [B, T]
    const expectedLogit = tf.sum(tf.mul(tf.softmax(logits), logits), -1) // Σ_v p_v z_v       [B, T]
    return tf.sub(logNormalizer, expectedLogit) as tf.Tensor2D // H                 [B, T]
  })

/** SkyRL's `masked_mean(entropy, loss_mask)`: mean entropy over the loss tokens of the batch. → []. */
export const maskedMean = (logits: tf.Tensor3D, lossMask: tf.Tensor2D): tf.Scalar =>
  tf.tidy(() => Reduction.maskedMean(fromLogits(logits), lossMask))
