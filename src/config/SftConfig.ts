import { Schema } from "effect"
import { NonNegativeInt, PositiveInt, withDefault } from "./Field.ts"
import { OptimizerConfig } from "./TrainerConfig.ts"

/**
 * Supervised fine-tuning (the `sft` command): next-token cross-entropy on chat rows, on the assistant turns only
 * (`loss_on: assistant`) or on every token (`all`). Rows are `{ messages: [...] }`, or SkyRL rows whose `prompt` is
 * followed by `response` / `extra_info.response` / `extra_info.answer` as the assistant turn (SftDataset.ts).
 */
export const SftConfig = Schema.Struct({
  data: Schema.Array(Schema.NonEmptyString).pipe(withDefault([])), // training files: .json, .jsonl or .parquet
  eval_data: Schema.Array(Schema.NonEmptyString).pipe(withDefault([])), // held-out files for eval/loss
  epochs: PositiveInt.pipe(withDefault(1)), // passes over the data (ignored when max_steps is set)
  max_steps: Schema.optionalKey(PositiveInt), // optimizer steps; overrides epochs, as HF's max_steps does
  batch_size: PositiveInt.pipe(withDefault(8)), // sequences per optimizer step
  micro_batch_size: PositiveInt.pipe(withDefault(8)), // sequences per forward/backward; gradients accumulate
  gradient_checkpointing: Schema.Boolean.pipe(withDefault(false)), // as trainer.gradient_checkpointing
  max_length: PositiveInt.pipe(withDefault(1024)), // tokens per sequence; longer rows are cut at the end
  // as trainer.optimizer, with lr 2e-5 and a cosine schedule
  optimizer: OptimizerConfig.pipe(withDefault({ lr: 2e-5, warmup_steps: 0, scheduler: "cosine" })),
  // assistant: the assistant turns only; all: every token
  loss_on: Schema.Literals(["assistant", "all"]).pipe(withDefault("assistant")),
  shuffle: Schema.Boolean.pipe(withDefault(true)), // reshuffled every epoch from `seed`
  log_interval: PositiveInt.pipe(withDefault(10)), // steps between progress lines and metrics.jsonl records
  eval_interval: NonNegativeInt.pipe(withDefault(0)), // steps between eval losses; 0 = only at the end
  save_interval: NonNegativeInt.pipe(withDefault(0)), // steps between checkpoints; 0 = only at the end
  // where checkpoints (step-N/, latest) and metrics.jsonl go
  output_dir: Schema.NonEmptyString.pipe(withDefault("runs/sft")),
  seed: NonNegativeInt.pipe(withDefault(42)) // the example order, and LoRA adapters' initialisation
})
export type SftConfig = typeof SftConfig.Type
