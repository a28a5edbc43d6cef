/**
 * Policy-gradient losses, as SkyRL defines them (`skyrl_train/utils/ppo_utils.py`, `PolicyLossRegistry`).
 *
 * Every loss is built the same way: a per-token loss ℓ_t `[B, T]`, then off-policy correction against the
 * sampler's log-probs (TIS weight and masks, {@link OffPolicyCorrection.apply}), then the loss reduction
 * ({@link Reduction.reduceLoss}). Diagnostics come back next to the loss as scalar tensors:
 * `clipRatio` (SkyRL's `clip_ratio`), `approxKl` = masked mean of (ρ − 1) − log ρ with ρ = π_θ/π_old
 * (Schulman's k3 estimate of KL(π_old ‖ π_θ), cleanrl's `approx_kl`; not in SkyRL), plus loss-specific and
 * off-policy metrics under camelCased SkyRL names (`cispo/ratio_mean` → `cispoRatioMean`).
 *
 * Two layers:
 * - tensor functions ({@link regular}, {@link dualClip}, …, {@link loss}): `Tensor2D`s in, `{ loss, metrics }` out,
 *   inside `tf.tidy`, differentiable in `logProbs` — call them inside `tf.variableGrads` (see
 *   `Diagnostics.variableGrads` to keep the metrics alive past its internal tidy);
 * - {@link compute}: plain `[B][T]` arrays in, numbers out.
 * Options are fully resolved: nothing here has a default value (an absent optional field means "off"); SkyRL's
 * defaults live in the config schema only (config/TrainerConfig.ts, `trainer.algorithm`).
 *
 * Legend: B sequences, T response tokens; ρ_t = exp(clamp(log π_θ − log π_old, −20, 20)) (SkyRL's
 * `safe_exp_delta`); Â advantages; m the loss mask; sg(·) stop-gradient.
 *
 * Departures from SkyRL, on purpose:
 * 1. The reduction is applied here, after the per-token loss, instead of by pre-scaling advantages in the
 *    trainer; every loss is linear in Â so the numbers match (tokens are counted on the mask before
 *    off-policy correction, as SkyRL does). For micro-batching use `Reduction.scaleAdvantages` + `"sum"`.
 * 2. `clip_cov` and `kl_cov` (random/top-k token selection) and the SFT/Tinker losses (`cross_entropy`,
 *   `importance_sampling`) are not ported.
 */
import * as tf from "../tensor/Tf.ts"
import * as Diagnostics from "./Diagnostics.ts"
import * as Matrix from "./Matrix.ts"
import * as OffPolicyCorrection from "./OffPolicyCorrection.ts"
import * as Reduction from "./Reduction.ts"

/** The tensors a policy loss reads, all `[B, T]`. Only `logProbs` carries gradient. */
export interface Inputs {
  readonly logProbs: tf.Tensor2D // log π_θ(a_t | s_t), the policy being trained
  readonly oldLogProbs: tf.Tensor2D // log π_old, recomputed by the trainer before the update
  readonly advantages: tf.Tensor2D // Â_t
  readonly lossMask: tf.Tensor2D // 1 = token sampled by the policy
  readonly rolloutLogProbs?: tf.Tensor2D | undefined // log π_rollout, from the sampler (off-policy correction)
}

/** Scalar diagnostics; `clipRatio` and `approxKl` always, the rest per loss and correction. */
export type Metrics = { readonly clipRatio: tf.Scalar; readonly approxKl: tf.Scalar } & Readonly<
  Record<string, tf.Scalar>
>

/** A reduced loss and its diagnostics. */
export type Output = {
  readonly loss: tf.Scalar
  readonly metrics: Metrics
}

/** What every loss needs after its per-token form: how to reduce, and how to correct for the sampler. */
export interface ReduceOptions {
  readonly lossReduction: Reduction.Reduction
  readonly maxSeqLen?: number | undefined // seq_mean_token_sum_norm only
  readonly offPolicyCorrection?: OffPolicyCorrection.Config | undefined // absent: no correction
}

