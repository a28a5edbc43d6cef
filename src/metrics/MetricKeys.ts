/**
 * Every metric name a run writes to `metrics.jsonl`, with what it means: the one place producers (trainer, training
 * loop, sources, evaluator, environments, MCP client) and the report take names from, so a typo is a type error
 * instead of an empty chart. Names follow SkyRL's where SkyRL has one (`reward/avg_raw_reward`, `policy/approx_kl`, …).
 *
 * Three families are open: `env/<name>` (whatever an environment counts per episode, averaged over the step's
 * trajectories; the bundled environments' names are listed), `reward/<part>` (the parts of a rule reward) and
 * `eval/<data source>[/<key>=<value>]/<avg_score|pass_at_n>`.
 */

export const train = {
  // rewards and outcomes of the step's trajectories
  "reward/avg_raw_reward": "mean reward over the step's trajectories",
  "reward/avg_pass_at_n": "share of the step's groups with at least one trajectory scoring > 0",
  "reward/kl": "mean per-token KL to the reference policy on loss tokens, charged as a reward penalty",
  "reward/kl_coef": "the KL penalty's coefficient in force (kl_ctrl: adaptive moves it)",
  "reward/rule": "the rule-based reward of finished episodes (before per-turn shaping); its parts are reward/<part>",
  "generate/avg_num_tokens": "mean response tokens per trajectory",
  "generate/max_num_tokens": "longest response in the step, in tokens",
  "generate/avg_num_turns": "mean turns per trajectory",
  "generate/overlong_rate": "share of trajectories that hit max_input_length or max_generate_length (ended overlong)",
  "generate/error_rate": "share of trajectories that ended with an environment or engine error",
  "generate/parse_failure_rate":
    "turns whose tool call could not be parsed, over all turns (Σ parse failures / Σ turns)",
  // the environments' per-episode counters, averaged over trajectories
  "env/turns": "turns the environment saw per episode",
  "env/tool_calls": "tool calls per episode",
  "env/tool_errors": "tool calls that ended in an error (tool, transport or timeout) per episode",
  "env/tool_error_rate": "tool errors over all tool calls of the step (Σ errors / Σ calls)",
  "env/parse_failures": "turns per episode whose tool call could not be parsed",
  "env/tool_ms": "milliseconds spent in tool calls per episode",
  "env/answered": "share of episodes that gave a final answer",
  "env/reward": "the environment's own reward before any shaping",
  // the LLM judge (reward_spec.method judge): sums over the step's judged groups
  "judge/groups": "groups the judge scored (or fell back on) in the step",
  "judge/calls": "chat calls the judge made (a rejected answer is asked again: a group may take several)",
  "judge/cache_hits": "groups whose verdict came from the judge cache, with no call",
  "judge/malformed": "judge answers that were not the scores JSON asked for",
  "judge/out_of_range": "judge answers with a score outside [0, 1] or not a number",
  "judge/missing": "judge answers that left a trajectory out or scored one that does not exist",
  "judge/failed_groups":
    "groups with no usable verdict after environment.judge.max_attempts (or an endpoint failure): each trajectory got fallback_score",
  "judge/prompt_tokens": "prompt tokens of the step's judge calls (the endpoint's usage)",
  "judge/completion_tokens": "completion tokens of the step's judge calls",
  "judge/cost": "the judge calls' tokens at environment.judge.prices",
  "judge/score_mean": "mean score the judge paid over the step's judged trajectories",
  "reward/judge": "the judge's score of finished trajectories, averaged (also in judge/score_mean)",
  // on-policy distillation (trainer.distillation): the teacher's work on the step's groups
  "distill/teacher_kl":
    "mean over loss tokens of log π_rollout − log π_teacher: the sampled reverse KL from the teacher per token (falls as the policy learns)",
  "distill/teacher_calls": "sequences the teacher scored for the step's groups",
  "distill/teacher_tokens": "tokens of those sequences (prompt and response)",
  "distill/teacher_cost": "those tokens at trainer.distillation.price_per_token",
  "distill/teacher_cached":
    "trajectories whose teacher log-probs came from the cache (identical samples, earlier groups)",
  "distill/teacher_failed": "trajectories the teacher could not score: they ended error and were not trained on",
  "distill/teacher_s": "seconds the teacher spent scoring the step's groups",
  // the policy update
  "loss/policy": "policy-gradient loss (mean over mini-batches)",
  "loss/kl": "KL loss term against the reference policy (use_kl_loss)",
  "policy/approx_kl": "approximate KL between the policy before and after the step (k3 on the sampled tokens)",
  "policy/clip_frac": "share of tokens whose ratio was clipped",
  "policy/rollout_logprob_abs_diff":
    "mean |log π_old − log π_rollout| over loss tokens: how far the engine's behaviour log-probs are from the trainer's (nonzero for a quantised llamacpp export; trainer.algorithm.off_policy_correction reweights by it)",
  "policy/grad_norm": "global gradient norm before clipping",
  "policy/lr": "learning rate of the last update",
  policy_entropy: "mean token entropy of the policy on the step's responses",
  "critic/value_loss": "value-function loss (gae)",
  "critic/values_mean": "mean predicted value",
  "critic/values_clipfrac": "share of values clipped by value_clip",
  "critic/grad_norm": "critic gradient norm before clipping",
  "trainer/policy_version": "the policy version published after the step (optimizer updates so far)",
  "trainer/rows": "training rows in the step (one per trajectory, or per turn step-wise)",
  "trainer/loss_tokens": "tokens that carry loss",
  "trainer/dropped_groups": "groups dropped before training by the zero-variance filter (all rewards equal)",
  "trainer/optimizer_updates": "optimizer updates the step applied (PPO epochs × mini-batches)",
  "replay/injected_groups": "earlier successes added to the step by experience replay",
  "replay/buffer_prompts": "prompts in the experience-replay buffer",
  // the async source
  "async/staleness_mean": "mean steps between the weights that sampled a group and the weights it trains",
  "async/staleness_max": "the step's worst staleness (never over max_staleness_steps)",
  "async/version_lag_max": "the step's largest gap in policy versions between sampling and training",
  "async/queue_depth": "groups generated beyond the step, waiting",
  "async/running": "groups being generated when the step ended",
  "async/trainer_idle_fraction": "share of the step the trainer waited for groups",
  "async/generator_idle_fraction": "share of the step generation fibers waited for admission",
  // tool servers (counters over the run so far)
  "mcp/calls": "tool calls sent to MCP servers",
  "mcp/errors": "tool calls that failed after retries",
  "mcp/retries": "tool calls retried (idempotent tools after a crash or timeout)",
  "mcp/restarts": "MCP server restarts",
  "mcp/connects": "MCP connections opened",
  // time
  "timing/generate": "seconds generating the step's groups (sync)",
  "timing/wait_for_groups": "seconds the trainer waited for the step's groups (async)",
  "timing/train_step": "seconds in Trainer.step",
  "timing/weight_sync": "seconds publishing the new weights",
  "sync/bytes":
    "bytes the step's weight sync moved: the whole model, a LoRA run's adapter alone, 0 when the engine shares the trainer's tensors",
  "timing/train_and_sync": "seconds training and publishing",
  "timing/step": "seconds from the start of the step's batch to its metrics line",
  "timing/eval": "seconds an evaluation took (on eval lines)",
  // the trainer process's memory after the step (Node's process.memoryUsage)
  "memory/rss_mb":
    "MB resident: the trainer process with its worker threads (its MCP servers are processes of their own)",
  "memory/heap_used_mb": "MB of JavaScript objects on V8's heaps",
  "memory/external_mb":
    "MB outside V8's heap held by JavaScript objects: typed arrays' buffers, wasm memory, native handles",
  "memory/array_buffers_mb": "MB of ArrayBuffers and SharedArrayBuffers (part of memory/external_mb)",
  // SFT: one line per logged step; the window is the steps since the previous line
  epoch: "SFT passes over the training data so far, fractional (HF Trainer's name)",
  "train/loss": "SFT cross-entropy per loss token, token-weighted over the window's steps",
  "train/loss_tokens": "SFT tokens that carry loss in the window's steps",
  "train/grad_norm": "SFT global gradient norm of the line's step, before clipping",
  "train/lr": "SFT learning rate of the line's step",
  "train/tokens_per_second": "SFT real (non-padding) tokens per second of the window's training time, eval excluded",
  "eval/loss": "SFT held-out cross-entropy per loss token, evaluated after the line's step"
} as const

