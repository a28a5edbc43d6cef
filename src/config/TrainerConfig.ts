import { Schema } from "effect"
import { NonNegative, NonNegativeInt, Positive, PositiveInt, Probability, SecretRef, withDefault } from "./Field.ts"

/** SkyRL's `advantage_estimator` values: every estimator `Advantages.compute` dispatches on (its `Estimator` type). */
export const advantageEstimators = ["grpo", "rloo", "reinforce++", "gae", "maxrl"] as const

/** SkyRL's `kl_estimator_type` values: every estimator `Kl.approx` dispatches on (its `Estimator` type). */
export const klEstimators = ["k1", "k2", "k3", "abs"] as const

/** SkyRL's `policy_loss_type` values: every loss `PolicyLoss` implements (its `Name` type). */
export const policyLosses = ["regular", "dual_clip", "gspo", "cispo", "rollout_is", "sapo", "dppo"] as const

/** SkyRL's `trainer.algorithm.sapo`: the soft gate's temperatures (arXiv:2511.20347; the paper's values). */
export const SapoConfig = Schema.Struct({
  tau_pos: Positive.pipe(withDefault(1)), // where Â > 0
  tau_neg: Positive.pipe(withDefault(1.05)) // where Â ≤ 0
})
export type SapoConfig = typeof SapoConfig.Type

/** SkyRL's `trainer.algorithm.dppo`: which divergence drops a token, and its thresholds (arXiv:2602.04879). */
export const DppoConfig = Schema.Struct({
  // binary_tv: total variation; binary_kl: KL
  dppo_type: Schema.Literals(["binary_tv", "binary_kl"]).pipe(withDefault("binary_tv")),
  delta_low: NonNegative.pipe(withDefault(0.2)), // where Â < 0 (SkyRL suggests 0.2 for binary_tv, 0.05 for binary_kl)
  delta_high: NonNegative.pipe(withDefault(0.2)) // where Â > 0
})
export type DppoConfig = typeof DppoConfig.Type

/**
 * SkyRL's `trainer.algorithm` keys, same names and meanings; the only home of their defaults (the losses and
 * estimators take fully-resolved options).
 */
export const AlgorithmConfig = Schema.Struct({
  advantage_estimator: Schema.Literals(advantageEstimators).pipe(withDefault("grpo")),
  grpo_norm_by_std: Schema.Boolean.pipe(withDefault(true)), // false = Dr. GRPO
  // normalise advantages over the whole training batch (SkyRL's _normalize_advantages)
  advantage_batch_normalize: Schema.Boolean.pipe(withDefault(false)),
  gamma: Probability.pipe(withDefault(1)), // discount (reinforce++, gae)
  lambd: Probability.pipe(withDefault(1)), // GAE's λ
  value_clip: Positive.pipe(withDefault(0.2)), // PPO value clip of the GAE critic
  policy_loss_type: Schema.Literals(policyLosses).pipe(withDefault("regular")),
  // PPO clip: the ratio is clipped to [1 − eps_clip_low, 1 + eps_clip_high]
  eps_clip_low: NonNegative.pipe(withDefault(0.2)),
  eps_clip_high: NonNegative.pipe(withDefault(0.2)), // the upper side of the PPO clip
  clip_ratio_c: Schema.Finite.check(Schema.isGreaterThan(1)).pipe(withDefault(3)), // dual clip bound, > 1
  cispo_eps_clip_low: NonNegative.pipe(withDefault(1)), // offsets from 1 (SkyRL): IS weight clipped to [1 − low, 1 + high]
  cispo_eps_clip_high: NonNegative.pipe(withDefault(4)), // see cispo_eps_clip_low
  sapo: SapoConfig.pipe(withDefault({})), // policy_loss_type sapo
  dppo: DppoConfig.pipe(withDefault({})), // policy_loss_type dppo
  // token_mean: over every token; sequence_mean: within each sequence, then over sequences; seq_mean_token_sum_norm:
  // each sequence's token sum over a constant (max_seq_len; Dr. GRPO)
  loss_reduction: Schema.Literals(["token_mean", "sequence_mean", "seq_mean_token_sum_norm"]).pipe(
    withDefault("token_mean")
  ),
  max_seq_len: Schema.optionalKey(PositiveInt), // seq_mean_token_sum_norm divisor; absent: RunConfig.derive's
  // add kl_loss_coef × KL(π ‖ π_ref) to the loss (needs trainer.ref)
  use_kl_loss: Schema.Boolean.pipe(withDefault(false)),
  kl_loss_coef: NonNegative.pipe(withDefault(0.001)), // the KL loss term's coefficient
  // take kl_coef × KL(π ‖ π_ref) off the rewards (needs trainer.ref)
  use_kl_in_reward: Schema.Boolean.pipe(withDefault(false)),
  kl_coef: NonNegative.pipe(withDefault(0.001)), // KL-in-reward coefficient (initial, for the adaptive controller)
  // fixed: kl_coef throughout; adaptive: kl_coef steered so that the KL tracks kl_target (Ziegler et al. 2019)
  kl_ctrl: Schema.Literals(["fixed", "adaptive"]).pipe(withDefault("fixed")),
  kl_target: Positive.pipe(withDefault(0.1)), // adaptive: the KL to track
  kl_horizon: PositiveInt.pipe(withDefault(10000)), // adaptive: how fast the coefficient moves (steps)
  kl_estimator_type: Schema.Literals(klEstimators).pipe(withDefault("k3")),
  // subtract entropy_loss_coef × entropy from the loss (an entropy bonus)
  use_entropy_loss: Schema.Boolean.pipe(withDefault(false)),
  entropy_loss_coef: NonNegative.pipe(withDefault(0.01)), // the entropy bonus's coefficient
  off_policy_correction: Schema.Literals(["none", "token", "sequence"]).pipe(withDefault("token")), // TIS level
  tis_imp_ratio_cap: Positive.pipe(withDefault(2)), // TIS: the trainer-to-sampler probability ratio is capped at this
  // Filters applied when the training batch is built (TrainingBatch.ts). Their old generator.* paths are still read,
  // with a warning (RunConfig.movedKeys). SkyRL has zero_variance_filter here too.
  zero_reward_on_non_stop: Schema.Boolean.pipe(withDefault(false)), // reward 0 for a trajectory not ended `stop`
  apply_overlong_filtering: Schema.Boolean.pipe(withDefault(true)), // zero the loss mask of overlong/length
  zero_variance_filter: Schema.Boolean.pipe(withDefault(false)) // drop groups whose rewards are all equal
})
export type AlgorithmConfig = typeof AlgorithmConfig.Type