/** PPO's asymmetric clip band [1 − εlow, 1 + εhigh]. */
export interface ClipOptions extends ReduceOptions {
  readonly epsClipLow: number
  readonly epsClipHigh: number
}

/**
 * `regular`, PPO-clip (Schulman et al. 2017) with DAPO's asymmetric band:
 * ℓ_t = −min(ρ_t Â_t, clip(ρ_t, 1 − εlow, 1 + εhigh) Â_t).   clipRatio = share of tokens where the clipped term wins.
 */
export const regular = (inputs: Inputs, options: ClipOptions): Output =>
  tf.tidy(() => {
    const { perToken, clipRatio } = ppoClip(inputs, options)
    return finish(perToken, inputs, options, { clipRatio })
  })

/** PPO's clip band and the dual-clip bound c > 1 on the loss of negative advantages. */
export interface DualClipOptions extends ClipOptions {
  readonly clipRatioC: number
}

/**
 * `dual_clip` (Ye et al. 2020, arXiv:1912.09729): PPO-clip, and where Â_t < 0 also bounded by c:
 * ℓ_t = min(−c Â_t, ℓ^clip_t) if Â_t < 0, else ℓ^clip_t. Limits the push-down from a token whose ρ exploded.
 */
export const dualClip = (inputs: Inputs, options: DualClipOptions): Output =>
  tf.tidy(() => {
    const { perToken, clipRatio } = ppoClip(inputs, options)
    const bound = tf.mul(tf.neg(inputs.advantages), options.clipRatioC) // −c Â        [B, T]
    const negative = tf.less(inputs.advantages, 0) // Â < 0       [B, T]
    const dual = tf.where(negative, tf.minimum(bound, perToken), perToken) // [B, T]
    return finish(dual, inputs, options, { clipRatio })
  })

/**
 * `gspo`, GSPO-token (Zheng et al. 2025, arXiv:2507.18071 eq. 14–15): one sequence-level ratio per response,
 * log s_i = masked mean_t (log π_θ − log π_old), applied to every token with the token's own gradient:
 * log s_{i,t} = min(sg(log s_i) + log π_θ − sg(log π_θ), 10), then PPO-clip on s_{i,t}. SkyRL recommends
 * `sequence_mean` with it.
 */
export const gspo = (inputs: Inputs, options: ClipOptions): Output =>
  tf.tidy(() => {
    const { logProbs, oldLogProbs, advantages, lossMask } = inputs
    const logSeqRatio = Reduction.maskedRowMean(tf.sub(logProbs, oldLogProbs), lossMask) // log s_i    [B, 1]
    const tokenPart = tf.sub(logProbs, stopGradient(logProbs)) // 0, grad 1   [B, T]
    const logRatio = tf.minimum(tf.add(tokenPart, stopGradient(logSeqRatio)), 10) // log s_{i,t}  [B, T]
    const ratio = tf.exp(logRatio) // s_{i,t}    [B, T]
    const { perToken, clipRatio } = clipSurrogate(ratio, advantages, lossMask, options)
    return finish(perToken, inputs, options, { clipRatio })
  })

/** CISPO's clip band on the IS weight, and which behaviour policy it is anchored on. */
export interface CispoOptions extends ReduceOptions {
  readonly cispoEpsClipLow: number // lower bound 1 − cispoEpsClipLow
  readonly cispoEpsClipHigh: number // upper bound 1 + cispoEpsClipHigh
  readonly cispoAnchor?: "old" | "rollout" | undefined // π_b; absent: π_old, the paper's anchor
}

/**
 * `cispo` (MiniMax-M1, arXiv:2506.13585): clip the IS weight, not the update, so clipped tokens still get gradient:
 * ℓ_t = −sg(clip(r_t, 1 − εlow, 1 + εhigh)) · Â_t · log π_θ(a_t), r_t = π_θ/π_b, with π_b = π_old (`cispoAnchor: "old"`,
 * the paper) or π_rollout (`"rollout"`: the ratio then *is* the off-policy correction, so stacking TIS throws).
 * clipRatio = share of tokens with r outside the band; also cispoRatioMean, cispoRatioClampedMean, cispoRatioMax,
 * cispoRatioMin (max/min over unmasked tokens).
 */
