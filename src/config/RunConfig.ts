/**
 * The whole run, one Schema made of per-component Schemas. Decoded once (RunConfigLoader); each service receives
 * only its slice. Cross-field rules live here, derived values in `derive`.
 */
import { Schema } from "effect"
import { BackendConfig } from "./BackendConfig.ts"
import { EnvironmentConfig } from "./EnvironmentConfig.ts"
import { withDefault } from "./Field.ts"
import { GeneratorConfig } from "./GeneratorConfig.ts"
import { ModelConfig } from "./ModelConfig.ts"
import { PipelineConfig } from "./PipelineConfig.ts"
import { SftConfig } from "./SftConfig.ts"
import { CheckpointConfig, DataConfig, LoggingConfig } from "./StoreConfig.ts"
import { TokenizerConfig } from "./TokenizerConfig.ts"
import { TrainerConfig } from "./TrainerConfig.ts"

export const RunConfig = Schema.Struct({
  backend: BackendConfig.pipe(withDefault({})),
  model: ModelConfig,
  tokenizer: TokenizerConfig.pipe(withDefault({})),
  generator: GeneratorConfig.pipe(withDefault({})),
  environment: EnvironmentConfig.pipe(withDefault({})),
  trainer: TrainerConfig.pipe(withDefault({})),
  pipeline: PipelineConfig.pipe(withDefault({})),
  checkpoint: CheckpointConfig.pipe(withDefault({})),
  logging: LoggingConfig.pipe(withDefault({})),
  data: DataConfig.pipe(withDefault({})),
  sft: SftConfig.pipe(withDefault({}))
}).check(
  Schema.makeFilter(
    (c) =>
      c.generator.max_generate_length < c.generator.max_input_length || {
        path: ["generator", "max_generate_length"],
        issue: `max_generate_length (${c.generator.max_generate_length}) must be below max_input_length (${c.generator.max_input_length})`
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.generator.engine.kind !== "remote" ||
      c.generator.engine.url !== undefined || {
        path: ["generator", "engine", "url"],
        issue: "engine.kind remote needs engine.url"
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.trainer.algorithm.advantage_estimator === "gae" ||
      c.generator.n_samples_per_prompt > 1 ||
      c.trainer.algorithm.advantage_estimator === "reinforce++" || {
        path: ["generator", "n_samples_per_prompt"],
        issue: `${c.trainer.algorithm.advantage_estimator} compares samples within a group: n_samples_per_prompt must be ≥ 2`
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.model.init === undefined ||
      c.tokenizer.kind === "byte" ||
      c.tokenizer.path !== undefined || {
        path: ["tokenizer", "kind"],
        issue: "a random model (model.init) has no tokenizer files: use tokenizer.kind byte or set tokenizer.path"
      }
  )
)
export type RunConfig = typeof RunConfig.Type
export type RunConfigEncoded = typeof RunConfig.Encoded

/** Values derived from several fields, computed in one place. */
export const derive = (c: RunConfig) => ({
  sequencesPerStep: c.trainer.train_batch_size * c.generator.n_samples_per_prompt,
  miniBatchesPerStep: c.trainer.train_batch_size / c.trainer.policy_mini_batch_size
})
