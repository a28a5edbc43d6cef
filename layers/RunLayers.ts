/**
 * The composition root for runs (`train`, `eval`): the only place that turns a decoded RunConfig into Layers.
 *
 *   backend (initialised first: tfjs backends are process-global)
 *   └ PolicyModel (model.path | model.init | a checkpoint to resume)
 *     ├ Tokenizer (byte | hf), LocalEngine over the policy's own variables, InProcess weight sync
 *     ├ McpClient (config's servers) → ToolIo (live | record | replay) → EnvRegistry + mcp_tool env
 *     ├ Generator (AgentLoop), PolicyTrainer
 *     └ EpisodeLog, Metrics, Checkpointer (under the run directory)
 */
import { NodeServices } from "@effect/platform-node"
import { Effect, Layer, Stream } from "effect"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import type { RunConfig } from "../src/config/RunConfig.ts"
import type { ToolCallRecord } from "../src/domain/ToolCall.ts"
import * as EnvRegistry from "../src/env/EnvRegistry.ts"
import * as MathEnv from "../src/env/MathEnv.ts"
import * as McpClient from "../src/env/McpClient.ts"
import * as McpToolEnv from "../src/env/McpToolEnv.ts"
import * as ToolIo from "../src/env/ToolIo.ts"
import * as TauEnv from "../src/env/tau/TauEnv.ts"
import * as Generator from "../src/generator/Generator.ts"
import { InferenceEngine } from "../src/inference/InferenceEngine.ts"
import * as LocalEngine from "../src/inference/LocalEngine.ts"
import * as Metrics from "../src/metrics/Metrics.ts"
import * as SyncPipeline from "../src/pipeline/SyncPipeline.ts"
import * as Checkpointer from "../src/store/Checkpointer.ts"
import * as EpisodeLog from "../src/store/EpisodeLog.ts"
import * as InProcessWeightSync from "../src/sync/InProcessWeightSync.ts"
import * as AutoTokenizer from "../src/tokenizer/AutoTokenizer.ts"
import { Tokenizer } from "../src/tokenizer/Tokenizer.ts"
import * as PolicyModel from "../src/trainer/PolicyModel.ts"
import * as PolicyTrainer from "../src/trainer/PolicyTrainer.ts"

export interface RunOptions {
  readonly runDir: string
  /** A checkpoint directory whose weights replace model.path / model.init. */
  readonly resumeFrom?: string
  readonly trainRows: number
}

const generatorOptions = (c: RunConfig): Generator.GeneratorOptions => ({
  maxTurns: c.generator.max_turns,
  maxGenerateLength: c.generator.max_generate_length,
  maxInputLength: c.generator.max_input_length,
  temperature: c.generator.sampling.temperature,
  topP: c.generator.sampling.top_p,
  topK: c.generator.sampling.top_k,
  stopStrings: c.generator.sampling.stop,
  seed: c.generator.seed,
  stepWise: c.generator.step_wise,
  samplesPerPrompt: c.generator.n_samples_per_prompt,
  maxConcurrentGroups: c.generator.max_concurrent_groups,
  unordered: c.pipeline.mode === "async"
})

/** Tool I/O: live calls, live calls recorded, or a recorded run's results served back with no server. */
const toolIo = (c: RunConfig) => {
  if (c.environment.tool_io === "replay") {
    const file = c.environment.replay_from! // RunConfig checks replay_from is set for replay
    return Layer.effect(
      ToolIo.ToolIo,
      EpisodeLog.read(file).pipe(
        Stream.runCollect,
        Effect.map((groups) => {
          const records: Array<ToolCallRecord> = groups.flatMap((g) =>
            g.trajectories.flatMap((t) => t.turns.flatMap((turn) => turn.toolCalls))
          )
          return ToolIo.makeReplay({ records })
        }),
        Effect.orDie
      )
    ).pipe(Layer.provide(NodeServices.layer))
  }
  const live = c.environment.tool_io === "record" ? ToolIo.layerRecord : ToolIo.layerLive
  return live.pipe(Layer.provide(McpClient.layerFromConfig(c.environment)))
}

/**
 * Environments: the registry with the built-in classes (`math`, and `mcp_tool` when MCP servers are configured or
 * tool I/O is replayed).
 */
export const environments = (c: RunConfig) => {
  const mcp =
    c.environment.mcp_servers.length > 0 || c.environment.tool_io === "replay"
      ? McpToolEnv.layer(McpToolEnv.optionsFromConfig(c.environment, c.generator)).pipe(Layer.provide(toolIo(c)))
      : Layer.empty
  const tau = TauEnv.layerFromConfig(c.environment).pipe(Layer.provide(NodeServices.layer)) // `tau_bench` when environment.tau is set
  return Layer.mergeAll(mcp, MathEnv.layer, tau).pipe(Layer.provideMerge(EnvRegistry.layer()))
}