export const cispo = (inputs: Inputs, options: CispoOptions): Output =>
  tf.tidy(() => {
    const { logProbs, advantages, lossMask } = inputs
    const behaviour = options.cispoAnchor === "rollout" ? rolloutAnchor(inputs, options) : inputs.oldLogProbs
    const low = 1 - options.cispoEpsClipLow
    const high = 1 + options.cispoEpsClipHigh
    const ratio = safeExp(tf.sub(logProbs, behaviour)) // r          [B, T]
    const clamped = tf.clipByValue(ratio, low, high) // clip(r)    [B, T]
    const perToken = tf.neg(tf.mul(tf.mul(advantages, stopGradient(clamped)), logProbs)) // ℓ   [B, T]
    const outside = tf.logicalOr(tf.less(ratio, low), tf.greater(ratio, high)) // [B, T]
    const active = tf.notEqual(lossMask, 0) // [B, T]
    const anyActive = tf.any(active) // []
    const activeMax = tf.max(tf.where(active, ratio, tf.fill(ratio.shape, Number.NEGATIVE_INFINITY))) // []
    const activeMin = tf.min(tf.where(active, ratio, tf.fill(ratio.shape, Number.POSITIVE_INFINITY))) // []
    return finish(perToken, inputs, options, {
      clipRatio: Reduction.maskedMean(tf.cast(outside, "float32"), lossMask),
      cispoRatioMean: Reduction.maskedMean(ratio, lossMask),
      cispoRatioClampedMean: Reduction.maskedMean(clamped, lossMask),
      cispoRatioMax: tf.where(anyActive, activeMax, tf.max(ratio)) as tf.Scalar,
      cispoRatioMin: tf.where(anyActive, activeMin, tf.min(ratio)) as tf.Scalar
    })
  })

/**
 * `rollout_is` (GLM-5 report §4.1.2, arXiv:2602.15763; IcePop-style): r_t = π_θ/π_rollout, hard-zeroed outside the
 * open band (1 − εlow, 1 + εhigh): f(r) = r·[1 − εlow < r < 1 + εhigh]; ℓ_t = −sg(f(r_t)) · Â_t · log π_θ(a_t).
 * Needs `rolloutLogProbs`. clipRatio = share of tokens outside the band.
 */
export const rolloutIs = (inputs: Inputs, options: ClipOptions): Output =>
  tf.tidy(() => {
    const { logProbs, advantages, lossMask } = inputs
    const rollout = requireRollout(inputs, "rollout_is")
    const ratio = safeExp(tf.sub(logProbs, rollout)) // r      [B, T]
    const inRange = (r: tf.Tensor) =>
      tf.logicalAnd(tf.greater(r, 1 - options.epsClipLow), tf.less(r, 1 + options.epsClipHigh))
    const calibrated = detached(() => tf.where(inRange(ratio), ratio, tf.zerosLike(ratio)), ratio) // sg(f(r))   [B, T]
    const perToken = tf.neg(tf.mul(tf.mul(calibrated, advantages), logProbs)) // ℓ      [B, T]
    const clipRatio = Reduction.maskedMean(tf.cast(tf.logicalNot(inRange(ratio)), "float32"), lossMask)
    return finish(perToken, inputs, options, { clipRatio })
  })

/** SAPO's gate temperatures for positive and non-positive advantages. */
export interface SapoOptions extends ReduceOptions {
  readonly tauPos: number // τ where Â > 0
  readonly tauNeg: number // τ where Â ≤ 0
}

/**
 * `sapo` (arXiv:2511.20347): a soft gate instead of a hard clip, f_τ(ρ) = σ(τ(ρ − 1)) · 4/τ with
 * τ = τpos if Â > 0 else τneg, ρ = exp(clamp(log π_θ − log π_old, ±20)); ℓ_t = −f_τ(ρ_t) Â_t. clipRatio = 0.
 */
