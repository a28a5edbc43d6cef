/**
 * Off-policy correction against the sampler's log-probs (SkyRL's `off_policy_correction_utils.py`).
 *
 * The trainer's π_old and the sampler's π_rollout differ (numerics of another engine, and in async mode
 * weights up to `maxStaleness` versions older). With the token IS ratio ρ_t = exp(clamp(log π_old − log π_rollout, ±20)):
 * - outlier mask:  drop a whole sequence if any unmasked ρ_t < `outlierTokenIsThresholdLow` or > `…High`;
 * - token mask:    drop single tokens with ρ_t ∉ [`tokenMaskIsThresholdLow`, `tokenMaskIsThresholdHigh`];
 * - TIS:           multiply the per-token loss by min(ρ_t, `tokenTisRatioClipHigh`) (`"token"`), or by
 *                  min(Π_t ρ_t^{m_t}, `sequenceTisRatioClipHigh`) per sequence (`"sequence"`), no gradient;
 * - sequence mask: drop a sequence whose `"geometric"` mean exp(Σ_t m_t log ρ_t / max(Σ_t m_t, 1)) or `"product"`
 *                  exp(Σ_t m_t log ρ_t) leaves [`geoMaskLow`, `geoMaskHigh`] or [`productMaskLow`, `productMaskHigh`].
 * Applied in that order, each on the mask left by the one before. SkyRL's deprecated `use_tis` +
 * `tis_imp_ratio_cap: c` is `{ tisRatioType: "token", tokenTisRatioClipHigh: c }`.
 *
 * Nothing here is differentiated: ρ depends only on π_old and π_rollout, which are data.
 */
import * as tf from "../tensor/Tf.ts"
import * as Reduction from "./Reduction.ts"

/** SkyRL's `trainer.algorithm.off_policy_correction`, camelCased. Absent or null disables a part. */
export interface Config {
  readonly tisRatioType?: "token" | "sequence" | null | undefined
  readonly tokenTisRatioClipHigh?: number | undefined // default 2.0
  readonly sequenceTisRatioClipHigh?: number | undefined // default 5.0
  readonly sequenceMaskMetric?: "product" | "geometric" | null | undefined
  readonly geoMaskHigh?: number | undefined // default 1.01
  readonly geoMaskLow?: number | undefined // default 0.99
  readonly productMaskHigh?: number | undefined // default 2.0
  readonly productMaskLow?: number | undefined // default 0.5
  readonly outlierTokenIsThresholdLow?: number | null | undefined
  readonly outlierTokenIsThresholdHigh?: number | null | undefined
  readonly tokenMaskIsThresholdLow?: number | null | undefined
  readonly tokenMaskIsThresholdHigh?: number | null | undefined
}

/** Diagnostics (camelCased SkyRL names: `isRatioMean` is `is_ratio_mean`), each a scalar tensor. */
export type Metrics = Readonly<Record<string, tf.Scalar>>

/** SkyRL's `off_policy_correction_enabled`: is any part switched on? (The token mask needs both bounds.) */
export const enabled = (config: Config): boolean =>
  config.tisRatioType != null ||
  config.sequenceMaskMetric != null ||
  config.outlierTokenIsThresholdLow != null ||
  config.outlierTokenIsThresholdHigh != null ||
  (config.tokenMaskIsThresholdLow != null && config.tokenMaskIsThresholdHigh != null)

/** ρ_t = exp(clamp(log π_old − log π_rollout, −20, 20))   [B, T] */
export const tokenRatio = (oldLogProbs: tf.Tensor2D, rolloutLogProbs: tf.Tensor2D): tf.Tensor2D =>
  tf.tidy(() => safeExp(tf.sub<tf.Tensor2D>(oldLogProbs, rolloutLogProbs)))

/**
 * TIS weight, SkyRL's `compute_tis_ratio`: `"token"` → min(ρ_t, cap) `[B, T]`; `"sequence"` → min(exp(Σ_t m_t log ρ_t), cap)
 * `[B, 1]`. Metrics: `tisTokenClipHighRatio` (capped share of unmasked tokens) or `tisSeqClipHighRatio` (of sequences).
 */
