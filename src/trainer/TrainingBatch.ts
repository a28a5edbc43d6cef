/**
 * From trajectory groups to the arrays a policy update reads (SkyRL's `convert_to_training_input` plus the
 * generator-side filters). Plain arrays; the trainer turns them into tensors per micro-batch.
 *
 * Layout: one row per trajectory, `ids = promptIds ++ responseIds`, right-padded to the batch's longest row.
 * Every per-token array is aligned with `ids` (index t is token t): `lossMask` is 0 on the prompt, on template and
 * tool-output tokens and on padding; `advantages` and `rolloutLogProbs` are 0 wherever the mask is 0.
 *
 * Filters, in order (`trainer.algorithm.*` keys):
 * 1. `zero_reward_on_non_stop`: a trajectory that did not end `stop` gets reward 0 (its turns' rewards zeroed).
 * 2. `apply_overlong_filtering`: `overlong` and `length` trajectories keep their reward but get an all-zero loss
 *    mask (DAPO's overlong filtering: truncation is not evidence about the policy).
 * 3. `zero_variance_filter`: groups whose rewards are all equal are dropped (they carry no GRPO signal).
 * Trajectories that ended `error` always get a zero loss mask: they are kept in the log, never trained on.
 *
 * Last-line guard, `maxSequenceLength` (RunConfig.derive's: generator.max_input_length): the generator never makes a trajectory longer
 * (AgentLoop cuts the prompt or observation that would overflow and ends it `overlong`), but a row longer than that
 * here (a bug elsewhere, an episode log from older code) is cut to it and gets a zero loss mask, and its trajectory
 * id is listed in `truncated` for the trainer to warn about: one such row must not take a step's forward pass down.
 */
import * as Advantages from "../algo/Advantages.ts"
import type { Trajectory, TrajectoryGroup } from "../domain/Trajectory.ts"
import * as Traj from "../domain/Trajectory.ts"

export interface Options {
  readonly estimator: Advantages.Estimator
  readonly normByStd: boolean
  readonly gamma: number
  readonly lambd: number
  readonly advantageBatchNormalize: boolean
  readonly zeroRewardOnNonStop: boolean
  readonly overlongFiltering: boolean
  readonly zeroVarianceFilter: boolean
  /** the longest row trained on (RunConfig.derive's); longer rows are cut to it and masked. None: no cap */
  readonly maxSequenceLength?: number
  /** KL in the reward: r_t ← r_t − coef · kl_t on loss tokens; `kl` is aligned with the rows' ids (from a first build) */
  readonly klPenalty?: { readonly kl: ReadonlyArray<ReadonlyArray<number>>; readonly coef: number }
  /** GAE: the critic's V(s_t), aligned with the rows' ids (from a first build); required when estimator is gae */
  readonly values?: ReadonlyArray<ReadonlyArray<number>>
  /**
   * On-policy distillation: each loss token's advantage is −coef · (log π_rollout − log π_teacher) from the
   * trajectory's `teacherLogprobs`, alone (`rewards` false: the RL advantage is not used) or added to the RL
   * advantage. The zero-variance filter does not apply (a group with equal rewards still has its teacher's signal).
   */
  readonly distillation?: { readonly coef: number; readonly rewards: boolean }
}

export interface Batch {
  readonly ids: Array<Array<number>> // [B, L], padded with 0
  readonly attentionMask: Array<Array<number>> // [B, L], 1 = real token
  readonly lossMask: Array<Array<number>> // [B, L]
  readonly advantages: Array<Array<number>> // [B, L]
  readonly rolloutLogProbs: Array<Array<number>> // [B, L]
  readonly returns: Array<Array<number>> // [B, L], GAE returns (the critic's targets); 0 elsewhere
  readonly values: Array<Array<number>> // [B, L], V_old(s_t) the returns were computed with; 0 without a critic
  readonly rewards: Array<number> // [B], after the reward filters
  readonly promptUids: Array<string> // [B], the GRPO group of each row
  readonly replayed: Array<number> // [B], 1 = an ExperienceReplay success (trained as if sampled now)
  readonly length: number // L
  readonly droppedGroups: number // by the zero-variance filter
  readonly truncated: Array<string> // trajectory id of each row cut to maxSequenceLength (and masked)
}

const rewardOf = (t: Trajectory, o: Options): number =>
  o.zeroRewardOnNonStop && t.stopReason !== "stop" ? 0 : t.reward

