/**
 * The distillation teacher a run's `trainer.distillation` names, and the Generator's scorer over it
 * (inference/Teacher.ts): a checkpoint loaded on the active backend beside the policy (whose tokenizer it must share),
 * freed when the run ends, or an OpenAI-compatible server reached over HTTP (a URL: its tokenizer cannot be checked
 * here; token ids outside its vocabulary fail as bad requests, which end those trajectories `error`).
 */
import { Duration, Effect, Redacted, Schema } from "effect"
import { FetchHttpClient, HttpClient } from "effect/http"
import { ModelConfig } from "../config/ModelConfig.ts"
import type * as RunConfig from "../config/RunConfig.ts"
import type { DistillationConfig } from "../config/TrainerConfig.ts"
import { CheckpointError, ConfigError } from "../domain/Errors.ts"
import * as ChatClient from "../env/ChatClient.ts"
import * as RemoteWire from "../inference/RemoteWire.ts"
import * as Teacher from "../inference/Teacher.ts"
import * as HfCache from "../model/HfCache.ts"
import * as HfConfig from "../model/ModelConfig.ts"
import * as Transformer from "../model/Transformer.ts"
import * as PolicyModel from "../trainer/PolicyModel.ts"
import * as WeightUpload from "../weights/WeightUpload.ts"

/** How the teacher's KL term trains, for the start-up line. */
const settingsOf = (d: DistillationConfig) =>
  `kl_coef ${d.kl_coef}, ${d.rewards ? "added to the RL advantage" : "no rewards"}`

/** A URL teacher: the OpenAI-compatible server `d.teacher` names, its model the one given or the first it lists. */
const remote = (d: DistillationConfig) =>
  Effect.gen(function* () {
    const key = yield* ChatClient.apiKey(d.api_key).pipe(
      Effect.mapError((e) => new ConfigError({ path: "trainer.distillation.api_key", message: e.message }))
    )
    const apiKey = key === undefined ? undefined : Redacted.value(key)
    const client = yield* HttpClient.HttpClient
    const base = WeightUpload.baseUrl(d.teacher)
    const model =
      d.model ??
      (yield* RemoteWire.servedModel(client, base, apiKey).pipe(
        Effect.mapError(
          (e) => new ConfigError({ path: "trainer.distillation.teacher", message: `the teacher server: ${e.message}` })
        )
      ))
    yield* Effect.logInfo(`distillation teacher: ${model} at ${base}, ${settingsOf(d)}`)
    const connection = { client, apiKey, timeout: Duration.seconds(d.timeout_seconds), maxRetries: d.http_retries }
    return Teacher.remote(connection, { base, model, source: d.teacher, concurrency: d.max_concurrency })
  }).pipe(Effect.provide(FetchHttpClient.layer))

/** A checkpoint teacher, loaded on the active backend beside the policy, whose tokenizer it must share. */
const local = (c: RunConfig.RunConfig, d: DistillationConfig) =>
  Effect.gen(function* () {
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
        `${HfConfig.parameterCount(model.config).toLocaleString("en-US")} parameters), ${settingsOf(d)}`
    )
    // the teacher's own distribution (τ 1), as a server's prompt_logprobs give it (vLLM's are the raw logits')
    return Teacher.local(model, { source: d.teacher, temperature: 1 })
  })

/** The teacher's group scorer, or undefined when the config sets no `trainer.distillation`. */
export const fromConfig = (c: RunConfig.RunConfig) =>
  Effect.gen(function* () {
    const d = c.trainer.distillation
    if (d === undefined) return undefined
    const teacher = /^https?:\/\//.test(d.teacher) ? yield* remote(d) : yield* local(c, d)
    return Teacher.scorer(teacher, { cacheSize: d.cache_size, pricePerToken: d.price_per_token })
  })
