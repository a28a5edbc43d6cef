/**
 * Advantage estimators, as SkyRL defines them (`skyrl_train/utils/ppo_utils.py`, ported there from verl).
 * Plain `[B][T]` arrays in and out, computed in JS doubles: group means and standard deviations must not
 * lose precision to float32 (tfjs has no float64), and these are per-sample loops, not tensor work.
 *
 * Inputs follow SkyRL: `tokenLevelRewards` `[B][T]` (outcome rewards usually sit on the last response
 * token), `responseMask` `[B][T]`, `index` `[B]` (the prompt uid: samples with the same index form a
 * group). Each estimator returns `{ advantages, returns }`, both `[B][T]`.
 *
 * Kept exactly as SkyRL has them, on purpose (the first three are surprising):
 * 1. GRPO/RLOO/MaxRL score a response by Σ_t r_t over *all* positions, not only masked ones.
 * 2. GAE runs its recursion over every position (the mask only enters the whitening), and its whitened
 *    advantages are not re-masked; REINFORCE++ re-masks.
 * 3. {@link advantageBatchNormalize} centres on the unmasked mean of all `[B][T]` entries.
 * 4. A group of one: GRPO uses mean 0, std 1 (Â = r / (1 + ε)); RLOO gives Â = 0; MaxRL gives Â = r.
 * 5. GRPO's std is the unbiased (Bessel, n − 1) sample std, like `torch.std`; ε = 1e-6 is added to it.
 * 6. Whitening (GAE, REINFORCE++) is global over the batch: unbiased masked variance, 1/√(var + 1e-8);
 *    it throws when fewer than two tokens are unmasked, as SkyRL's `masked_var` raises.
 */
import type { advantageEstimators } from "../config/TrainerConfig.ts"
import * as Matrix from "./Matrix.ts"

/** SkyRL's `advantage_estimator` values: the config's list, so that a new estimator is accepted there too. */
export type Estimator = (typeof advantageEstimators)[number]

/** `[B][T]` advantages and returns. */
export interface Result {
  readonly advantages: Array<Array<number>>
  readonly returns: Array<Array<number>>
}

/** A batch of responses with outcome rewards, grouped by prompt `index`. */
export interface Grouped {
  readonly tokenLevelRewards: Matrix.Rows
  readonly responseMask: Matrix.Rows
  readonly index: ReadonlyArray<string | number>
}

/** The inputs of {@link compute}: everything any estimator reads, with SkyRL's defaults. */
export interface Inputs extends Grouped {
  readonly values?: Matrix.Rows | undefined // critic values V(s_t), gae only
  readonly gamma?: number | undefined // discount, default 1
  readonly lambd?: number | undefined // GAE λ, default 1
  readonly normByStd?: boolean | undefined // grpo only, default true; false = Dr. GRPO
  readonly epsilon?: number | undefined // grpo/maxrl, default 1e-6
}

/** Dispatch by SkyRL's estimator name (`compute_advantages_and_returns`), with its defaults γ = λ = 1. */
export const compute = (name: Estimator, inputs: Inputs): Result => {
  const gamma = inputs.gamma ?? 1
  switch (name) {
    case "grpo":
      return grpo(inputs, { normByStd: inputs.normByStd ?? true, epsilon: inputs.epsilon ?? 1e-6 })
    case "rloo":
      return rloo(inputs)
    case "maxrl":
      return maxrl(inputs, { epsilon: inputs.epsilon ?? 1e-6 })
    case "reinforce++":
      return reinforcePlusPlus(inputs, { gamma })
    case "gae": {
      if (inputs.values === undefined) throw new RangeError(`advantage estimator "gae" needs values`)
      return gae({ ...inputs, values: inputs.values }, { gamma, lambd: inputs.lambd ?? 1 })
    }
  }
}

/**
 * GRPO (Shao et al. 2024), outcome rewards: s_i = Σ_t r_{i,t}; within the group G(i) of samples sharing i's index,
 * Â_i = (s_i − mean_G s) / (std_G s + ε)   (normByStd), or   Â_i = s_i − mean_G s   (Dr. GRPO, normByStd: false).
 * Â_{i,t} = Â_i · mask_{i,t}; returns = advantages.
 */