/** Everything a training run needs. Initialises the tensor backend before any tensor exists. */
export const training = (c: RunConfig, options: RunOptions) =>
  Layer.unwrap(
    Effect.gen(function* () {
      const backend = yield* TensorBackend.initialise(c.backend)
      const modelConfig = options.resumeFrom === undefined ? c.model : { path: options.resumeFrom, lora: c.model.lora }
      const policy = PolicyModel.layer(modelConfig)
      const tokenizer = AutoTokenizer.layer(c.tokenizer, c.model.path).pipe(Layer.provide(NodeServices.layer))
      const engine = Layer.effect(
        InferenceEngine,
        Effect.gen(function* () {
          const { model } = yield* PolicyModel.PolicyModel
          const tok = yield* Tokenizer
          return yield* LocalEngine.make({
            model,
            decode: (ids) => tok.decode(ids),
            maxBatch: c.generator.engine.max_batch_size
          })
        })
      )
      const trainer = PolicyTrainer.layer({
        trainer: c.trainer,
        samplesPerPrompt: c.generator.n_samples_per_prompt,
        temperature: c.generator.sampling.temperature > 0 ? c.generator.sampling.temperature : 1,
        totalSteps: SyncPipeline.totalSteps(c, options.trainRows),
        zeroRewardOnNonStop: c.generator.zero_reward_on_non_stop,
        overlongFiltering: c.generator.apply_overlong_filtering,
        zeroVarianceFilter: c.generator.zero_variance_filter,
        stepWise: c.generator.step_wise
      })
      const checkpointer = Layer.effect(
        Checkpointer.Checkpointer,
        Effect.gen(function* () {
          const tok = yield* Tokenizer
          return Checkpointer.make({ runDir: options.runDir, keepN: c.checkpoint.keep_n, tokenizer: tok.impl })
        })
      )
      const store = Layer.mergeAll(
        EpisodeLog.layer(options.runDir),
        Metrics.layer(options.runDir, { progress: c.logging.progress })
      ).pipe(Layer.provide(NodeServices.layer), Layer.orDie)
      const core = Layer.mergeAll(Generator.layer(generatorOptions(c)), InProcessWeightSync.layer).pipe(
        Layer.provideMerge(engine),
        Layer.provideMerge(environments(c)),
        Layer.provideMerge(checkpointer)
      )
      return Layer.mergeAll(core, trainer, store, Layer.succeed(TensorBackend.TensorBackend, backend)).pipe(
        Layer.provideMerge(tokenizer),
        Layer.provideMerge(policy)
      )
    })
  )

/** What `replay` needs: the policy, its trainer and the run's stores; no engine, no environments, no tool servers. */
export const replay = (c: RunConfig, options: { readonly runDir: string; readonly totalSteps: number }) =>
  Layer.unwrap(
    Effect.gen(function* () {
      const backend = yield* TensorBackend.initialise(c.backend)
      const tokenizer = AutoTokenizer.layer(c.tokenizer, c.model.path).pipe(Layer.provide(NodeServices.layer))
      const trainer = PolicyTrainer.layer({
        trainer: c.trainer,
        samplesPerPrompt: c.generator.n_samples_per_prompt,
        temperature: c.generator.sampling.temperature > 0 ? c.generator.sampling.temperature : 1,
        totalSteps: options.totalSteps,
        zeroRewardOnNonStop: c.generator.zero_reward_on_non_stop,
        overlongFiltering: c.generator.apply_overlong_filtering,
        zeroVarianceFilter: c.generator.zero_variance_filter
      })
      const checkpointer = Layer.effect(
        Checkpointer.Checkpointer,
        Effect.gen(function* () {
          const tok = yield* Tokenizer
          return Checkpointer.make({ runDir: options.runDir, keepN: c.checkpoint.keep_n, tokenizer: tok.impl })
        })
      )
      const metrics = Metrics.layer(options.runDir, { progress: c.logging.progress }).pipe(
        Layer.provide(NodeServices.layer)
      )
      return Layer.mergeAll(trainer, checkpointer, metrics, Layer.succeed(TensorBackend.TensorBackend, backend)).pipe(
        Layer.provideMerge(tokenizer),
        Layer.provideMerge(PolicyModel.layer(c.model))
      )
    })
  )