/** Derived by the report from the lines above, not written by a run. */
export const derived = {
  "throughput/trajectories_per_s": "trajectories per second of step time",
  "throughput/tokens_per_s": "sampled tokens per second of generation time"
} as const

/** Set by Metrics for the tracking backends (otlp, prometheus) beside the recorded values; not in metrics.jsonl. */
export const tracking = {
  "trainer/step": "the step of the last record (a training step, or the step an evaluation ran at)"
} as const

export const evalStats = {
  avg_score: "mean reward over all held-out samples",
  pass_at_n: "share of held-out prompts with at least one sample scoring > 0"
} as const

export type TrainKey = keyof typeof train
export type EnvKey = `env/${string}`
export type EvalKey = `eval/${string}`
export type RewardKey = `reward/${string}`

/** Metric values as producers write them: known names, plus the open env/, reward/ and eval/ families. */
export type Values = { readonly [K in TrainKey]?: number } & { readonly [K in EnvKey | EvalKey | RewardKey]?: number }

/** `eval/<source>/<stat>` (source may carry a `/<key>=<value>` subgroup). */
export const evalKey = (source: string, stat: keyof typeof evalStats): EvalKey => `eval/${source}/${stat}`

/** What a name means, for any name a run writes (undefined for an unknown one). */
export const meaning = (key: string): string | undefined => {
  if (key in train) return train[key as TrainKey]
  if (key in derived) return derived[key as keyof typeof derived]
  if (key in tracking) return tracking[key as keyof typeof tracking]
  const stat = /^eval\/(.+)\/(avg_score|pass_at_n)$/.exec(key)
  if (stat !== null) return `${evalStats[stat[2] as keyof typeof evalStats]} (${stat[1]})`
  if (key.startsWith("env/")) return "an environment's own per-episode counter, averaged over trajectories"
  if (key.startsWith("reward/")) return "a part of the rule reward, averaged over finished episodes"
  return undefined
}

