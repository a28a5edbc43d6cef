/**
 * One dataset row in SkyRL's format: `data_source`, `env_class`, `prompt` (chat messages), `reward_spec`
 * ({ method, ground_truth }) and `extra_info`. Keys beyond these are kept in `extras` and handed to the
 * environment, as SkyRL does with `env_extras`. `uid` identifies the prompt across a run (resume, consumed.jsonl);
 * readers derive it from the file and row when the row has none.
 */
import { Schema } from "effect"
import { Message } from "./Message.ts"

export const RewardSpec = Schema.Struct({
  method: Schema.String, // "rule" / "judge" (built in: rule rewards, the group LLM judge) or a registered function's name
  ground_truth: Schema.optionalKey(Schema.Unknown),
  rubric: Schema.optionalKey(Schema.String) // method "judge": what the judge scores by (else environment.judge.rubric)
})
export type RewardSpec = typeof RewardSpec.Type

export const PromptRow = Schema.Struct({
  uid: Schema.optionalKey(Schema.String),
  data_source: Schema.String,
  env_class: Schema.String,
  prompt: Schema.Array(Message).check(Schema.isMinLength(1)),
  reward_spec: Schema.optionalKey(RewardSpec),
  extra_info: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown))
})
export type PromptRow = typeof PromptRow.Type & { readonly extras?: Readonly<Record<string, unknown>> }

/** The keys of a row that are SkyRL's own; everything else is an env extra. */
export const knownKeys: ReadonlySet<string> = new Set([
  "uid",
  "data_source",
  "env_class",
  "prompt",
  "reward_spec",
  "extra_info"
])
