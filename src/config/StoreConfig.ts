import { Schema } from "effect"
import { NonNegativeInt, PositiveInt, withDefault } from "./Field.ts"

export const CheckpointConfig = Schema.Struct({
  interval: NonNegativeInt.pipe(withDefault(0)), // steps between checkpoints; 0 = only at the end
  keep_n: PositiveInt.pipe(withDefault(2)),
  resume: Schema.optionalKey(Schema.NonEmptyString) // "latest" or a checkpoint directory
})
export type CheckpointConfig = typeof CheckpointConfig.Type

export const LoggingConfig = Schema.Struct({
  run_dir: Schema.NonEmptyString.pipe(withDefault("runs/latest")),
  level: Schema.Literals(["Debug", "Info", "Warn", "Error"]).pipe(withDefault("Info")),
  progress: Schema.Boolean.pipe(withDefault(true)),
  record_episodes: Schema.Boolean.pipe(withDefault(true)),
  report: Schema.Boolean.pipe(withDefault(true))
})
export type LoggingConfig = typeof LoggingConfig.Type

export const DataConfig = Schema.Struct({
  train: Schema.Array(Schema.NonEmptyString).pipe(withDefault([])), // .json, .jsonl or .parquet files
  val: Schema.Array(Schema.NonEmptyString).pipe(withDefault([])),
  shuffle: Schema.Boolean.pipe(withDefault(true)),
  // keep only the rows whose extra_info.<key> is one of the values (all keys must match), e.g. {family: [unit_sum]};
  // applied to train and val before max_prompts / max_eval_prompts
  include: Schema.optionalKey(
    Schema.Record(Schema.NonEmptyString, Schema.Array(Schema.Union([Schema.String, Schema.Number, Schema.Boolean])))
  ),
  max_prompts: Schema.optionalKey(PositiveInt), // use only the first N training prompts
  max_eval_prompts: Schema.optionalKey(PositiveInt) // evaluate on the first N held-out prompts
})
export type DataConfig = typeof DataConfig.Type