/** AdamW with global-norm gradient clipping, and a learning rate that warms up, then stays or decays. */
export const OptimizerConfig = Schema.Struct({
  lr: Positive.pipe(withDefault(1e-5)), // the peak learning rate
  weight_decay: NonNegative.pipe(withDefault(0.01)), // AdamW's decoupled weight decay
  beta1: Probability.pipe(withDefault(0.9)), // Adam's first-moment decay
  beta2: Probability.pipe(withDefault(0.999)), // Adam's second-moment decay
  eps: Positive.pipe(withDefault(1e-8)), // Adam's ε
  max_grad_norm: NonNegative.pipe(withDefault(1)), // 0 = no clipping
  warmup_steps: NonNegativeInt.pipe(withDefault(0)), // linear warmup to lr over this many steps
  // after warmup: lr throughout, or a cosine decay to lr × min_lr_ratio at the last step
  scheduler: Schema.Literals(["constant", "cosine"]).pipe(withDefault("constant")),
  min_lr_ratio: Probability.pipe(withDefault(0.1)) // cosine: the last step's lr as a fraction of lr
})
export type OptimizerConfig = typeof OptimizerConfig.Type

/** ExperienceReplay (trainer/ExperienceReplay.ts): rare successes kept per prompt and added to all-failed groups. */
export const ExperienceReplayConfig = Schema.Struct({
  enabled: Schema.Boolean.pipe(withDefault(false)), // keep rare successes and add them to all-failed groups
  success_threshold: Schema.Finite.pipe(withDefault(1)), // a sample with reward ≥ this is a success
  max_prompts: PositiveInt.pipe(withDefault(256)) // buffer capacity in distinct prompts; the oldest entry goes first
})
export type ExperienceReplayConfig = typeof ExperienceReplayConfig.Type

/**
 * On-policy distillation (trainer.distillation): the teacher scores every token the policy sampled, and each loss token
 * gets the advantage −kl_coef · (log π_rollout − log π_teacher) (tinker-cookbook's per-token reverse KL), alone or added
 * to the RL advantage.
 */
