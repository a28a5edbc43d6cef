/**
 * GRPO / PPO-family policy trainer (SkyRL's policy worker, without its god-object):
 *
 *   batch        = TrainingBatch.build(groups)                    filters, layout, advantages Â (float64)
 *   log π_old    = forward pass before any update (no gradient)   the PPO anchor (see 4.)
 *   log π_ref    = frozen / EMA reference (when a KL term is on)
 *   for each PPO epoch, for each mini-batch (policy_mini_batch_size prompts):
 *       Σ over micro-batches of ∇ [ L_policy(π_θ, π_old, Â, π_rollout) + β_KL·L_KL − β_H·H ]   (accumulated)
 *       AdamW step with global-norm clipping and the scheduled learning rate → policyVersion + 1
 *
 * Departures, on purpose:
 * 1. Micro-batch losses are scaled by their share of the mini-batch (tokens for token_mean, sequences otherwise),
 *    so gradient accumulation gives the loss of the whole mini-batch, whatever micro_train_batch_size is.
 * 2. Log-probs use logits / τ with τ = the sampling temperature, as the sampler did, so ρ = 1 on-policy.
 * 3. `advantage_estimator: gae` trains a critic (Critic.ts: a copy of the policy trunk with a value head) on the GAE
 *    returns, one critic step after each policy step, with the PPO value clip `value_clip`.
 * 4. No separate π_old pass for the rows of the first mini-batch of the first epoch: nothing has been updated yet, so
 *    π_old = π_θ there and log π_old = sg(log π_θ) of the training forward itself (what SkyRL's one-epoch, one-mini-batch
 *    runs amount to). The pass runs for the other rows, before any update; epochs after the first reuse the detached
 *    values. Not with LoRA dropout (the training forward is then not π_old's).
 * 5. `trainer.experience_replay`: ExperienceReplay adds a kept success to each all-failed group of a prompt it has
 *    seen partly solved, before the batch is built; such rows train with π_rollout = π_old. The step's reward and
 *    generation metrics describe the sampled groups only.
 *
 * A step is synchronous tfjs compute on the thread that also runs the agent loops (engine hand-offs, MCP tool calls):
 * it yields to the event loop (`Effect.yieldNow`, a `setImmediate`) before every forward pass and before the optimizer
 * update, so trajectories keep moving while an async run trains. Every read of a tensor is an awaited download
 * (`data()`/`array()`, outside any tidy): webgpu has no synchronous read, and on wasm/cpu it resolves at once. It is uninterruptible: the weights, the optimizer
 * and the policy version change together or not at all.
 */