export const sapo = (inputs: Inputs, options: SapoOptions): Output =>
  tf.tidy(() => {
    const { logProbs, oldLogProbs, advantages } = inputs
    const ratio = safeExp(tf.sub(logProbs, oldLogProbs)) // ρ      [B, T]
    const tau = tf.where(
      tf.greater(advantages, 0),
      tf.fill(ratio.shape, options.tauPos),
      tf.fill(ratio.shape, options.tauNeg)
    )
    const gate = tf.mul(tf.sigmoid(tf.mul(tau, tf.sub(ratio, 1))), tf.div(4, tau)) // f_τ(ρ) [B, T]
    const perToken = tf.neg(tf.mul(gate, advantages)) // ℓ      [B, T]
    return finish(perToken, inputs, options, { clipRatio: tf.scalar(0) })
  })

/** DPPO's divergence test and thresholds. */
export interface DppoOptions extends ReduceOptions {
  readonly dppoType: "binary_tv" | "binary_kl"
  readonly deltaLow: number // threshold where Â < 0
  readonly deltaHigh: number // threshold where Â > 0
}

/**
 * `dppo`, binary variants (arXiv:2602.04879): no ratio clip; drop tokens whose probability moved too far from the
 * behaviour policy μ (π_rollout if given, else π_old) in the direction the advantage pushes:
 * binary_tv: drop if Â > 0 ∧ p − μ > δhigh, or Â < 0 ∧ μ − p > δlow;
 * binary_kl: with KL_bin = μ (log μ − log p) + (1 − μ) log((1 − μ + 1e-8)/(1 − p + 1e-8)),
 *            drop if Â > 0 ∧ p > μ ∧ KL_bin > δhigh, or Â < 0 ∧ p < μ ∧ KL_bin > δlow.
 * ℓ_t = −(π_θ/μ) Â_t · keep_t. clipRatio = share of dropped tokens.
 */
export const dppo = (inputs: Inputs, options: DppoOptions): Output =>
  tf.tidy(() => {
    const { logProbs, advantages, lossMask } = inputs
    const muLogProbs = inputs.rolloutLogProbs ?? inputs.oldLogProbs // log μ      [B, T]
    const ratio = safeExp(tf.sub(logProbs, muLogProbs)) // π_θ/μ      [B, T]
    const dropped = () => {
      const p = tf.exp(logProbs) // [B, T]
      const mu = tf.exp(muLogProbs) // [B, T]
      const diff = tf.sub(p, mu) // p − μ      [B, T]
      const positive = tf.greater(advantages, 0) // [B, T]
      const negative = tf.less(advantages, 0) // [B, T]
      if (options.dppoType === "binary_tv") {
        return tf.logicalOr(
          tf.logicalAnd(positive, tf.greater(diff, options.deltaHigh)),
          tf.logicalAnd(negative, tf.greater(tf.neg(diff), options.deltaLow))
        ) // [B, T] bool
      }
      const eps = 1e-8
      const binaryKl = tf.add(
        tf.mul(mu, tf.sub(muLogProbs, logProbs)),
        tf.mul(tf.sub(1, mu), tf.log(tf.div(tf.add(tf.sub(1, mu), eps), tf.add(tf.sub(1, p), eps))))
      ) // KL_bin     [B, T]
      return tf.logicalOr(
        tf.logicalAnd(tf.logicalAnd(positive, tf.greater(diff, 0)), tf.greater(binaryKl, options.deltaHigh)),
        tf.logicalAnd(tf.logicalAnd(negative, tf.less(diff, 0)), tf.greater(binaryKl, options.deltaLow))
      ) // [B, T] bool
    }
    const keep = detached(() => tf.cast(tf.logicalNot(dropped()), "float32"), logProbs) // no gradient   [B, T]
    const perToken = tf.neg(tf.mul(tf.mul(ratio, advantages), keep)) // ℓ      [B, T]
    const clipRatio = Reduction.maskedMean(tf.sub(1, keep), lossMask)
    return finish(perToken, inputs, options, { clipRatio })
  })

