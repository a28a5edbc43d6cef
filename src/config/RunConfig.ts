/**
 * The whole run, one Schema made of per-component Schemas. Decoded once (RunConfigLoader); each service receives
 * only its slice. Cross-field rules live here, derived values in `derive`, and the keys that moved in `movedKeys`.
 */
import { Effect, Schema, SchemaGetter } from "effect"
import { BackendConfig } from "./BackendConfig.ts"
import { EnvironmentConfig } from "./EnvironmentConfig.ts"
import { withDefault } from "./Field.ts"
import { GeneratorConfig } from "./GeneratorConfig.ts"
import * as KeyTree from "./KeyTree.ts"
import { ModelConfig } from "./ModelConfig.ts"
import { PipelineConfig } from "./PipelineConfig.ts"
import { SftConfig } from "./SftConfig.ts"
import { CheckpointConfig, DataConfig, LoggingConfig } from "./StoreConfig.ts"
import { TokenizerConfig } from "./TokenizerConfig.ts"
import { TrainerConfig } from "./TrainerConfig.ts"

const Sections = Schema.Struct({
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
      c.generator.engine.url !== undefined ||
      c.generator.engine.urls !== undefined || {
        path: ["generator", "engine", "url"],
        issue: "engine.kind remote needs engine.url (or engine.urls)"
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
      !c.generator.engine.chat ||
      c.generator.engine.kind === "remote" || {
        path: ["generator", "engine", "chat"],
        issue: `generator.engine.chat needs engine.kind remote (a server's /v1/chat/completions), not ${c.generator.engine.kind}`
      }
  ),
  Schema.makeFilter(
    (c) =>
      !c.generator.engine.chat ||
      c.trainer.algorithm.advantage_estimator !== "gae" || {
        path: ["generator", "engine", "chat"],
        issue:
          "generator.engine.chat may train a trajectory step-wise (when the server's template rewrites its history), which gae cannot"
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.trainer.algorithm.advantage_estimator !== "gae" ||
      !c.generator.step_wise || {
        path: ["trainer", "algorithm", "advantage_estimator"],
        issue:
          "gae needs per-token values over one sequence: it cannot train step-wise trajectories (generator.step_wise)"
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.trainer.distillation === undefined ||
      !(c.generator.step_wise || c.generator.engine.chat || c.generator.agent !== undefined) || {
        path: ["trainer", "distillation"],
        issue:
          "trainer.distillation scores one token sequence per trajectory: it cannot train step-wise trajectories (generator.step_wise, engine.chat, agent)"
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.trainer.distillation === undefined ||
      c.pipeline.rollouts === "local" || {
        path: ["trainer", "distillation"],
        issue:
          "trainer.distillation scores groups beside the trainer: use pipeline.rollouts local (cluster runners hold no teacher)"
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.generator.agent === undefined ||
      c.pipeline.rollouts === "local" || {
        path: ["generator", "agent"],
        issue:
          "generator.agent runs its programs beside the trainer: use pipeline.rollouts local (cluster runners do not host the agent gateway)"
      }
  ),
  Schema.makeFilter(
    (c) =>
      c.generator.agent === undefined ||
      c.trainer.algorithm.advantage_estimator !== "gae" || {
        path: ["generator", "agent"],
        issue:
          "generator.agent may train a trajectory step-wise (when the program rewrites its history), which gae cannot"
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

/**
 * Keys that moved, read at their old path too until it is removed: decoding moves the value to the new path and logs
 * a warning naming both (once per decode: the resolved config a run writes holds only the new path). Where both are
 * set, the new one wins.
 */
export const movedKeys: ReadonlyArray<KeyTree.MovedKey> = [
  // the training batch's filters, consumed by the trainer only
  { from: "generator.zero_reward_on_non_stop", to: "trainer.algorithm.zero_reward_on_non_stop" },
  { from: "generator.apply_overlong_filtering", to: "trainer.algorithm.apply_overlong_filtering" },
  { from: "generator.zero_variance_filter", to: "trainer.algorithm.zero_variance_filter" }
]

const warnMoved = (found: ReadonlyArray<KeyTree.Moved>) =>
  Effect.forEach(
    found,
    ({ key, ignored }) =>
      Effect.logWarning(
        ignored
          ? `config key ${key.from} is deprecated and ignored: ${key.to} is set too (remove ${key.from})`
          : `config key ${key.from} is deprecated: it moved to ${key.to} (read from ${key.from} this time)`
      ),
    { discard: true }
  )

/** The run config: YAML sections in (moved keys taken to their new paths first), the decoded sections out. */
export const RunConfig = Schema.Record(Schema.String, Schema.Unknown).pipe(
  Schema.decodeTo(Sections, {
    decode: SchemaGetter.transformEffect((raw: { readonly [x: string]: unknown }) => {
      const { raw: moved, found } = KeyTree.moveKeys(raw, movedKeys)
      return Effect.as(warnMoved(found), moved as typeof Sections.Encoded)
    }),
    encode: SchemaGetter.passthrough({ strict: false })
  }),
  Schema.annotate({ [KeyTree.movedKeysAnnotation]: movedKeys })
)
export type RunConfig = typeof RunConfig.Type
export type RunConfigEncoded = typeof Sections.Encoded

/**
 * Values derived from several sections, computed here only. A service that needs one gets it from here with its own
 * section (the trainer: `trainer` and `derive(c)`), never by reading another section.
 */
export const derive = (c: RunConfig) => ({
  sequencesPerStep: c.trainer.train_batch_size * c.generator.n_samples_per_prompt,
  miniBatchesPerStep: c.trainer.train_batch_size / c.trainer.policy_mini_batch_size, // an integer: TrainerConfig's check
  sequencesPerMiniBatch: c.trainer.policy_mini_batch_size * c.generator.n_samples_per_prompt,
  // τ of the trainer's log-probs: the sampler's, so that ρ = 1 on-policy; greedy sampling (τ = 0) trains at τ = 1
  temperature: c.generator.sampling.temperature > 0 ? c.generator.sampling.temperature : 1,
  // the longest row the generator hands over (AgentLoop ends a trajectory `overlong` there): TrainingBatch's guard
  maxSequenceLength: c.generator.max_input_length,
  // seq_mean_token_sum_norm's constant divisor (Dr. GRPO): trainer.algorithm.max_seq_len, else the longest row
  lossMaxSeqLen: c.trainer.algorithm.max_seq_len ?? c.generator.max_input_length
})
export type Derived = ReturnType<typeof derive>