/** Every training row of `t` is within maxSequenceLength (one row, or one per step for step-wise trajectories). */
const fits = (t: Trajectory, o: Options): boolean => {
  const max = o.maxSequenceLength
  if (max === undefined) return true
  if (t.steps === undefined) return t.promptIds.length + t.responseIds.length <= max
  return t.steps.every((s) => s.promptIds.length + s.responseIds.length <= max)
}

/** A training row before padding: one per trajectory, or one per turn of a step-wise trajectory. */
interface Row {
  readonly prompt: ReadonlyArray<number>
  readonly response: ReadonlyArray<number>
  readonly mask: ReadonlyArray<number> // response-aligned
  readonly advantage: ReadonlyArray<number> // response-aligned
  readonly logp: ReadonlyArray<number> // response-aligned
  readonly returns: ReadonlyArray<number> // response-aligned
  readonly values: ReadonlyArray<number> // response-aligned
  readonly reward: number
  readonly uid: string
  readonly id: string // the trajectory's
  readonly replayed: number
}

const trainable = (t: Trajectory, o: Options): boolean =>
  t.stopReason !== "error" &&
  !(o.overlongFiltering && (t.stopReason === "overlong" || t.stopReason === "length")) &&
  fits(t, o)

export const build = (groups: ReadonlyArray<TrajectoryGroup>, o: Options): Batch => {
  const kept = groups.filter((g) => {
    if (!o.zeroVarianceFilter || o.distillation !== undefined) return true
    const rewards = g.trajectories.map((t) => rewardOf(t, o))
    return rewards.some((r) => r !== rewards[0])
  })
  const rows = kept.flatMap((g) => g.trajectories.map((t) => ({ t, uid: g.promptUid })))
  const maxResponse = Math.max(1, ...rows.map(({ t }) => t.responseIds.length))
  // Advantages on the response region only (SkyRL's layout), then placed after each prompt.
  const responseMask = rows.map(({ t }) => {
    const m = new Array<number>(maxResponse).fill(0)
    if (trainable(t, o)) for (const [i, v] of t.lossMask.entries()) m[i] = v
    return m
  })
  const tokenLevelRewards = rows.map(({ t }, b) => {
    const r = new Array<number>(maxResponse).fill(0)
    const reward = rewardOf(t, o)
    const perToken = Traj.tokenRewards(t)
    if (reward === t.reward) for (const [i, v] of perToken.entries()) r[i] = v
    if (o.klPenalty !== undefined) {
      const P = t.promptIds.length
      for (let i = 0; i < t.responseIds.length; i++) {
        if (responseMask[b]![i] === 1) r[i]! -= o.klPenalty.coef * (o.klPenalty.kl[b]?.[P + i] ?? 0)
      }
    }
    return r
  })
  const values =
    o.values === undefined
      ? undefined
      : rows.map(({ t }, b) => {
          const v = new Array<number>(maxResponse).fill(0)
          const P = t.promptIds.length
          for (let i = 0; i < t.responseIds.length; i++) v[i] = o.values![b]?.[P + i] ?? 0
          return v
        })
  if (o.estimator === "gae" && (values === undefined || rows.some(({ t }) => t.steps !== undefined))) {
    throw new Error("TrainingBatch: gae needs critic values and cannot train step-wise trajectories")
  }
  const computed = Advantages.compute(o.estimator, {
    tokenLevelRewards,
    responseMask,
    index: rows.map(({ uid }) => uid),
    gamma: o.gamma,
    lambd: o.lambd,
    normByStd: o.normByStd,
    values
  })
  let advantages = computed.advantages
  if (o.advantageBatchNormalize && rows.length > 0)
    advantages = Advantages.advantageBatchNormalize(advantages, responseMask)
  if (o.distillation !== undefined) {
    const { coef, rewards } = o.distillation
    advantages = advantages.map((adv, b) => {
      const t = rows[b]!.t
      return adv.map((a, i) => {
        const teacher = t.teacherLogprobs?.[i]
        const kl = responseMask[b]![i] === 1 && teacher !== undefined ? t.rolloutLogprobs[i]! - teacher : 0
        return (rewards ? a : 0) - coef * kl
      })
    })
  }
  // Training rows: one per trajectory, or one per turn for step-wise trajectories (the trajectory's advantage, taken
  // at its last loss token, copied to every turn: SkyRL's step-wise training).
  const sampledRows: Array<Row> = rows.flatMap(({ t, uid }, b): Array<Row> => {
    const reward = rewardOf(t, o)
    if (t.steps === undefined) {
      return [
        {
          prompt: t.promptIds,
          response: t.responseIds,
          mask: responseMask[b]!,
          advantage: advantages[b]!,
          logp: t.rolloutLogprobs,
          returns: o.estimator === "gae" ? computed.returns[b]! : [],
          values: values?.[b] ?? [],
          reward,
          uid,
          id: t.id,
          replayed: t.replay === true ? 1 : 0
        }
      ]
    }
    const last = responseMask[b]!.lastIndexOf(1)
    const scalar = last < 0 ? 0 : advantages[b]![last]!
    const on = last < 0 ? 0 : 1
    return t.steps.map((step) => ({
      prompt: step.promptIds,
      response: step.responseIds,
      mask: step.responseIds.map(() => on),
      advantage: step.responseIds.map(() => scalar),
      logp: step.rolloutLogprobs,
      returns: [],
      values: [],
      reward,
      uid,
      id: t.id,
      replayed: t.replay === true ? 1 : 0
    }))
  })
  // the guard: cut what is too long (prompt first kept), with no loss tokens (`fits` already zeroed its mask)
  const max = o.maxSequenceLength ?? Number.POSITIVE_INFINITY
  const truncated: Array<string> = []
  const trainingRows = sampledRows.map((row): Row => {
    if (row.prompt.length + row.response.length <= max) return row
    truncated.push(row.id)
    const prompt = row.prompt.slice(0, max)
    return { ...row, prompt, response: row.response.slice(0, max - prompt.length), mask: [] }
  })
  const length = Math.max(1, ...trainingRows.map((r) => r.prompt.length + r.response.length))
  const batch: Batch = {
    ids: [],
    attentionMask: [],
    lossMask: [],
    advantages: [],
    rolloutLogProbs: [],
    returns: [],
    values: [],
    rewards: trainingRows.map((r) => r.reward),
    promptUids: trainingRows.map((r) => r.uid),
    replayed: trainingRows.map((r) => r.replayed),
    length,
    droppedGroups: groups.length - kept.length,
    truncated
  }
  for (const row of trainingRows) place(batch, row)
  return batch
}