import * as tf from "../tensor/Tf.ts"
import { Clock, Effect, Layer, Ref } from "effect"
import * as Diagnostics from "../algo/Diagnostics.ts"
import * as Kl from "../algo/Kl.ts"
import type * as OffPolicyCorrection from "../algo/OffPolicyCorrection.ts"
import * as PolicyLoss from "../algo/PolicyLoss.ts"
import * as Reduction from "../algo/Reduction.ts"
import type * as RunConfig from "../config/RunConfig.ts"
import type { AlgorithmConfig, TrainerConfig } from "../config/TrainerConfig.ts"
import { ConfigError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import * as LogProbs from "../model/LogProbs.ts"
import * as Lora from "../model/Lora.ts"
import * as Snapshot from "../model/Snapshot.ts"
import * as Transformer from "../model/Transformer.ts"
import * as Critic from "./Critic.ts"
import * as ExperienceReplay from "./ExperienceReplay.ts"
import * as Optimizer from "./Optimizer.ts"
import { PolicyModel } from "./PolicyModel.ts"
import { type StepResult, Trainer, type TrainerState } from "./Trainer.ts"
import * as TrainingBatch from "./TrainingBatch.ts"

/** The values from other config sections the trainer needs, each computed once by `RunConfig.derive`. */
export type Derived = Pick<
  RunConfig.Derived,
  "sequencesPerMiniBatch" | "miniBatchesPerStep" | "temperature" | "maxSequenceLength" | "lossMaxSeqLen"
>

/** The trainer's slice of the run: its config section, the derived values it needs, and the run's length. */
export interface Options {
  readonly trainer: TrainerConfig
  readonly derived: Derived
  readonly totalSteps: number // training steps of the run (set by the data): the learning-rate schedule's horizon
}

const offPolicyConfig = (a: AlgorithmConfig): OffPolicyCorrection.Config =>
  a.off_policy_correction === "none"
    ? {}
    : a.off_policy_correction === "token"
      ? { tisRatioType: "token", tokenTisRatioClipHigh: a.tis_imp_ratio_cap }
      : { tisRatioType: "sequence", sequenceTisRatioClipHigh: a.tis_imp_ratio_cap }

/**
 * The policy loss `policy_loss_type` names, its options read from `trainer.algorithm` (whose schema holds every
 * default) and `maxSeqLen`, seq_mean_token_sum_norm's divisor (RunConfig.derive's lossMaxSeqLen).
 */
export const policyLoss = (
  a: AlgorithmConfig,
  maxSeqLen: number
): ((inputs: PolicyLoss.Inputs) => PolicyLoss.Output) => {
  const reduce: PolicyLoss.ReduceOptions = {
    lossReduction: a.loss_reduction,
    maxSeqLen,
    offPolicyCorrection: offPolicyConfig(a)
  }
  const clip: PolicyLoss.ClipOptions = { ...reduce, epsClipLow: a.eps_clip_low, epsClipHigh: a.eps_clip_high }
  switch (a.policy_loss_type) {
    case "regular":
      return (inputs) => PolicyLoss.regular(inputs, clip)
    case "dual_clip":
      return (inputs) => PolicyLoss.dualClip(inputs, { ...clip, clipRatioC: a.clip_ratio_c })
    case "gspo":
      return (inputs) => PolicyLoss.gspo(inputs, clip)
    case "cispo":
      return (inputs) =>
        PolicyLoss.cispo(inputs, {
          ...reduce,
          cispoEpsClipLow: a.cispo_eps_clip_low,
          cispoEpsClipHigh: a.cispo_eps_clip_high
        })
    case "rollout_is":
      return (inputs) => PolicyLoss.rolloutIs(inputs, clip)
    case "sapo":
      return (inputs) => PolicyLoss.sapo(inputs, { ...reduce, tauPos: a.sapo.tau_pos, tauNeg: a.sapo.tau_neg })
    case "dppo":
      return (inputs) =>
        PolicyLoss.dppo(inputs, {
          ...reduce,
          dppoType: a.dppo.dppo_type,
          deltaLow: a.dppo.delta_low,
          deltaHigh: a.dppo.delta_high
        })
  }
}

/**
 * Token log-probs of a micro-batch under `model`, no gradient, as plain arrays (downloaded asynchronously). With
 * `adapters`, the forward runs with the model's adapters swapped for those (an empty map: the frozen base alone).
 */
const logProbsOf = async (
  model: Transformer.Transformer,
  batch: TrainingBatch.Batch,
  temperature: number,
  adapters?: ReadonlyMap<string, Transformer.Adapter>
): Promise<Array<Array<number>>> => {
  const forward = () =>
    LogProbs.ofSequences(model, { ids: batch.ids, attentionMask: batch.attentionMask }, { temperature }).logprobs // [b, L]
  const logprobs = adapters === undefined ? forward() : Lora.withAdapters(model, adapters, forward)
  return logprobs.array().finally(() => logprobs.dispose())
}

/**
 * The reference policy of the KL terms. Full fine-tuning: a second model (`frozen`: the initial weights; `ema`: their
 * moving average). LoRA: the same model with other adapters — none (`frozen`: the base, exactly what the policy was
 * before training moved B from zero) or a moving average of the adapters (`ema`); no second copy of the base.
 */
type Reference =
  | { readonly kind: "model"; readonly model: Transformer.Transformer }
  | { readonly kind: "adapters"; readonly adapters: ReadonlyMap<string, Transformer.Adapter> }

/** sg(x): the value of x with a zero gradient (torch's `.detach()`). */
const stopGradient = <T extends tf.Tensor>(x: T): T =>
  tf.customGrad((..._args: Array<tf.Tensor | tf.GradSaveFunc>) => ({
    value: tf.clone(x),
    gradFunc: () => tf.zerosLike(x)
  }))(x) as T

/** The trainer's loss terms, from the config. */
export interface LossOptions {
  readonly algorithm: AlgorithmConfig // the KL and entropy terms
  readonly policyLoss: (inputs: PolicyLoss.Inputs) => PolicyLoss.Output // policyLoss(algorithm, …)
  readonly temperature: number
  readonly checkpoint?: boolean // trainer.gradient_checkpointing: recompute each layer's activations in the backward
}

/** One micro-batch of a mini-batch: its rows, their π_old / π_ref log-probs, and its share of the mini-batch. */
export interface MicroBatch {
  readonly micro: TrainingBatch.Batch
  /** log π_old per row ([b][≥ L]), or "current": π_old is the policy being trained (no update yet), sg(log π_θ) */
  readonly old: Array<Array<number>> | "current"
  readonly ref: Array<Array<number>> | undefined // log π_ref per row, when a KL loss is on
  readonly share: number // of the mini-batch's loss: tokens (token_mean) or sequences
  readonly klShare: number // of the mini-batch's sequences
  /** With `old: "current"`, also return sg(log π_θ) as arrays (the π_old of later epochs). */
  readonly readOld?: boolean
}

/**
 * ∇ [ share·L_policy(π_θ, π_old, Â, π_rollout) + klShare·β_KL·L_KL − share·β_H·H ] of one micro-batch, with its
 * diagnostics. The caller owns `value`, `grads` and `metrics` (Diagnostics.read / dispose). Async only for `readOld`:
 * sg(log π_θ) is downloaded after the gradient pass.
 */
export const microBatchGrads = async (
  model: Transformer.Transformer,
  variables: Array<tf.Variable>,
  options: LossOptions,
  input: MicroBatch
): Promise<{
  readonly value: tf.Scalar
  readonly grads: tf.NamedTensorMap
  readonly metrics: Record<string, tf.Scalar>
  readonly old?: Array<Array<number>>
}> => {
  const algo = options.algorithm
  const { micro, share, klShare } = input
  const L = micro.length
  const rows = (x: Array<Array<number>>) => x.map((r) => r.slice(0, L))
  // sg(log π_θ) [b, L], kept past the gradient pass's tidy: owned here until read below
  let old: tf.Tensor2D | undefined
  const result = Diagnostics.variableGrads(
    () =>
      tf.tidy(() => {
        const lossMask = tf.tensor2d(micro.lossMask) // [b, L]
        const { logprobs, entropy } = LogProbs.ofSequences(
          model,
          {
            ids: micro.ids,
            attentionMask: micro.attentionMask,
            training: true,
            ...(options.checkpoint === true ? { checkpoint: true } : {})
          },
          { temperature: options.temperature, entropy: true }
        ) // [b, L]
        const oldLogProbs = input.old === "current" ? stopGradient(logprobs) : tf.tensor2d(rows(input.old)) // [b, L]
        if (input.old === "current" && input.readOld === true) old = tf.keep(oldLogProbs)
        // a replayed success is trained as if sampled now: its π_rollout is π_old (ExperienceReplay)
        const sampled = tf.tensor2d(micro.rolloutLogProbs) // [b, L]
        const rolloutLogProbs = micro.replayed.some((r) => r === 1)
          ? tf.where(
              tf.tensor2d(
                micro.replayed.map((r) => new Array<boolean>(L).fill(r === 1)),
                [micro.replayed.length, L],
                "bool"
              ),
              oldLogProbs,
              sampled
            )
          : sampled
        const out = options.policyLoss({
          logProbs: logprobs,
          oldLogProbs,
          advantages: tf.tensor2d(micro.advantages),
          lossMask,
          rolloutLogProbs
        })
        const entropyMean = Reduction.maskedMean(entropy!, lossMask)
        let total: tf.Scalar = tf.mul(out.loss, share)
        const metrics: Record<string, tf.Scalar> = {
          policyLoss: out.loss,
          clipRatio: out.metrics.clipRatio,
          approxKl: out.metrics.approxKl,
          entropy: entropyMean,
          // mean |log π_old − log π_rollout|: what the engine's behaviour log-probs differ by from the trainer's
          ...(out.metrics["logprobDiffAbs"] === undefined ? {} : { logprobDiffAbs: out.metrics["logprobDiffAbs"] })
        }
        if (input.ref !== undefined && algo.use_kl_loss) {
          const klLoss = Kl.loss(logprobs, tf.tensor2d(rows(input.ref)), lossMask, algo.kl_estimator_type)
          total = tf.add(total, tf.mul(klLoss, algo.kl_loss_coef * klShare))
          metrics["klLoss"] = klLoss
        }
        if (algo.use_entropy_loss) total = tf.sub(total, tf.mul(entropyMean, algo.entropy_loss_coef * share))
        return { loss: total, metrics }
      }),
    variables
  )
  if (old === undefined) return result
  const kept = old
  return { ...result, old: await kept.array().finally(() => kept.dispose()) }
}

const chunks = (n: number, size: number): Array<[number, number]> =>
  Array.from({ length: Math.ceil(n / size) }, (_, i) => [i * size, Math.min(n, (i + 1) * size)])

/** θ_ref ← d·θ_ref + (1 − d)·θ, tensor by tensor: the whole model, or a LoRA run's adapters. */
const emaInto = (reference: Reference, model: Transformer.Transformer, decay: number): void => {
  const ema = (r: tf.Variable, p: tf.Tensor) => tf.tidy(() => r.assign(tf.add(tf.mul(r, decay), tf.mul(p, 1 - decay))))
  if (reference.kind === "model") {
    for (const [name, r] of reference.model.params) ema(r, model.params.get(name)!)
    return
  }
  for (const [module, r] of reference.adapters) {
    const p = model.adapters.get(module)!
    ema(r.a, p.a)
    ema(r.b, p.b)
  }
}

/** Frozen copies of the model's adapters (the EMA reference of a LoRA run starts as the policy's own). */
const copyAdapters = (model: Transformer.Transformer): Map<string, Transformer.Adapter> =>
  new Map(
    [...model.adapters].map(([module, a]) => [
      module,
      { ...a, a: tf.variable(a.a, false, `${a.a.name}.ref`), b: tf.variable(a.b, false, `${a.b.name}.ref`) }
    ])
  )

const mean = (xs: ReadonlyArray<number>) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length)

