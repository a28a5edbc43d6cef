/**
 * A trajectory is exactly what the policy saw and produced, token for token, never re-tokenised.
 *
 * Layout: `promptIds` is the rendered prompt (chat template applied once). `responseIds` is everything after it:
 * generated tokens (lossMask 1) interleaved with template and tool-observation tokens (lossMask 0).
 * `rolloutLogprobs[i]` is the behaviour log-prob of `responseIds[i]` (0 where lossMask is 0). Each turn's reward
 * sits on that turn's last generated token (`turns[k].end - 1`).
 *
 * A `TrajectoryGroup` is the n samples of one prompt (the GRPO group).
 */
import { Schema } from "effect"
import { GroupJudgement } from "./LlmCall.ts"
import { PolicyVersion } from "./PolicyVersion.ts"
import { ToolCallRecord } from "./ToolCall.ts"

export const StopReason = Schema.Literals(["stop", "length", "overlong", "max_turns", "env_done", "error"])
export type StopReason = typeof StopReason.Type

export const FinishReason = Schema.Literals(["stop", "length"])
export type FinishReason = typeof FinishReason.Type

export const Turn = Schema.Struct({
  start: Schema.Int, // index into responseIds of the turn's first generated token
  end: Schema.Int, // one past its last generated token
  reward: Schema.Finite,
  finishReason: FinishReason,
  policyVersionFirst: PolicyVersion, // weights that produced the first token of the turn
  policyVersionLast: PolicyVersion, // and the last (differs when weights were swapped mid-turn)
  toolCalls: Schema.Array(ToolCallRecord),
  parseError: Schema.optionalKey(Schema.String),
  observationTokens: Schema.Int, // template + observation tokens appended after this turn (lossMask 0)
  // each move of the turn's call to another inference replica (one that failed or was taken out), with the reason
  retries: Schema.optionalKey(Schema.Array(Schema.String)),
  llmMs: Schema.Finite,
  envMs: Schema.Finite
})
export type Turn = typeof Turn.Type

/**
 * One training row of a step-wise trajectory: the full context the policy saw at that turn (the chat template
 * re-rendered over the whole history) and what it generated. Used when a template does not simply extend the
 * history (e.g. it strips earlier thinking), so the turns cannot share one token sequence.
 */
export const Step = Schema.Struct({
  promptIds: Schema.Array(Schema.Int),
  responseIds: Schema.Array(Schema.Int),
  rolloutLogprobs: Schema.Array(Schema.Finite)
})
export type Step = typeof Step.Type

export const Trajectory = Schema.Struct({
  id: Schema.String,
  promptUid: Schema.String,
  sample: Schema.Int, // index within the group
  promptIds: Schema.Array(Schema.Int),
  responseIds: Schema.Array(Schema.Int),
  lossMask: Schema.Array(Schema.Literals([0, 1])),
  rolloutLogprobs: Schema.Array(Schema.Finite),
  turns: Schema.Array(Turn),
  reward: Schema.Finite, // sum of the turns' rewards
  stopReason: StopReason,
  error: Schema.optionalKey(Schema.String),
  envMetrics: Schema.Record(Schema.String, Schema.Finite),
  // step-wise mode: one training row per turn (then responseIds holds only the generated tokens, all lossMask 1)
  steps: Schema.optionalKey(Schema.Array(Step)),
  // a success of an earlier step the trainer added to this group (ExperienceReplay); never in the episode log
  replay: Schema.optionalKey(Schema.Boolean),
  // trainer.distillation: the teacher's log-prob of each response token (0 where lossMask is 0), of its own
  // distribution (τ 1); recorded, so a replay needs no teacher
  teacherLogprobs: Schema.optionalKey(Schema.Array(Schema.Finite))
})
export type Trajectory = typeof Trajectory.Type

/** What scoring a group with the distillation teacher took (trainer.distillation). */
export const TeacherUsage = Schema.Struct({
  calls: Schema.Int, // sequences the teacher scored
  tokens: Schema.Int, // tokens of those sequences (prompt and response)
  cost: Schema.optionalKey(Schema.Finite), // tokens × trainer.distillation.price_per_token
  cached: Schema.Int, // trajectories answered with no call of their own (identical samples, earlier groups)
  failed: Schema.Int, // trajectories the teacher could not score: they ended `error`
  ms: Schema.Finite // wall time of the group's scoring
})
export type TeacherUsage = typeof TeacherUsage.Type

export const TrajectoryGroup = Schema.Struct({
  promptUid: Schema.String,
  cursor: Schema.Int, // position of the prompt in the dataset order of this run
  dataSource: Schema.String,
  envClass: Schema.String,
  // earlier attempts of the group lost with their rollout runner (pipeline.rollouts: cluster); absent when none
  retried: Schema.optionalKey(Schema.Int),
  trajectories: Schema.Array(Trajectory),
  // an LLM judge's verdict on the group (reward_spec.method judge): its scores are in the trajectories' rewards
  judge: Schema.optionalKey(GroupJudgement),
  // the distillation teacher's work on the group (trainer.distillation); its log-probs are in the trajectories
  teacher: Schema.optionalKey(TeacherUsage),
  // the group's span (`rollout.group`) when the run exports traces (logging.backends: otlp): find it in the tracer
  trace: Schema.optionalKey(Schema.Struct({ traceId: Schema.String, spanId: Schema.String }))
})
export type TrajectoryGroup = typeof TrajectoryGroup.Type

/** Token-level rewards: each turn's reward on its last generated token. */
export const tokenRewards = (t: Trajectory): Array<number> => {
  const out = new Array<number>(t.responseIds.length).fill(0)
  for (const turn of t.turns) if (turn.end > turn.start) out[turn.end - 1]! += turn.reward
  return out
}

/** Oldest and newest policy versions that produced any token of the trajectory. */
export const versionSpan = (t: Trajectory): { readonly first: number; readonly last: number } => {
  if (t.turns.length === 0) return { first: 0, last: 0 }
  let first = Number.POSITIVE_INFINITY
  let last = 0
  for (const turn of t.turns) {
    first = Math.min(first, turn.policyVersionFirst)
    last = Math.max(last, turn.policyVersionLast)
  }
  return { first, last }
}