export const grpo = (
  input: Grouped,
  options: { readonly normByStd?: boolean; readonly epsilon?: number } = {}
): Result => {
  const normByStd = options.normByStd ?? true
  const epsilon = options.epsilon ?? 1e-6
  const scores = sequenceScores(input)
  const stats = new Map<string | number, { readonly mean: number; readonly std: number }>()
  for (const [key, members] of groups(input.index)) {
    const s = members.map((i) => scores[i]!)
    // SkyRL: a group of one gets mean 0 and std 1, so its advantage is its raw score.
    stats.set(key, s.length === 1 ? { mean: 0, std: 1 } : { mean: mean(s), std: unbiasedStd(s) })
  }
  const adv = scores.map((s, i) => {
    const { mean: m, std } = stats.get(input.index[i]!)!
    return normByStd ? (s - m) / (std + epsilon) : s - m
  })
  return broadcastOutcome(adv, input.responseMask)
}

/**
 * RLOO (Ahmadian et al. 2024; Kool et al. 2019): leave-one-out baseline within the group of n samples,
 * Â_i = s_i − mean_{j≠i} s_j = (s_i − mean_G s) · n / (n − 1); a group of one gets Â = 0.
 */
export const rloo = (input: Grouped): Result => {
  const scores = sequenceScores(input)
  const adv = new Array<number>(scores.length).fill(0)
  for (const members of groups(input.index).values()) {
    const n = members.length
    if (n === 1) continue // SkyRL: only one response for this prompt, advantage 0
    const m = mean(members.map((i) => scores[i]!))
    for (const i of members) adv[i] = (scores[i]! - m) * (n / (n - 1))
  }
  return broadcastOutcome(adv, input.responseMask)
}

/** MaxRL: Â_i = (s_i − mean_G s) / (mean_G s + ε); a group of one gets Â = s_i (mean 0). */
export const maxrl = (input: Grouped, options: { readonly epsilon?: number } = {}): Result => {
  const epsilon = options.epsilon ?? 1e-6
  const scores = sequenceScores(input)
  const adv = scores.slice()
  for (const members of groups(input.index).values()) {
    if (members.length === 1) continue
    const m = mean(members.map((i) => scores[i]!))
    for (const i of members) adv[i] = (scores[i]! - m) / (m + epsilon)
  }
  return broadcastOutcome(adv, input.responseMask)
}

/**
 * REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go that resets where the mask is 0,
 * G_t = r_t + γ·G_{t+1}·m_t  (scanning t = T−1 … 0, G_T = 0), then global masked whitening, re-masked:
 * Â_t = whiten(G)_t · m_t. `index` is not used: the baseline is the batch, not the group.
 */
export const reinforcePlusPlus = (
  input: Pick<Grouped, "tokenLevelRewards" | "responseMask">,
  options: { readonly gamma: number }
): Result => {
  const { tokenLevelRewards: rewards, responseMask: mask } = input
  Matrix.assertSameShape(mask, rewards, "responseMask", "tokenLevelRewards")
  const returns = rewards.map((row, b) => {
    const out = new Array<number>(row.length).fill(0)
    let runningReturn = 0
    for (let t = row.length - 1; t >= 0; t--) {
      runningReturn = row[t]! + options.gamma * runningReturn
      out[t] = runningReturn
      runningReturn = runningReturn * mask[b]![t]! // reset after EOS
    }
    return out
  })
  const advantages = maskedWhiten(returns, mask).map((row, b) => row.map((a, t) => a * mask[b]![t]!))
  return { advantages, returns }
}

/**
 * GAE (Schulman et al. 2016): δ_t = r_t + γ·V_{t+1} − V_t (V_T = 0), Â_t = δ_t + γλ·Â_{t+1};
 * returns R_t = Â_t + V_t (before whitening); advantages = masked whitening of Â (not re-masked).
 */
export const gae = (
  input: Pick<Grouped, "tokenLevelRewards" | "responseMask"> & { readonly values: Matrix.Rows },
  options: { readonly gamma: number; readonly lambd: number }
): Result => {
  const { tokenLevelRewards: rewards, responseMask: mask, values } = input
  Matrix.assertSameShape(mask, rewards, "responseMask", "tokenLevelRewards")
  Matrix.assertSameShape(values, rewards, "values", "tokenLevelRewards")
  const raw = rewards.map((row, b) => {
    const v = values[b]!
    const out = new Array<number>(row.length).fill(0)
    let lastGaeLambda = 0
    for (let t = row.length - 1; t >= 0; t--) {
      const nextValue = t < row.length - 1 ? v[t + 1]! : 0
      const delta = row[t]! + options.gamma * nextValue - v[t]!
      lastGaeLambda = delta + options.gamma * options.lambd * lastGaeLambda
      out[t] = lastGaeLambda
    }
    return out
  })
  const returns = raw.map((row, b) => row.map((a, t) => a + values[b]![t]!))
  return { advantages: maskedWhiten(raw, mask), returns }
}

