/**
 * The critic's loss for PPO with GAE, as SkyRL defines it (`ppo_critic_loss` in `ppo_utils.py`).
 *
 * With returns R_t (from `Advantages.gae`), old values V_old (recorded with the batch) and the critic's current V:
 * - clipped (`valueClip` c set, SkyRL default 0.2): V^clip = V_old + clip(V − V_old, −c, c),
 *   ℓ_t = max((V^clip_t − R_t)², (V_t − R_t)²)   — pessimistic, like PPO's policy clip;
 * - unclipped (`valueClip` null): ℓ_t = (V_t − R_t)².
 * L = ½ · mean_b [Σ_t ℓ_{b,t} m_{b,t} / max(Σ_t m_{b,t}, 1)]   (per-sequence token mean, then batch mean).
 *
 * Metrics: `valuesClipfrac` = share of tokens where the clipped error is the larger (clipped only), `valuesMean`
 * = masked mean of V (SkyRL's `values_clipfrac`, `values_mean`).
 */
import * as tf from "../tensor/Tf.ts"
import * as Reduction from "./Reduction.ts"

/** The tensors the critic loss reads, all `[B, T]`. Only `values` carries gradient. */
export interface Inputs {
  readonly values: tf.Tensor2D // V_θ(s_t), the critic being trained
  readonly oldValues: tf.Tensor2D // V_old(s_t), recorded when the batch was made
  readonly returns: tf.Tensor2D // R_t
  readonly lossMask: tf.Tensor2D
}

/** The loss and its diagnostics. */
export type Output = {
  readonly loss: tf.Scalar
  readonly metrics: { readonly valuesMean: tf.Scalar; readonly valuesClipfrac?: tf.Scalar }
}

/** SkyRL's `ppo_critic_loss`; `valueClip` null or undefined = unclipped squared error. */
export const ppo = (inputs: Inputs, valueClip: number | null | undefined = 0.2): Output =>
  tf.tidy(() => {
    const { values, oldValues, returns, lossMask } = inputs
    const unclipped = tf.square(tf.sub(values, returns)) // (V − R)²        [B, T]
    const valuesMean = Reduction.maskedMean(values, lossMask) // []
    if (valueClip == null) return { loss: half(unclipped, lossMask), metrics: { valuesMean } }
    const delta = tf.clipByValue(tf.sub(values, oldValues), -valueClip, valueClip) // clip(V − V_old)  [B, T]
    const clipped = tf.square(tf.sub(tf.add(oldValues, delta), returns)) // (V^clip − R)²   [B, T]
    const perToken = tf.maximum(clipped, unclipped) // ℓ                [B, T]
    const valuesClipfrac = Reduction.maskedMean(tf.cast(tf.greater(clipped, unclipped), "float32"), lossMask) // []
    return { loss: half(perToken, lossMask), metrics: { valuesMean, valuesClipfrac } }
  })

/** ½ · mean_b (masked row mean of ℓ) → []. */
const half = (perToken: tf.Tensor, lossMask: tf.Tensor2D): tf.Scalar =>
  tf.mul(0.5, tf.mean(Reduction.maskedRowMean(perToken, lossMask)))