// biome-ignore lint/complexity/noExcessiveLinesPerFunction: a make closure is its service's class (400 lines at most)
export const make = Effect.fn("PolicyTrainer.make")(function* (options: Options) {
  const { model } = yield* PolicyModel
  const t = options.trainer
  const algo = t.algorithm
  const derived = options.derived
  const needsRef = algo.use_kl_loss || algo.use_kl_in_reward
  if (needsRef && t.ref === "none") {
    return yield* new ConfigError({
      path: "trainer.ref",
      message: "use_kl_loss / use_kl_in_reward need a reference policy: set trainer.ref to frozen or ema"
    })
  }
  const variables = Transformer.trainableVariables(model)
  const optimizer = yield* Effect.acquireRelease(
    Effect.sync(() => Optimizer.make(variables, t.optimizer)),
    (o) => Effect.sync(() => o.dispose())
  )
  const lora = model.adapters.size > 0
  // the policy's weights are downloaded before the reference exists: nothing to free if the read fails
  const initialWeights =
    needsRef && !lora ? yield* Effect.promise(() => Snapshot.fromModel(model, PolicyVersion.initial)) : undefined
  const reference: Reference | undefined = !needsRef
    ? undefined
    : initialWeights === undefined
      ? t.ref === "frozen"
        ? { kind: "adapters", adapters: new Map() }
        : yield* Effect.acquireRelease(
            Effect.sync((): Reference => ({ kind: "adapters", adapters: copyAdapters(model) })),
            (ref) =>
              Effect.sync(() => {
                if (ref.kind === "adapters") for (const a of ref.adapters.values()) tf.dispose([a.a, a.b])
              })
          )
      : yield* Effect.acquireRelease(
          Effect.sync((): Reference => {
            const ref = Transformer.init(model.config, 0)
            Snapshot.load(ref, initialWeights)
            return { kind: "model", model: ref }
          }),
          (ref) => Effect.sync(() => ref.kind === "model" && Transformer.dispose(ref.model))
        )
  const critic =
    algo.advantage_estimator === "gae"
      ? yield* Effect.acquireRelease(
          Effect.promise(() => Critic.make(model, t.critic_optimizer)),
          (c) => Effect.sync(() => Critic.dispose(c))
        )
      : undefined
  const replayConfig: ExperienceReplay.Config | undefined = t.experience_replay.enabled
    ? { successThreshold: t.experience_replay.success_threshold, maxPrompts: t.experience_replay.max_prompts }
    : undefined
  let replayBuffer: ExperienceReplay.Buffer = new Map()
  const stepRef = yield* Ref.make(0)
  const versionRef = yield* Ref.make(PolicyVersion.initial)
  let klController: Kl.Controller =
    algo.kl_ctrl === "fixed"
      ? Kl.fixed(algo.kl_coef)
      : Kl.adaptive({ initKlCoef: algo.kl_coef, target: algo.kl_target, horizon: algo.kl_horizon })
  const batchOptions: TrainingBatch.Options = {
    estimator: algo.advantage_estimator,
    normByStd: algo.grpo_norm_by_std,
    gamma: algo.gamma,
    lambd: algo.lambd,
    advantageBatchNormalize: algo.advantage_batch_normalize,
    zeroRewardOnNonStop: algo.zero_reward_on_non_stop,
    overlongFiltering: algo.apply_overlong_filtering,
    zeroVarianceFilter: algo.zero_variance_filter,
    maxSequenceLength: derived.maxSequenceLength,
    ...(t.distillation === undefined
      ? {}
      : { distillation: { coef: t.distillation.kl_coef, rewards: t.distillation.rewards } })
  }

  const lossOptions: LossOptions = {
    algorithm: algo,
    policyLoss: policyLoss(algo, derived.lossMaxSeqLen),
    temperature: derived.temperature,
    checkpoint: t.gradient_checkpointing
  }
  /** Lets the event loop run (I/O, other fibers) between two synchronous pieces of a step. */
  const breathe = Effect.yieldNow

  /** f over the micro-batches of rows [from, to) of `x`, rows padded back to x.length, yielding before each. */
  const perMicro = Effect.fnUntraced(function* (
    x: TrainingBatch.Batch,
    from: number,
    to: number,
    f: (m: TrainingBatch.Batch) => Promise<Array<Array<number>>>
  ) {
    const out: Array<Array<number>> = []
    for (const [a, b] of chunks(to - from, t.micro_train_batch_size)) {
      yield* breathe
      for (const r of yield* Effect.promise(() => f(TrainingBatch.slice(x, from + a, from + b))))
        out.push([...r, ...new Array<number>(x.length - r.length).fill(0)])
    }
    return out
  })

  /**
   * One optimizer step over rows [from, to) of `batch`; returns the step's diagnostics. `old[i]` undefined: row i's
   * π_old is the current policy (see 4.); filled in with sg(log π_θ) when `keepOld` (later epochs read it).
   */
  const miniBatchUpdate = Effect.fnUntraced(function* (
    batch: TrainingBatch.Batch,
    old: Array<Array<number> | undefined>,
    ref: Array<Array<number>> | undefined,
    from: number,
    to: number,
    step: number,
    keepOld: boolean
  ) {
    const miniTokens = Math.max(1, TrainingBatch.tokenCount(TrainingBatch.slice(batch, from, to)))
    const miniRows = to - from
    // the summed gradients cross the yields below: owned here until the optimizer has applied them
    let accumulated: tf.NamedTensorMap | undefined
    const release = Effect.sync(() => {
      if (accumulated !== undefined) tf.dispose(accumulated)
      accumulated = undefined
    })
    const collected: Array<Record<string, number>> = []
    return yield* Effect.gen(function* () {
      for (const [a, b] of chunks(miniRows, t.micro_train_batch_size).map(([x, y]) => [from + x, from + y] as const)) {
        const micro = TrainingBatch.slice(batch, a, b)
        const share =
          algo.loss_reduction === "token_mean" ? TrainingBatch.tokenCount(micro) / miniTokens : (b - a) / miniRows
        if (share === 0) continue
        const current = old.slice(a, b).every((r) => r === undefined)
        if (!current && old.slice(a, b).some((r) => r === undefined)) throw new Error(`rows ${a}..${b}: partial π_old`)
        yield* breathe
        const result = yield* Effect.promise(() =>
          microBatchGrads(model, variables, lossOptions, {
            micro,
            old: current ? "current" : (old.slice(a, b) as Array<Array<number>>),
            ref: ref?.slice(a, b),
            share,
            klShare: (b - a) / miniRows,
            readOld: current && keepOld
          })
        )
        // the grads join the sum before the reads below await: `release` owns them from here, even on a bad loss
        accumulated = Optimizer.accumulate(accumulated, result.grads)
        const values = yield* Effect.promise(() => Diagnostics.read(result.metrics))
        const lossValue = (yield* Effect.promise(() => result.value.data().finally(() => result.value.dispose())))[0]!
        if (!Number.isFinite(lossValue)) {
          throw new Error(`non-finite loss (${lossValue}) at step ${step}, rows ${a}..${b}: ${JSON.stringify(values)}`)
        }
        result.old?.forEach((r, i) => {
          old[a + i] = [...r, ...new Array<number>(batch.length - r.length).fill(0)]
        })
        collected.push(values)
      }
      if (accumulated === undefined) return {}
      yield* breathe
      const lr = Optimizer.learningRate(t.optimizer, optimizer.step(), options.totalSteps * updatesPerStep())
      const summed = accumulated
      const gradNorm = yield* Effect.promise(() => optimizer.apply(summed, lr))
      yield* release
      const values: Record<string, number> = {
        "loss/policy": mean(collected.map((m) => m["policyLoss"]!)),
        "policy/clip_frac": mean(collected.map((m) => m["clipRatio"]!)),
        "policy/approx_kl": mean(collected.map((m) => m["approxKl"]!)),
        policy_entropy: mean(collected.map((m) => m["entropy"]!)),
        ...(collected[0]?.["klLoss"] === undefined ? {} : { "loss/kl": mean(collected.map((m) => m["klLoss"]!)) }),
        ...(collected[0]?.["logprobDiffAbs"] === undefined
          ? {}
          : { "policy/rollout_logprob_abs_diff": mean(collected.map((m) => m["logprobDiffAbs"]!)) }),
        "policy/grad_norm": gradNorm,
        "policy/lr": lr
      }
      return values
    }).pipe(Effect.ensuring(release))
  })

  const updatesPerStep = () => t.update_epochs_per_batch * derived.miniBatchesPerStep

  const step = Effect.fn("PolicyTrainer.step")(function* (sampled: ReadonlyArray<TrajectoryGroup>) {
    const started = yield* Clock.currentTimeMillis
    const stepIndex = (yield* Ref.get(stepRef)) + 1
    const trajectories = sampled.flatMap((g) => g.trajectories)
    const replayed =
      replayConfig === undefined ? undefined : ExperienceReplay.apply(replayBuffer, sampled, replayConfig)
    const groups = replayed?.groups ?? sampled
    // GAE reads the critic's values on the batch's own layout: lay the batch out once, score it, then build it.
    const layout =
      critic === undefined ? undefined : TrainingBatch.build(groups, { ...batchOptions, estimator: "grpo" })
    const criticValues =
      critic === undefined || layout === undefined
        ? undefined
        : yield* perMicro(layout, 0, layout.ids.length, (m) => Critic.values(critic, m))
    const withValues = criticValues === undefined ? batchOptions : { ...batchOptions, values: criticValues }
    let batch = TrainingBatch.build(groups, withValues)
    if (batch.truncated.length > 0) {
      const ids = [...new Set(batch.truncated)].join(", ")
      yield* Effect.logWarning(
        `step ${stepIndex}: ${batch.truncated.length} training row(s) longer than ${derived.maxSequenceLength} ` +
          `tokens were cut to it and masked (${ids}); the generator should have ended them overlong`
      )
    }
    const rows = batch.ids.length
    const miniRows = derived.sequencesPerMiniBatch
    const miniBatches = chunks(rows, miniRows)
    /** log-probs of every row under `m`, by mini-batch then micro-batch (the shapes the updates run on) */
    const passOver = (firstRow: number, ref?: Reference) =>
      Effect.map(
        Effect.forEach(
          miniBatches.flatMap(([a, b]) => (b <= firstRow ? [] : [[Math.max(a, firstRow), b] as const])),
          ([a, b]) =>
            perMicro(batch, a, b, (x) =>
              ref === undefined
                ? logProbsOf(model, x, derived.temperature)
                : ref.kind === "model"
                  ? logProbsOf(ref.model, x, derived.temperature)
                  : logProbsOf(model, x, derived.temperature, ref.adapters)
            )
        ),
        (parts) => parts.flat()
      )
    const metrics: Record<string, number> = {}
    const updates: Array<Record<string, number>> = []
    if (rows > 0 && TrainingBatch.tokenCount(batch) > 0) {
      const refLogProbs = reference === undefined ? undefined : yield* passOver(0, reference)
      let old: Array<Array<number> | undefined> | undefined
      if (refLogProbs !== undefined && algo.use_kl_in_reward) {
        const old0 = yield* passOver(0)
        const kl = yield* Effect.promise(() => Kl.estimateAsync(algo.kl_estimator_type, old0, refLogProbs))
        batch = TrainingBatch.build(groups, { ...withValues, klPenalty: { kl, coef: klController.value } })
        const observed = mean(
          kl.map((r, i) => {
            const m = batch.lossMask[i]!
            const n = m.reduce((x, y) => x + y, 0)
            return r.reduce((sum, v, j) => sum + v * m[j]!, 0) / Math.max(1, n)
          })
        )
        klController = Kl.update(klController, observed, rows)
        metrics["reward/kl_coef"] = klController.value
        metrics["reward/kl"] = observed
        old = old0 // same rows and weights: π_old's pass is this one
      }
      if (old === undefined) {
        // no update has happened yet: the first mini-batch's π_old is π_θ itself (see 4.), the other rows need the pass
        const dropout = [...model.adapters.values()].some((a) => a.dropout > 0)
        const skip = dropout ? 0 : miniBatches[0]![1]
        old = [...new Array<undefined>(skip).fill(undefined), ...(yield* passOver(skip))]
      }
      for (let epoch = 0; epoch < t.update_epochs_per_batch; epoch++) {
        for (const [a, b] of miniBatches) {
          const values = yield* miniBatchUpdate(batch, old, refLogProbs, a, b, stepIndex, t.update_epochs_per_batch > 1)
          if (Object.keys(values).length > 0) {
            yield* Ref.update(versionRef, PolicyVersion.next)
            if (critic !== undefined) {
              yield* breathe
              const lr = Optimizer.learningRate(
                t.critic_optimizer,
                critic.optimizer.step(),
                options.totalSteps * updatesPerStep()
              )
              Object.assign(
                values,
                yield* Effect.promise(() =>
                  Critic.update(critic, batch, a, b, {
                    valueClip: algo.value_clip,
                    lr,
                    microBatch: t.micro_train_batch_size,
                    checkpoint: t.gradient_checkpointing
                  })
                )
              )
            }
            updates.push(values)
          }
        }
      }
      if (reference !== undefined && t.ref === "ema" && stepIndex % t.ref_update_interval === 0) {
        emaInto(reference, model, t.ref_ema_decay)
      }
    }
    for (const key of new Set(updates.flatMap((u) => Object.keys(u))))
      metrics[key] = mean(updates.map((u) => u[key] ?? 0))
    const rewards = trajectories.map((x) => x.reward)
    const passed = sampled.filter((g) => g.trajectories.some((x) => x.reward > 0)).length
    const responseLengths = trajectories.map((x) => x.responseIds.length)
    Object.assign(metrics, {
      "reward/avg_raw_reward": mean(rewards),
      "reward/avg_pass_at_n": sampled.length === 0 ? 0 : passed / sampled.length,
      "generate/avg_num_tokens": mean(responseLengths),
      "generate/max_num_tokens": Math.max(0, ...responseLengths),
      "generate/avg_num_turns": mean(trajectories.map((x) => x.turns.length)),
      "generate/overlong_rate": mean(trajectories.map((x) => (x.stopReason === "overlong" ? 1 : 0))),
      "generate/error_rate": mean(trajectories.map((x) => (x.stopReason === "error" ? 1 : 0))),
      "trainer/rows": rows,
      "trainer/loss_tokens": TrainingBatch.tokenCount(batch),
      "trainer/dropped_groups": batch.droppedGroups,
      "trainer/optimizer_updates": updates.length,
      "timing/train_step": ((yield* Clock.currentTimeMillis) - started) / 1000
    })
    if (replayed !== undefined) {
      metrics["replay/injected_groups"] = replayed.injected
      metrics["replay/buffer_prompts"] = replayBuffer.size
    }
    yield* Ref.set(stepRef, stepIndex)
    const result: StepResult = { step: stepIndex, version: yield* Ref.get(versionRef), metrics }
    return result
  }, Effect.uninterruptible)

  return Trainer.of({
    step,
    version: Ref.get(versionRef),
    // a LoRA run syncs its adapter alone: engines hold the base already
    snapshot: Effect.flatMap(Ref.get(versionRef), (v) =>
      Effect.promise(() => (lora ? Snapshot.adapterOf(model, v) : Snapshot.fromModel(model, v)))
    ),
    state: Effect.gen(function* () {
      const state: TrainerState = {
        step: yield* Ref.get(stepRef),
        version: yield* Ref.get(versionRef),
        optimizer: yield* Effect.promise(() => optimizer.state()),
        klCoef: klController.value,
        ...(replayConfig === undefined ? {} : { replay: ExperienceReplay.entries(replayBuffer) })
      }
      return state
    }),
    restore: (state) =>
      Effect.gen(function* () {
        optimizer.restore(state.optimizer)
        replayBuffer = ExperienceReplay.fromEntries(state.replay ?? [])
        yield* Ref.set(stepRef, state.step)
        yield* Ref.set(versionRef, PolicyVersion.make(state.version))
      })
  })
})

export const layer = (options: Options): Layer.Layer<Trainer, ConfigError, PolicyModel> =>
  Layer.effect(Trainer, make(options))