// ---------------------------------------------------------------------------------------------------------------
// Dispatch by SkyRL name
// ---------------------------------------------------------------------------------------------------------------

/**
 * Each loss's options by its SkyRL `policy_loss_type` name, fully resolved: no defaults here. Their values come from
 * `trainer.algorithm` (config/TrainerConfig.ts, the one home of SkyRL's defaults), resolved by the trainer.
 */
export interface Options {
  readonly regular: ClipOptions
  readonly dual_clip: DualClipOptions
  readonly gspo: ClipOptions
  readonly cispo: CispoOptions
  readonly rollout_is: ClipOptions
  readonly sapo: SapoOptions
  readonly dppo: DppoOptions
}

/** SkyRL's `policy_loss_type` values implemented here. */
export type Name = keyof Options

const losses: { readonly [N in Name]: (inputs: Inputs, options: Options[N]) => Output } = {
  regular,
  dual_clip: dualClip,
  gspo,
  cispo,
  rollout_is: rolloutIs,
  sapo,
  dppo
}

/** The tensor loss named `name`, with that loss's options. */
export const loss = <N extends Name>(name: N, inputs: Inputs, options: Options[N]): Output =>
  losses[name](inputs, options)

/** Plain-array inputs of {@link compute}, each `[B][T]`. */
export interface ArrayInputs {
  readonly logProbs: Matrix.Rows
  readonly oldLogProbs: Matrix.Rows
  readonly advantages: Matrix.Rows
  readonly lossMask: Matrix.Rows
  readonly rolloutLogProbs?: Matrix.Rows | undefined
}

/** The loss value and every diagnostic, as numbers. */
export type Values = { readonly loss: number; readonly clipRatio: number; readonly approxKl: number } & Readonly<
  Record<string, number>
>

/**
 * Plain-array form of {@link loss}: evaluate the loss named `name` (no gradient) and read every number back.
 * Synchronous (`dataSync`, after the tidy that computed them); on the webgpu backend, which cannot read synchronously
 * in Node, evaluate {@link loss} on tensors and `await Diagnostics.read` its loss and metrics.
 */
export const compute = <N extends Name>(name: N, inputs: ArrayInputs, options: Options[N]): Values => {
  Matrix.assertSyncRead(
    "PolicyLoss.compute",
    "evaluate PolicyLoss.loss on tensors and await Diagnostics.read({ loss, ...metrics }) instead"
  )
  Matrix.assertSameShape(inputs.oldLogProbs, inputs.logProbs, "oldLogProbs", "logProbs")
  Matrix.assertSameShape(inputs.advantages, inputs.logProbs, "advantages", "logProbs")
  Matrix.assertSameShape(inputs.lossMask, inputs.logProbs, "lossMask", "logProbs")
  if (inputs.rolloutLogProbs !== undefined) {
    Matrix.assertSameShape(inputs.rolloutLogProbs, inputs.logProbs, "rolloutLogProbs", "logProbs")
  }
  const out = tf.tidy(() =>
    loss(
      name,
      {
        logProbs: Matrix.toTensor(inputs.logProbs, "logProbs"),
        oldLogProbs: Matrix.toTensor(inputs.oldLogProbs, "oldLogProbs"),
        advantages: Matrix.toTensor(inputs.advantages, "advantages"),
        lossMask: Matrix.toTensor(inputs.lossMask, "lossMask"),
        rolloutLogProbs:
          inputs.rolloutLogProbs === undefined ? undefined : Matrix.toTensor(inputs.rolloutLogProbs, "rolloutLogProbs")
      },
      options
    )
  )
  return Diagnostics.readSync({ loss: out.loss, ...out.metrics }) as Values
}

// ---------------------------------------------------------------------------------------------------------------

/** PPO-clip on ρ = exp(clamp(log π_θ − log π_old, ±20)). */
const ppoClip = (inputs: Inputs, options: ClipOptions) => {
  const ratio = safeExp(tf.sub(inputs.logProbs, inputs.oldLogProbs)) // ρ   [B, T]
  return clipSurrogate(ratio, inputs.advantages, inputs.lossMask, options)
}

