/**
 * The distillation teacher a run's `trainer.distillation` names: its checkpoint loaded on the active backend beside
 * the policy (whose tokenizer it must share), freed when the run ends, and the Generator's scorer over it
 * (inference/Teacher.ts).
 */
import { Effect, Schema } from "effect"
import { ModelConfig } from "../config/ModelConfig.ts"
import * as RunConfig from "../config/RunConfig.ts"
import { CheckpointError, ConfigError } from "../domain/Errors.ts"
import * as Teacher from "../inference/Teacher.ts"
import * as HfCache from "../model/HfCache.ts"
import * as HfConfig from "../model/ModelConfig.ts"
import * as Transformer from "../model/Transformer.ts"
import * as PolicyModel from "../trainer/PolicyModel.ts"

/** The teacher's group scorer, or undefined when the config sets no `trainer.distillation`. */
export const fromConfig = (c: RunConfig.RunConfig) =>
  Effect.gen(function* () {
    const d = c.trainer.distillation
    if (d === undefined) return undefined
    const policy = yield* PolicyModel.PolicyModel
    const dir = yield* Effect.try({
      try: () => HfCache.resolve(d.teacher),
      catch: (e) => new CheckpointError({ path: d.teacher, message: e instanceof Error ? e.message : String(e) })
    })
    const model = yield* Effect.acquireRelease(
      PolicyModel.load(Schema.decodeUnknownSync(ModelConfig)({ path: dir })),
      (m) => Effect.sync(() => Transformer.dispose(m))
    )
    const studentDir = c.tokenizer.path ?? (c.model.path === undefined ? undefined : HfCache.resolve(c.model.path))
    const mismatch = Teacher.tokenizerMismatch(
      { dir, vocabSize: model.config.vocabSize },
      { dir: studentDir, vocabSize: policy.model.config.vocabSize }
    )
    if (mismatch !== undefined) {
      return yield* new ConfigError({
        path: "trainer.distillation.teacher",
        message: `the teacher must share the policy's tokenizer: ${mismatch}`
      })
    }
    yield* Effect.logInfo(
      `distillation teacher: ${d.teacher} (${model.config.architecture}, ` +
        `${HfConfig.parameterCount(model.config).toLocaleString("en-US")} parameters), kl_coef ${d.kl_coef}, ` +
        (d.rewards ? "added to the RL advantage" : "no rewards")
    )
    const teacher = Teacher.local(model, { source: d.teacher, temperature: RunConfig.derive(c).temperature })
    return Teacher.scorer(teacher, d.cache_size)
  })
