/**
 * KL divergence to a reference policy: Schulman's per-token estimators (SkyRL's `compute_approx_kl`),
 * the KL loss term, the KL-in-reward penalty, and the fixed/adaptive KL coefficient controllers.
 *
 * With log-ratio δ_t = log π_θ(a_t) − log π_ref(a_t) (sampled from π_θ), see http://joschu.net/blog/kl-approx.html:
 * - `k1`:  δ                                   unbiased, high variance, can be negative
 * - `abs`: |δ|
 * - `k2`:  ½ δ²
 * - `k3`:  e^{−δ} − 1 + δ, computed as in SkyRL: κ = clamp(−δ, −20, 20), k3 = clamp(e^κ − κ − 1, −10, 10)
 *
 * Masked positions are routed to 0 with a `where` (not just a multiply), so a NaN or ±∞ under a 0 mask
 * never leaks; kept positions are scaled by the (possibly soft) mask value, as in SkyRL.
 */
import * as tf from "../tensor/Tf.ts"
import type { klEstimators } from "../config/TrainerConfig.ts"
import * as Diagnostics from "./Diagnostics.ts"
import * as Matrix from "./Matrix.ts"
import * as Reduction from "./Reduction.ts"

/** SkyRL's `kl_estimator_type` values (one list, in the config schema). */
export type Estimator = (typeof klEstimators)[number]

/** Per-token KL estimate of π_θ ‖ π_ref. logProbs, refLogProbs, mask: [B, T] → [B, T]. */
export const approx = (
  logProbs: tf.Tensor2D,
  refLogProbs: tf.Tensor2D,
  estimator: Estimator,
  mask?: tf.Tensor2D
): tf.Tensor2D =>
  tf.tidy(() => {
    const kl = perToken(logProbs, refLogProbs, estimator) // [B, T]
    if (mask === undefined) return kl
    return tf.where(tf.notEqual(mask, 0), tf.mul<tf.Tensor2D>(kl, mask), tf.zerosLike(kl)) // [B, T]
  })

const perToken = (logProbs: tf.Tensor2D, refLogProbs: tf.Tensor2D, estimator: Estimator): tf.Tensor2D => {
  switch (estimator) {
    case "k1":
      return tf.sub<tf.Tensor2D>(logProbs, refLogProbs) // δ        [B, T]
    case "abs":
      return tf.abs(tf.sub<tf.Tensor2D>(logProbs, refLogProbs)) // |δ|      [B, T]
    case "k2":
      return tf.mul<tf.Tensor2D>(0.5, tf.square(tf.sub(logProbs, refLogProbs))) // ½δ²      [B, T]
    case "k3": {
      const kappa = tf.clipByValue(tf.sub<tf.Tensor2D>(refLogProbs, logProbs), -20, 20) // κ = −δ   [B, T]
      const k3 = tf.sub<tf.Tensor2D>(tf.sub(tf.exp(kappa), kappa), 1) // e^κ − κ − 1    [B, T]
      return tf.clipByValue(k3, -10, 10) // [B, T]
    }
  }
}

/**
 * KL loss term, as SkyRL's policy worker adds it (`use_kl_loss`): the per-sequence masked mean of the
 * per-token estimate, averaged over sequences. L_KL = (1/B) Σ_b Σ_t kl_{b,t} m_{b,t} / max(Σ_t m_{b,t}, 1).
 * The caller multiplies by `kl_loss_coef`.
 */
export const loss = (
  logProbs: tf.Tensor2D,
  refLogProbs: tf.Tensor2D,
  lossMask: tf.Tensor2D,
  estimator: Estimator
): tf.Scalar =>
  tf.tidy(() => {
    const kl = approx(logProbs, refLogProbs, estimator, lossMask) // [B, T]
    return tf.mean(Reduction.maskedRowMean(kl, lossMask)) // []
  })

/**
 * Plain-array form of {@link approx}: per-token KL estimates, `[B][T]` in and out. Synchronous; on the webgpu backend,
 * which cannot read synchronously in Node, use {@link estimateAsync}.
 */
export const estimate = (
  estimator: Estimator,
  logProbs: Matrix.Rows,
  refLogProbs: Matrix.Rows,
  mask?: Matrix.Rows
): Array<Array<number>> => {
  Matrix.assertSyncRead("Kl.estimate", "await Kl.estimateAsync(...) instead, with the same arguments")
  return Matrix.readRows(estimateTensor(estimator, logProbs, refLogProbs, mask))
}

/** {@link estimate}, read back asynchronously (`array()`): for every backend, webgpu included. */
export const estimateAsync = async (
  estimator: Estimator,
  logProbs: Matrix.Rows,
  refLogProbs: Matrix.Rows,
  mask?: Matrix.Rows
): Promise<Array<Array<number>>> => {
  const kl = estimateTensor(estimator, logProbs, refLogProbs, mask)
  return kl.array().finally(() => kl.dispose())
}