export const tisRatio = (
  oldLogProbs: tf.Tensor2D,
  rolloutLogProbs: tf.Tensor2D,
  lossMask: tf.Tensor2D,
  type: "token" | "sequence",
  config: Config
): { readonly ratio: tf.Tensor2D; readonly metrics: Metrics } =>
  tf.tidy(() => {
    const logRatio = tf.sub<tf.Tensor2D>(oldLogProbs, rolloutLogProbs) // log ρ   [B, T]
    if (type === "token") {
      const cap = config.tokenTisRatioClipHigh ?? 2.0
      const ratio = safeExp(logRatio) // ρ       [B, T]
      const valid = tf.greater(lossMask, 0) // [B, T]
      const capped = tf.logicalAnd(tf.greater(ratio, cap), valid) // [B, T]
      const share = tf.div(tf.sum(tf.cast(capped, "float32")), tf.maximum(tf.sum(tf.cast(valid, "float32")), 1))
      return { ratio: tf.minimum(ratio, cap), metrics: { tisTokenClipHighRatio: share as tf.Scalar } }
    }
    const cap = config.sequenceTisRatioClipHigh ?? 5.0
    const ratio = safeExp(Reduction.maskedRowSum(logRatio, lossMask)) // Π ρ     [B, 1]
    const share = tf.mean(tf.cast(tf.greater(ratio, cap), "float32")) as tf.Scalar
    return { ratio: tf.minimum(ratio, cap), metrics: { tisSeqClipHighRatio: share } }
  })

/**
 * SkyRL's `compute_outlier_token_mask`: 1 for sequences whose unmasked tokens all have ρ_t within the set bounds,
 * else 0. `[B, 1]`. Metrics: `outlierSeqMaskedRatio`, `outlierSeqOverHighRatio`, `outlierSeqUnderLowRatio`.
 */
export const outlierTokenMask = (
  oldLogProbs: tf.Tensor2D,
  rolloutLogProbs: tf.Tensor2D,
  lossMask: tf.Tensor2D,
  config: Config
): { readonly mask: tf.Tensor2D; readonly metrics: Metrics } =>
  tf.tidy(() => {
    const ratio = safeExp(tf.sub(oldLogProbs, rolloutLogProbs)) // ρ   [B, T]
    const valid = tf.greater(lossMask, 0) // [B, T]
    const high = config.outlierTokenIsThresholdHigh
    const low = config.outlierTokenIsThresholdLow
    const overHigh = high == null ? tf.zerosLike(valid) : tf.logicalAnd(tf.greater(ratio, high), valid) // [B, T]
    const underLow = low == null ? tf.zerosLike(valid) : tf.logicalAnd(tf.less(ratio, low), valid) // [B, T]
    const anyOver = tf.any(overHigh, -1, true) // [B, 1]
    const anyUnder = tf.any(underLow, -1, true) // [B, 1]
    const keep = tf.logicalNot(tf.logicalOr(anyOver, anyUnder)) // [B, 1]
    return {
      mask: tf.cast(keep, "float32") as tf.Tensor2D,
      metrics: {
        outlierSeqMaskedRatio: shareOf(tf.logicalNot(keep)),
        outlierSeqOverHighRatio: shareOf(anyOver),
        outlierSeqUnderLowRatio: shareOf(anyUnder)
      }
    }
  })

/**
 * SkyRL's `compute_token_mask`: 0 for unmasked tokens with ρ_t ∉ [low, high] (bounds inclusive), else 1. `[B, T]`.
 * Metric `tokenMaskRatio`: dropped share of the unmasked tokens.
 */