/** The report's charts: a title and the names (or a pattern over them) it draws. */
export interface Chart {
  readonly title: string
  readonly keys?: ReadonlyArray<TrainKey | keyof typeof derived>
  readonly match?: string // a RegExp source, over the names of the chart's source
  readonly source?: "eval"
  readonly optional?: boolean // drawn only when a name matches
}

export const charts: ReadonlyArray<Chart> = [
  { title: "Reward (mean over training trajectories)", keys: ["reward/avg_raw_reward"] },
  { title: "pass@n (training groups)", keys: ["reward/avg_pass_at_n"] },
  {
    title: "Held-out success (eval avg_score, pass@n)",
    source: "eval",
    match: "^eval\\/[^=]+\\/(avg_score|pass_at_n)$"
  },
  // trainer.eval_group_by: one line per value of the key (e.g. per toolbox family)
  { title: "Held-out avg_score per group", source: "eval", match: "^eval\\/.+=.+\\/avg_score$", optional: true },
  { title: "KL (approx., policy vs behaviour)", keys: ["policy/approx_kl", "reward/kl", "loss/kl"] },
  { title: "Entropy", keys: ["policy_entropy"] },
  { title: "Response length (tokens)", keys: ["generate/avg_num_tokens", "generate/max_num_tokens"] },
  { title: "Turns per trajectory", keys: ["generate/avg_num_turns"] },
  {
    title: "Trajectory endings and tool errors",
    keys: ["generate/overlong_rate", "generate/error_rate", "generate/parse_failure_rate", "env/tool_error_rate"],
    optional: true
  },
  {
    title: "Staleness (policy versions behind)",
    keys: ["async/staleness_mean", "async/staleness_max"],
    optional: true
  },
  {
    title: "LLM judge: rejected answers, failed groups, cache hits",
    keys: ["judge/malformed", "judge/out_of_range", "judge/missing", "judge/failed_groups", "judge/cache_hits"],
    optional: true
  },
  {
    title: "Distillation: reverse KL from the teacher per token",
    keys: ["distill/teacher_kl"],
    optional: true
  },
  { title: "Throughput: trajectories / s", keys: ["throughput/trajectories_per_s"] },
  { title: "Throughput: sampled tokens / s", keys: ["throughput/tokens_per_s"] },
  { title: "Policy loss", keys: ["loss/policy"] },
  { title: "Clip fraction", keys: ["policy/clip_frac"] },
  { title: "Gradient norm", keys: ["policy/grad_norm"] },
  { title: "Learning rate", keys: ["policy/lr"] },
  {
    title: "Time per step (s)",
    keys: ["timing/step", "timing/generate", "timing/wait_for_groups", "timing/train_step", "timing/weight_sync"]
  },
  {
    title: "Trainer memory (MB)",
    keys: ["memory/rss_mb", "memory/heap_used_mb", "memory/external_mb", "memory/array_buffers_mb"],
    optional: true
  }
]