const estimateTensor = (
  estimator: Estimator,
  logProbs: Matrix.Rows,
  refLogProbs: Matrix.Rows,
  mask: Matrix.Rows | undefined
): tf.Tensor2D => {
  Matrix.assertSameShape(refLogProbs, logProbs, "refLogProbs", "logProbs")
  if (mask !== undefined) Matrix.assertSameShape(mask, logProbs, "mask", "logProbs")
  return tf.tidy(() =>
    approx(
      Matrix.toTensor(logProbs, "logProbs"),
      Matrix.toTensor(refLogProbs, "refLogProbs"),
      estimator,
      mask === undefined ? undefined : Matrix.toTensor(mask, "mask")
    )
  ) // [B, T]
}

// ---------------------------------------------------------------------------------------------------------------
// KL coefficient controllers (SkyRL's FixedKLController / AdaptiveKLController), as immutable values.
// ---------------------------------------------------------------------------------------------------------------

/** A KL coefficient β and how it moves. `value` is the coefficient to use now. */
export type Controller =
  | { readonly type: "fixed"; readonly value: number }
  | { readonly type: "adaptive"; readonly value: number; readonly target: number; readonly horizon: number }

/** β stays at `klCoef`. */
export const fixed = (klCoef: number): Controller => ({ type: "fixed", value: klCoef })

/** Ziegler et al. 2019 (arXiv:1909.08593): β moves so the measured KL tracks `target`, at a rate set by `horizon`. */
export const adaptive = (options: {
  readonly initKlCoef: number
  readonly target: number
  readonly horizon: number
}): Controller => {
  if (!(options.horizon > 0)) throw new RangeError(`horizon must be larger than 0. Got ${options.horizon}`)
  return { type: "adaptive", value: options.initKlCoef, target: options.target, horizon: options.horizon }
}

/**
 * One controller step after measuring `current` KL over `nSteps` samples:
 * adaptive: e = clip(current/target − 1, −0.2, 0.2), β ← β · (1 + e · nSteps / horizon); fixed: unchanged.
 */
export const update = (controller: Controller, current: number, nSteps: number): Controller => {
  if (controller.type === "fixed") return controller
  const proportionalError = Math.min(Math.max(current / controller.target - 1, -0.2), 0.2)
  const mult = 1 + (proportionalError * nSteps) / controller.horizon
  return { ...controller, value: controller.value * mult }
}

/**
 * KL in the reward (SkyRL's `apply_reward_kl_penalty`): r'_{b,t} = r_{b,t} − max(0, β) · kl_{b,t}, with kl the
 * masked per-token estimate. Then the controller steps on avgKl = mean_b(masked row mean of kl) with
 * nSteps = B (SkyRL uses the batch size).
 *
 * Returns the penalised rewards, the stepped controller, the β that was applied, avgKl and
 * avgKlMax = mean_b max_t |kl_{b,t}| (SkyRL's `loss/avg_kl`, `loss/avg_kl_max`, `loss/kl_loss_coef`).
 * Synchronous, as {@link estimate}: not on the webgpu backend in Node.
 */
export const applyKlPenalty = (
  input: {
    readonly tokenLevelRewards: Matrix.Rows
    readonly logProbs: Matrix.Rows
    readonly refLogProbs: Matrix.Rows
    readonly lossMask: Matrix.Rows
  },
  options: { readonly controller: Controller; readonly estimator: Estimator }
): {
  readonly tokenLevelRewards: Array<Array<number>>
  readonly controller: Controller
  readonly klCoef: number
  readonly avgKl: number
  readonly avgKlMax: number
} => {
  Matrix.assertSyncRead(
    "Kl.applyKlPenalty",
    "take kl from await Kl.estimateAsync(estimator, logProbs, refLogProbs, lossMask), subtract β·kl from the " +
      "rewards and step β with Kl.update"
  )
  for (const [rows, name] of [
    [input.logProbs, "logProbs"],
    [input.refLogProbs, "refLogProbs"],
    [input.lossMask, "lossMask"]
  ] as const) {
    Matrix.assertSameShape(rows, input.tokenLevelRewards, name, "tokenLevelRewards")
  }
  const klCoef = options.controller.value
  const out = tf.tidy(() => {
    const mask = Matrix.toTensor(input.lossMask, "lossMask") // [B, T]
    const logProbs = Matrix.toTensor(input.logProbs, "logProbs") // [B, T]
    const kl = approx(logProbs, Matrix.toTensor(input.refLogProbs, "refLogProbs"), options.estimator, mask) // [B, T]
    const rewards = Matrix.toTensor(input.tokenLevelRewards, "tokenLevelRewards") // [B, T]
    const penalised = tf.sub<tf.Tensor2D>(rewards, tf.mul(kl, Math.max(0, klCoef))) // [B, T]
    const klMean = tf.mean<tf.Scalar>(Reduction.maskedRowMean(kl, mask)) // []
    const klMax = tf.mean<tf.Scalar>(tf.max(tf.abs(kl), -1)) // []
    return { penalised, klMean, klMax }
  })
  const { avgKl, avgKlMax } = Diagnostics.readSync({ avgKl: out.klMean, avgKlMax: out.klMax })
  const rewards = Matrix.readRows(out.penalised)
  const controller = update(options.controller, avgKl, input.tokenLevelRewards.length)
  return { tokenLevelRewards: rewards, controller, klCoef, avgKl, avgKlMax }
}