export const tokenMask = (
  oldLogProbs: tf.Tensor2D,
  rolloutLogProbs: tf.Tensor2D,
  lossMask: tf.Tensor2D,
  config: Config
): { readonly mask: tf.Tensor2D; readonly metrics: Metrics } =>
  tf.tidy(() => {
    const low = config.tokenMaskIsThresholdLow ?? 0
    const high = config.tokenMaskIsThresholdHigh ?? Number.POSITIVE_INFINITY
    const ratio = safeExp(tf.sub(oldLogProbs, rolloutLogProbs)) // ρ   [B, T]
    const inBounds = tf.logicalAnd(tf.greaterEqual(ratio, low), tf.lessEqual(ratio, high)) // [B, T]
    const valid = tf.greater(lossMask, 0) // [B, T]
    const dropped = tf.logicalAnd(tf.logicalNot(inBounds), valid) // [B, T]
    const share = tf.div(tf.sum(tf.cast(dropped, "float32")), tf.maximum(tf.sum(tf.cast(valid, "float32")), 1))
    return {
      mask: tf.cast(tf.logicalOr(inBounds, tf.logicalNot(valid)), "float32") as tf.Tensor2D,
      metrics: { tokenMaskRatio: share as tf.Scalar }
    }
  })

/**
 * SkyRL's `compute_sequence_mask`: 1 for sequences whose `"geometric"` or `"product"` IS ratio is within bounds. `[B, 1]`.
 * Metrics `{geo,product}SequenceMask{Masked,OverHigh,UnderLow}Ratio`.
 */
export const sequenceMask = (
  oldLogProbs: tf.Tensor2D,
  rolloutLogProbs: tf.Tensor2D,
  lossMask: tf.Tensor2D,
  metric: "product" | "geometric",
  config: Config
): { readonly mask: tf.Tensor2D; readonly metrics: Metrics } =>
  tf.tidy(() => {
    const logSum = Reduction.maskedRowSum(tf.sub(oldLogProbs, rolloutLogProbs), lossMask) // Σ m log ρ   [B, 1]
    const geometric = metric === "geometric"
    const seqRatio = geometric
      ? safeExp(tf.div(logSum, tf.maximum(tf.sum(lossMask, -1, true), 1))) // geometric mean   [B, 1]
      : safeExp(logSum) // product   [B, 1]
    const high = geometric ? (config.geoMaskHigh ?? 1.01) : (config.productMaskHigh ?? 2.0)
    const low = geometric ? (config.geoMaskLow ?? 0.99) : (config.productMaskLow ?? 0.5)
    const overHigh = tf.greater(seqRatio, high) // [B, 1]
    const underLow = tf.less(seqRatio, low) // [B, 1]
    const keep = tf.logicalNot(tf.logicalOr(overHigh, underLow)) // [B, 1]
    const prefix = geometric ? "geoSequenceMask" : "productSequenceMask"
    return {
      mask: tf.cast(keep, "float32") as tf.Tensor2D,
      metrics: {
        [`${prefix}MaskedRatio`]: shareOf(tf.logicalNot(keep)),
        [`${prefix}OverHighRatio`]: shareOf(overHigh),
        [`${prefix}UnderLowRatio`]: shareOf(underLow)
      }
    }
  })

/**
 * SkyRL's `compute_off_policy_correction`: the TIS weight (or undefined), the corrected loss mask, and metrics
 * (`isRatioMean`/`Std`/`Max`/`Min` of ρ first; Std/Max/Min over ρ·m including masked zeros, as SkyRL).
 */