/**
 * SkyRL's `advantage_batch_normalize` (trainer `_normalize_advantages`, step 1), over the whole training batch:
 * μ = mean of all B·T entries (masked or not), σ² = Σ (Â − μ)²·m / Σ m, Â' = (Â − μ) / √max(σ², 1e-8).
 * Not re-masked: masked positions become −μ/σ, which the loss mask then ignores.
 */
export const advantageBatchNormalize = (advantages: Matrix.Rows, responseMask: Matrix.Rows): Array<Array<number>> => {
  Matrix.assertSameShape(responseMask, advantages, "responseMask", "advantages")
  const ones = advantages.map((row) => row.map(() => 1))
  const count = weightedSum(advantages, ones, () => 1)
  const mu = count === 0 ? 0 : weightedSum(advantages, ones, (a) => a) / count // unmasked mean, as SkyRL
  const numActions = weightedSum(advantages, responseMask, () => 1)
  const variance = weightedSum(advantages, responseMask, (a) => (a - mu) ** 2) / numActions
  const rstd = 1 / Math.sqrt(Math.max(variance, 1e-8))
  return advantages.map((row) => row.map((a) => (a - mu) * rstd))
}

// ---------------------------------------------------------------------------------------------------------------

/** s_b = Σ_t r_{b,t} over all positions (SkyRL: `token_level_rewards.sum(dim=-1)`). */
const sequenceScores = (input: Grouped): Array<number> => {
  Matrix.assertSameShape(input.responseMask, input.tokenLevelRewards, "responseMask", "tokenLevelRewards")
  if (input.index.length !== input.tokenLevelRewards.length) {
    throw new RangeError(`index has ${input.index.length} entries for ${input.tokenLevelRewards.length} responses`)
  }
  return input.tokenLevelRewards.map((row) => row.reduce((sum, r) => sum + r, 0))
}

/** Sample positions per prompt index, in first-seen order. */
const groups = (index: ReadonlyArray<string | number>): Map<string | number, Array<number>> => {
  const out = new Map<string | number, Array<number>>()
  index.forEach((key, i) => {
    const members = out.get(key)
    if (members === undefined) out.set(key, [i])
    else members.push(i)
  })
  return out
}

/** Outcome advantage per sequence → `[B][T]`: Â_{b,t} = Â_b · m_{b,t}; returns are the same array. */
const broadcastOutcome = (adv: ReadonlyArray<number>, mask: Matrix.Rows): Result => {
  const advantages = mask.map((row, b) => row.map((m) => adv[b]! * m))
  return { advantages, returns: advantages.map((row) => row.slice()) }
}

const mean = (xs: ReadonlyArray<number>): number => xs.reduce((sum, x) => sum + x, 0) / xs.length

/** √(Σ (x − x̄)² / (n − 1)), torch.std's default. */
const unbiasedStd = (xs: ReadonlyArray<number>): number => {
  const m = mean(xs)
  return Math.sqrt(xs.reduce((sum, x) => sum + (x - m) ** 2, 0) / (xs.length - 1))
}

/**
 * SkyRL's `masked_whiten` (shift_mean = true): μ = Σ x·m / max(Σ m, 1), var = Σ (x − μ)²·m / max(Σ m, 1) · n/(n − 1)
 * with n = Σ m, x' = (x − μ) / √(var + 1e-8) at every position.
 */
const maskedWhiten = (values: Matrix.Rows, mask: Matrix.Rows): Array<Array<number>> => {
  const n = weightedSum(values, mask, () => 1)
  if (n === 0) throw new RangeError("masked whitening needs at least one unmasked token")
  if (n === 1) throw new RangeError("masked whitening over a single unmasked token divides by zero (n − 1 = 0)")
  const mu = weightedSum(values, mask, (x) => x) / Math.max(n, 1)
  const variance = (weightedSum(values, mask, (x) => (x - mu) ** 2) / Math.max(n, 1)) * (n / (n - 1))
  const rstd = 1 / Math.sqrt(variance + 1e-8)
  return values.map((row) => row.map((x) => (x - mu) * rstd))
}

/** Σ_{b,t} f(x_{b,t}) · m_{b,t}, in doubles. */
const weightedSum = (values: Matrix.Rows, mask: Matrix.Rows, f: (x: number) => number): number => {
  let total = 0
  for (let b = 0; b < values.length; b++) {
    const row = values[b]!
    for (let t = 0; t < row.length; t++) total += f(row[t]!) * mask[b]![t]!
  }
  return total
}