export const DistillationConfig = Schema.Struct({
  // a checkpoint directory (HF layout, any architecture the loader reads) or a Hugging Face cache name, or the URL of an
  // OpenAI-compatible server that answers vLLM's `prompt_logprobs` on /v1/completions (vLLM, SGLang, our `serve`);
  // it must share the policy's tokenizer
  teacher: Schema.NonEmptyString,
  kl_coef: Positive.pipe(withDefault(1)), // β of the per-token advantage −β · (log π_rollout − log π_teacher)
  // false: the KL term is the whole advantage (no reward used); true: it is added to the RL advantage (mixed)
  rewards: Schema.Boolean.pipe(withDefault(false)),
  // teacher log-probs kept in memory, by token sequence (identical samples of a group are scored once)
  cache_size: NonNegativeInt.pipe(withDefault(4096)),
  model: Schema.optionalKey(Schema.NonEmptyString), // a URL teacher's served model (default: the first /v1/models lists)
  api_key: Schema.optionalKey(SecretRef), // a URL teacher's key, sent as Authorization: Bearer
  max_concurrency: PositiveInt.pipe(withDefault(8)), // a URL teacher: requests in flight at once
  http_retries: NonNegativeInt.pipe(withDefault(3)), // a URL teacher: retries of a request that failed retryably
  timeout_seconds: Positive.pipe(withDefault(60)), // a URL teacher: the timeout of one request
  price_per_token: NonNegative.pipe(withDefault(0)) // distill/teacher_cost = tokens scored × this
})
export type DistillationConfig = typeof DistillationConfig.Type

/**
 * How the policy learns from its groups: the algorithm, the optimizers, batch sizes, the KL reference, evaluation and
 * when to stop.
 */
export const TrainerConfig = Schema.Struct({
  algorithm: AlgorithmConfig.pipe(withDefault({})),
  optimizer: OptimizerConfig.pipe(withDefault({})), // the policy's optimizer
  critic_optimizer: OptimizerConfig.pipe(withDefault({ lr: 5e-6 })), // the GAE critic's optimizer
  experience_replay: ExperienceReplayConfig.pipe(withDefault({})),
  distillation: Schema.optionalKey(DistillationConfig), // learn from a teacher's per-token log-probs (on-policy distillation)
  train_batch_size: PositiveInt.pipe(withDefault(8)), // prompts (groups) per training step
  policy_mini_batch_size: PositiveInt.pipe(withDefault(8)), // prompts per optimizer step within a training step
  micro_train_batch_size: PositiveInt.pipe(withDefault(8)), // sequences per forward/backward (grad accumulation)
  // activation recompute: the backward pass recomputes each decoder layer's forward from its saved input instead of
  // keeping its activations (policy and critic): much less memory, about 1/3 more compute per training forward/backward
  gradient_checkpointing: Schema.Boolean.pipe(withDefault(false)),
  update_epochs_per_batch: PositiveInt.pipe(withDefault(1)), // PPO epochs
  epochs: PositiveInt.pipe(withDefault(1)), // passes over the training data
  max_steps: Schema.optionalKey(PositiveInt), // stop after this many training steps
  // stop after the first step that ends this many seconds after training began (the eval before it not counted), then
  // checkpoint and evaluate as after the last step: a wall-clock budget, e.g. the quickstart's 10 minutes on a slow box
  max_train_seconds: Schema.optionalKey(Positive),
  // the KL reference: frozen = the starting policy, ema = a moving average of the policy (ref_ema_decay every
  // ref_update_interval steps). With LoRA neither is a second model: frozen is the base (the same forward with the
  // adapters off), ema a moving average of the adapters
  ref: Schema.Literals(["none", "frozen", "ema"]).pipe(withDefault("none")),
  ref_ema_decay: Probability.pipe(withDefault(0.99)), // ema: the average's decay at each update
  ref_update_interval: PositiveInt.pipe(withDefault(1)), // ema: steps between updates
  eval_interval: NonNegativeInt.pipe(withDefault(0)), // 0 = only before and after training
  eval_before_train: Schema.Boolean.pipe(withDefault(true)), // evaluate the held-out prompts before the first step
  // an extra_info key (e.g. family): each eval also scores the held-out rows of every value of that key on its own,
  // as eval/<data_source>/<key>=<value>/avg_score and pass_at_n
  eval_group_by: Schema.optionalKey(Schema.NonEmptyString),
  seed: NonNegativeInt.pipe(withDefault(42)) // the order of the training prompts
}).check(
  Schema.makeFilter(
    (t) =>
      t.train_batch_size % t.policy_mini_batch_size === 0 || {
        path: ["policy_mini_batch_size"],
        issue: `train_batch_size (${t.train_batch_size}) must be a multiple of policy_mini_batch_size`
      }
  )
)
export type TrainerConfig = typeof TrainerConfig.Type