export const compute = (
  oldLogProbs: tf.Tensor2D,
  rolloutLogProbs: tf.Tensor2D,
  lossMask: tf.Tensor2D,
  config: Config
): { readonly tisRatio: tf.Tensor2D | undefined; readonly lossMask: tf.Tensor2D; readonly metrics: Metrics } =>
  tf.tidy(() => {
    if (!enabled(config)) return { tisRatio: undefined, lossMask: tf.clone(lossMask), metrics: {} }
    const ratio = safeExp(tf.sub<tf.Tensor2D>(oldLogProbs, rolloutLogProbs)) // ρ     [B, T]
    const masked = tf.mul(ratio, lossMask) // ρ·m   [B, T]
    const metrics: Record<string, tf.Scalar> = {
      isRatioMean: Reduction.maskedMean(ratio, lossMask),
      isRatioStd: unbiasedStd(masked),
      isRatioMax: tf.max(masked),
      isRatioMin: tf.min(masked)
    }
    let mask = lossMask
    if (config.outlierTokenIsThresholdLow != null || config.outlierTokenIsThresholdHigh != null) {
      const outlier = outlierTokenMask(oldLogProbs, rolloutLogProbs, mask, config)
      mask = tf.mul<tf.Tensor2D>(mask, outlier.mask) // [B, T]
      Object.assign(metrics, outlier.metrics)
    }
    if (config.tokenMaskIsThresholdLow != null && config.tokenMaskIsThresholdHigh != null) {
      const token = tokenMask(oldLogProbs, rolloutLogProbs, mask, config)
      mask = tf.mul<tf.Tensor2D>(mask, token.mask) // [B, T]
      Object.assign(metrics, token.metrics)
    }
    let weight: tf.Tensor2D | undefined
    if (config.tisRatioType != null) {
      const tis = tisRatio(oldLogProbs, rolloutLogProbs, mask, config.tisRatioType, config)
      weight = tis.ratio // [B, T] or [B, 1]
      Object.assign(metrics, tis.metrics)
    }
    if (config.sequenceMaskMetric != null) {
      const sequence = sequenceMask(oldLogProbs, rolloutLogProbs, mask, config.sequenceMaskMetric, config)
      mask = tf.mul<tf.Tensor2D>(mask, sequence.mask) // [B, T]
      Object.assign(metrics, sequence.metrics)
    }
    return { tisRatio: weight, lossMask: mask === lossMask ? tf.clone(lossMask) : mask, metrics }
  })

/**
 * SkyRL's `apply_off_policy_correction`: loss' = loss · TIS weight, and the corrected mask. Without rollout
 * log-probs, or with nothing enabled, the loss and mask pass through unchanged.
 */
export const apply = (
  loss: tf.Tensor,
  oldLogProbs: tf.Tensor2D,
  rolloutLogProbs: tf.Tensor2D | undefined,
  lossMask: tf.Tensor2D,
  config: Config
): { readonly loss: tf.Tensor; readonly lossMask: tf.Tensor2D; readonly metrics: Metrics } =>
  tf.tidy(() => {
    if (rolloutLogProbs === undefined) return { loss: tf.clone(loss), lossMask: tf.clone(lossMask), metrics: {} }
    const correction = compute(oldLogProbs, rolloutLogProbs, lossMask, config)
    const corrected = correction.tisRatio === undefined ? tf.clone(loss) : tf.mul(loss, correction.tisRatio) // [B, T]
    // mean |log π_old − log π_rollout| over loss tokens, whether or not a correction is on: what a quantised or
    // other engine's behaviour log-probs differ by from the trainer's
    const logprobDiffAbs = Reduction.maskedMean(tf.abs(tf.sub(oldLogProbs, rolloutLogProbs)), lossMask)
    return { loss: corrected, lossMask: correction.lossMask, metrics: { ...correction.metrics, logprobDiffAbs } }
  })

// ---------------------------------------------------------------------------------------------------------------

/** SkyRL's `safe_exp_delta`: exp(clamp(δ, −20, 20)). */
const safeExp = <T extends tf.Tensor>(delta: T): T => tf.exp(tf.clipByValue(delta, -20, 20))

/** Share of true entries of a boolean tensor. */
const shareOf = (flags: tf.Tensor): tf.Scalar => tf.mean(tf.cast(flags, "float32"))

/** torch's `.std()` of all entries: √(Σ (x − x̄)² / (n − 1)). */
const unbiasedStd = (x: tf.Tensor): tf.Scalar => {
  const n = x.size
  const { variance } = tf.moments(x)
  return tf.sqrt(tf.mul(variance, n / (n - 1)))
}