/** ℓ = −min(ρÂ, clip(ρ, 1 − εlow, 1 + εhigh)Â) and the share of tokens where the clipped term is the smaller. */
const clipSurrogate = (ratio: tf.Tensor, advantages: tf.Tensor, lossMask: tf.Tensor, options: ClipOptions) => {
  const surr1 = tf.mul(ratio, advantages) // ρÂ          [B, T]
  const clipped = tf.clipByValue(ratio, 1 - options.epsClipLow, 1 + options.epsClipHigh) // clip(ρ)     [B, T]
  const surr2 = tf.mul(clipped, advantages) // clip(ρ)Â    [B, T]
  const perToken = tf.neg(tf.minimum(surr1, surr2)) // ℓ           [B, T]
  const clipRatio = Reduction.maskedMean(tf.cast(tf.greater(tf.neg(surr2), tf.neg(surr1)), "float32"), lossMask)
  return { perToken, clipRatio }
}

/** Off-policy correction, reduction, and the metrics every loss reports. */
const finish = (
  perToken: tf.Tensor,
  inputs: Inputs,
  options: ReduceOptions,
  metrics: { readonly clipRatio: tf.Scalar } & Readonly<Record<string, tf.Scalar>>
): Output => {
  const { logProbs, oldLogProbs, lossMask } = inputs
  const corrected = OffPolicyCorrection.apply(
    perToken,
    oldLogProbs,
    inputs.rolloutLogProbs,
    lossMask,
    options.offPolicyCorrection ?? {}
  )
  const reduced = Reduction.reduceLoss(
    corrected.loss,
    corrected.lossMask,
    options.lossReduction,
    options.maxSeqLen,
    lossMask
  )
  const logRatio = stopGradient(tf.sub(logProbs, oldLogProbs)) // log ρ   [B, T]
  const approxKl = Reduction.maskedMean(tf.sub(tf.sub(tf.exp(logRatio), 1), logRatio), lossMask)
  return { loss: reduced, metrics: { ...metrics, approxKl, ...corrected.metrics } }
}

const rolloutAnchor = (inputs: Inputs, options: ReduceOptions): tf.Tensor2D => {
  const rollout = requireRollout(inputs, "cispo with cispoAnchor 'rollout'")
  const tis = options.offPolicyCorrection?.tisRatioType
  if (tis != null) {
    throw new RangeError(
      `cispoAnchor 'rollout' is already rollout-anchored and performs the off-policy correction; ` +
        `TIS (tisRatioType '${tis}') would double-count it. Unset offPolicyCorrection.tisRatioType.`
    )
  }
  return rollout
}

const requireRollout = (inputs: Inputs, what: string): tf.Tensor2D => {
  if (inputs.rolloutLogProbs === undefined) throw new RangeError(`${what} needs rolloutLogProbs`)
  return inputs.rolloutLogProbs
}

/** SkyRL's `safe_exp_delta`: exp(clamp(δ, −20, 20)). */
const safeExp = <T extends tf.Tensor>(delta: T): T => tf.exp(tf.clipByValue(delta, -20, 20))

/**
 * sg(f()): evaluate `f` off the gradient tape and give each of `inputs` (the tensors `f` reads that may carry
 * gradient) a zero gradient — torch's `.detach()` / `torch.no_grad()`. Running `f` inside `tf.customGrad` keeps its
 * boolean ops (which have no gradient in tfjs) off the backward path entirely.
 */
const detached = <T extends tf.Tensor>(f: () => T, ...inputs: Array<tf.Tensor>): T =>
  tf.customGrad((..._args: Array<tf.Tensor | tf.GradSaveFunc>) => ({
    value: f(),
    gradFunc: () => inputs.map((input) => tf.zerosLike(input))
  }))(...inputs) as T

/** sg(x): the value of x with zero gradient. */
const stopGradient = <T extends tf.Tensor>(x: T): T => detached(() => tf.clone(x), x)