/**
 * Appends `row` to `batch`'s per-token arrays: the prompt then the response from index 0, right-padded with 0 to
 * `batch.length`; advantages, log-probs, returns and values are 0 wherever the loss mask is.
 */
const place = (batch: Batch, row: Row): void => {
  const pad = () => new Array<number>(batch.length).fill(0)
  const P = row.prompt.length
  const ids = pad()
  const attention = pad()
  const mask = pad()
  const adv = pad()
  const logp = pad()
  const ret = pad()
  const val = pad()
  for (const [i, id] of row.prompt.entries()) {
    ids[i] = id
    attention[i] = 1
  }
  for (const [i, id] of row.response.entries()) {
    const m = row.mask[i] ?? 0
    ids[P + i] = id
    attention[P + i] = 1
    mask[P + i] = m
    adv[P + i] = m === 0 ? 0 : row.advantage[i]!
    logp[P + i] = m === 0 ? 0 : row.logp[i]!
    ret[P + i] = m === 0 ? 0 : (row.returns[i] ?? 0)
    val[P + i] = m === 0 ? 0 : (row.values[i] ?? 0)
  }
  batch.ids.push(ids)
  batch.attentionMask.push(attention)
  batch.lossMask.push(mask)
  batch.advantages.push(adv)
  batch.rolloutLogProbs.push(logp)
  batch.returns.push(ret)
  batch.values.push(val)
}

/** Rows [from, to) of a batch, trimmed to their own longest row (micro-batches need not pay for the longest one). */
export const slice = (batch: Batch, from: number, to: number): Batch => {
  const rows = batch.attentionMask.slice(from, to)
  const length = Math.max(1, ...rows.map((m) => m.lastIndexOf(1) + 1))
  const cut = (x: Array<Array<number>>) => x.slice(from, to).map((r) => r.slice(0, length))
  return {
    ids: cut(batch.ids),
    attentionMask: cut(batch.attentionMask),
    lossMask: cut(batch.lossMask),
    advantages: cut(batch.advantages),
    rolloutLogProbs: cut(batch.rolloutLogProbs),
    returns: cut(batch.returns),
    values: cut(batch.values),
    rewards: batch.rewards.slice(from, to),
    promptUids: batch.promptUids.slice(from, to),
    replayed: batch.replayed.slice(from, to),
    length,
    droppedGroups: 0,
    truncated: []
  }
}

export const tokenCount = (batch: Batch): number => batch.lossMask.reduce((n, r) => n + r.reduce((a, b) => a + b, 0), 0)
