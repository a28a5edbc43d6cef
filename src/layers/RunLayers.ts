/**
 * The composition root for runs (`train`, `eval`): the only place that turns a decoded RunConfig into Layers.
 *
 *   backend (initialised first: tfjs backends are process-global)
 *   └ PolicyModel (model.path | model.init | a checkpoint to resume)
 *     ├ Tokenizer (byte | hf), InferenceEngine (generator.engine.kind: local over the policy's own variables |
 *     │ worker | remote), WeightSync (pipeline.weight_sync: inprocess | worker | file | http, checked against it)
 *     ├ McpClient (config's servers) → ToolIo (live | record | replay) → EnvRegistry + mcp_tool env
 *     ├ Generator (AgentLoop), PolicyTrainer
 *     └ EpisodeLog, Metrics, Checkpointer (under the run directory)
 *   └ tracking (`train` only: logging.backends otlp, prometheus), built first so every service's spans go through it
 *
 * and for `sft`: the backend, PolicyModel, Tokenizer, and SftOutput over Metrics and Checkpointer in `sft.output_dir`.
 */

import { createServer } from "node:http"
import * as path from "node:path"
import { NodeHttpServer, NodeServices } from "@effect/platform-node"
import { Cause, Config, Duration, Effect, Layer, Option, Redacted, Schema, Stream } from "effect"
import { FetchHttpClient } from "effect/http"
import * as TensorBackend from "../backend/TensorBackend.ts"
import * as ConfigView from "../config/ConfigView.ts"
import * as PipelineConfig from "../config/PipelineConfig.ts"
import { derive, RunConfig } from "../config/RunConfig.ts"
import type { LoggingConfig } from "../config/StoreConfig.ts"
import { ConfigError } from "../domain/Errors.ts"
import type { ToolCallRecord } from "../domain/ToolCall.ts"
import * as EnvRegistry from "../env/EnvRegistry.ts"
import * as MathEnv from "../env/MathEnv.ts"
import * as McpToolEnv from "../env/McpToolEnv.ts"
import * as ToolIo from "../env/ToolIo.ts"
import * as TauEnv from "../env/tau/TauEnv.ts"
import * as AgentGateway from "../generator/AgentGateway.ts"
import * as Generator from "../generator/Generator.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as LlamaCppEngine from "../inference/LlamaCppEngine.ts"
import * as LocalEngine from "../inference/LocalEngine.ts"
import * as RemoteEngine from "../inference/RemoteEngine.ts"
import * as WorkerEngine from "../inference/WorkerEngine.ts"
import * as McpClient from "../mcp/McpClient.ts"
import * as Metrics from "../metrics/Metrics.ts"
import * as Tracking from "../metrics/Tracking.ts"
import * as ModelConfig from "../model/ModelConfig.ts"
import * as TrainingLoop from "../pipeline/TrainingLoop.ts"
import * as ToolPrompts from "../serve/ToolPrompts.ts"
import * as Checkpointer from "../store/Checkpointer.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"
import * as RunDirectory from "../store/RunDirectory.ts"
import * as EngineWeightSync from "../sync/EngineWeightSync.ts"
import * as FileWeightSync from "../sync/FileWeightSync.ts"
import * as HttpWeightSync from "../sync/HttpWeightSync.ts"
import * as AutoTokenizer from "../tokenizer/AutoTokenizer.ts"
import { Tokenizer } from "../tokenizer/Tokenizer.ts"
import * as PolicyModel from "../trainer/PolicyModel.ts"
import * as PolicyTrainer from "../trainer/PolicyTrainer.ts"
import * as SftTrainer from "../trainer/SftTrainer.ts"
import * as Judge from "./Judge.ts"
import * as Teacher from "./Teacher.ts"

export interface RunOptions {
  readonly runDir: string
  /** A checkpoint directory whose weights replace model.path / model.init. */
  readonly resumeFrom?: string
  /** A PEFT adapter to attach over `model` (model.lora must match it): evaluating a LoRA run's checkpoint. */
  readonly adapterDir?: string
  readonly trainRows: number
  /** Start logging.backends' otlp and prometheus (`train`; an `eval` beside a run must not take its port). */
  readonly tracking?: boolean
}

export const generatorOptions = (c: RunConfig): Generator.GeneratorOptions => ({
  maxTurns: c.generator.max_turns,
  maxGenerateLength: c.generator.max_generate_length,
  maxInputLength: c.generator.max_input_length,
  temperature: c.generator.sampling.temperature,
  topP: c.generator.sampling.top_p,
  topK: c.generator.sampling.top_k,
  stopStrings: c.generator.sampling.stop,
  seed: c.generator.seed,
  stepWise: c.generator.step_wise,
  chat: c.generator.engine.chat,
  samplesPerPrompt: c.generator.n_samples_per_prompt,
  maxConcurrentGroups: c.generator.max_concurrent_groups,
  unordered: c.pipeline.mode === "async",
  ...(c.generator.agent === undefined
    ? {}
    : {
        agent: {
          command: c.generator.agent.command,
          timeoutSeconds: c.generator.agent.timeout_seconds,
          env: c.generator.agent.env,
          cwd: c.generator.agent.cwd,
          toolCallFormat: c.environment.tool_call_format
        }
      })
})

/** The agent gateway of `generator.agent` on a free loopback port, or nothing. */
const agentGateway = (c: RunConfig) =>
  c.generator.agent === undefined
    ? Layer.empty
    : AgentGateway.layer(
        ToolPrompts.fromEnvironment(c.environment.tool_prompt, c.environment.tool_call_format),
        NodeHttpServer.layer(createServer, { port: 0, host: "127.0.0.1" })
      )

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

/**
 * The inference engine `generator.engine.kind` asks for: a LocalEngine over the policy's own variables, a WorkerEngine
 * (its own copy of the weights and tfjs backend in a worker thread), or a RemoteEngine (our `serve` or vLLM).
 */
export const inference = (c: RunConfig, runDir: string) => {
  const e = c.generator.engine
  return Layer.effect(
    InferenceEngine,
    Effect.gen(function* () {
      const { model } = yield* PolicyModel.PolicyModel
      const tok = yield* Tokenizer
      switch (e.kind) {
        case "local":
          return yield* LocalEngine.make({ model, decode: (ids) => tok.decode(ids), maxBatch: e.max_batch_size })
        case "worker":
          return yield* WorkerEngine.make({
            model,
            backend: c.backend,
            maxBatch: e.max_batch_size,
            tokenizer: tok.impl,
            pauseMode: c.pipeline.pause_mode
          })
        case "llamacpp": {
          const files = tok.impl.hfFiles()
          return yield* LlamaCppEngine.make({
            model,
            tokenizer: { tokenizerJson: files["tokenizer.json"], tokenizerConfig: files["tokenizer_config.json"] },
            type: ({ f32: "F32", f16: "F16", bf16: "BF16", q8_0: "Q8_0" } as const)[e.gguf_type],
            dir: path.resolve(e.gguf_dir ?? `${runDir}/weights-gguf`),
            maxBatch: e.max_batch_size,
            threads: e.llamacpp_threads,
            contextSize: c.generator.max_input_length // prompt + response never exceed it (generator/AgentLoop.ts)
          })
        }
        case "remote": {
          const apiKey = yield* secret(e.api_key)
          // a LoRA run syncing over http loads each version's adapter through the server's runtime LoRA API,
          // keeping as many as a group may still be sampled from (max_staleness_steps + 1)
          const lora =
            c.model.lora.rank > 0 && c.pipeline.weight_sync === "http"
              ? {
                  dir: e.lora_dir ?? `${runDir}/adapters`,
                  keep: c.pipeline.max_staleness_steps + 1,
                  prefix: e.lora_name_prefix
                }
              : undefined
          // full weights through the engine (see weightSyncOf): a weights directory for vllm / sglang, the upload
          // token for effect-rl with several replicas
          const weightToken =
            e.dialect === "effect-rl" && e.urls !== undefined ? yield* secret(e.weight_token) : undefined
          return yield* RemoteEngine.make({
            // weightSyncOf (run before any layer is built) checked one of url / urls is set
            ...(e.url === undefined ? {} : { url: e.url }),
            ...(e.urls === undefined ? {} : { urls: e.urls }),
            ...(e.model_name === undefined ? {} : { model: e.model_name }),
            ...(apiKey === undefined ? {} : { apiKey }),
            ...(lora === undefined ? {} : { lora }),
            dialect: e.dialect,
            ...(weightToken === undefined ? {} : { weightToken }),
            weightsDir: path.resolve(e.weights_dir ?? `${runDir}/weights-hf`),
            hfConfig: ModelConfig.toHf(model.config),
            pauseMode: c.pipeline.pause_mode,
            timeout: Duration.seconds(e.request_timeout_seconds)
          }).pipe(Effect.provide(FetchHttpClient.layer))
        }
      }
    })
  )
}

/** The value of the environment variable a `{ env: NAME }` reference names, when set. */
const secret = (ref: { readonly env: string } | undefined) =>
  Effect.map(ref === undefined ? Effect.succeed(Option.none()) : Config.option(Config.Redacted(ref.env)), (value) =>
    Option.isSome(value) ? Redacted.value(value.value) : undefined
  ).pipe(Effect.mapError((e) => new ConfigError({ path: "generator.engine", message: e.message })))

/**
 * The weight sync `pipeline.weight_sync` asks for, once it fits the engine by PipelineConfig's rule (each engine kind
 * takes its own sync, or `file` for local and remote): `inprocess` and `worker` hand versions to the engine's own
 * `updateWeights` (a local engine shares the trainer's variables, a worker engine copies), `http` uploads to `serve`'s
 * /v1/weights with `generator.engine.weight_token` (a LoRA run's adapters instead go to the remote engine, which loads
 * them with the server's runtime LoRA API; so do full weights in the vllm and sglang dialects, which the engine writes
 * as HF directories and has the servers reload, and with several effect-rl replicas, which it uploads to each),
 * `file` writes versions under RUN_DIR/weights for a `serve --watch`.
 */
const weightSyncOf = (c: RunConfig, runDir: string) =>
  Effect.gen(function* () {
    const e = c.generator.engine
    const sync = c.pipeline.weight_sync
    if (e.kind === "remote" && e.url === undefined && e.urls === undefined) {
      return yield* Effect.fail(
        new ConfigError({
          path: "generator.engine.url",
          message: "generator.engine.url (or generator.engine.urls) is required for kind remote"
        })
      )
    }
    yield* PipelineConfig.checkWeightSync(sync, e.kind)
    switch (sync) {
      case "inprocess":
        return EngineWeightSync.layer({ weights: "shared" })
      case "worker":
        return EngineWeightSync.layer({ weights: "copied" })
      case "file":
        return FileWeightSync.layerFollowing({ dir: `${runDir}/weights` })
      case "http": {
        // LoRA: the engine loads each adapter itself (RemoteEngine's `lora`), no /v1/weights upload; vllm / sglang:
        // the engine writes each version's HF directory and drives the servers' reload endpoints; several
        // effect-rl replicas: the engine uploads to each
        if (c.model.lora.rank > 0 || e.dialect !== "effect-rl") return EngineWeightSync.layer({ weights: "copied" })
        const token = yield* secret(e.weight_token)
        if (token === undefined) {
          return yield* Effect.fail(
            new ConfigError({
              path: "pipeline.weight_sync",
              message: `pipeline.weight_sync http needs generator.engine.weight_token: { env: NAME } naming a set variable (serve --token-env), or generator.engine.dialect vllm | sglang`
            })
          )
        }
        if (e.urls !== undefined) return EngineWeightSync.layer({ weights: "copied" })
        return HttpWeightSync.layer({ url: e.url!, token })
      }
    }
  })

/** The policy trainer: its `trainer` section and the values derived from the others; `totalSteps` sets the LR schedule. */
const trainerLayer = (c: RunConfig, totalSteps: number) =>
  PolicyTrainer.layer({ trainer: c.trainer, derived: derive(c), totalSteps })

/** Checkpoints under the run directory, each with the run's tokenizer files. */
const checkpointerLayer = (c: RunConfig, runDir: string) =>
  Layer.effect(
    Checkpointer.Checkpointer,
    Effect.gen(function* () {
      const tok = yield* Tokenizer
      const lora = PolicyModel.loraOptions(c.model.lora)
      // a LoRA run's checkpoints hold its adapter alone, over the run's own base (`model`)
      return Checkpointer.make({
        runDir,
        keepN: c.checkpoint.keep_n,
        tokenizer: tok.impl,
        ...(lora === undefined
          ? {}
          : { lora, weights: "adapter", ...(c.model.path === undefined ? {} : { baseModelPath: c.model.path }) })
      })
    })
  )

/** Whether `logging.backends` asks for the metrics as gauges (otlp with metrics, prometheus). */
const wantsGauges = (logging: LoggingConfig) =>
  (logging.backends.includes("otlp") && logging.otlp.metrics) || logging.backends.includes("prometheus")

/**
 * The tracking backends beyond metrics.jsonl: OTLP/HTTP over fetch, the Prometheus endpoint on a Node HTTP server (a
 * busy port is a ConfigError naming logging.prometheus.port).
 */
export const tracking = (logging: LoggingConfig): Layer.Layer<never, ConfigError> => {
  const otlp = logging.backends.includes("otlp")
    ? Tracking.otlp(logging.otlp).pipe(Layer.provide(FetchHttpClient.layer))
    : Layer.empty
  const { host, port } = logging.prometheus
  const prometheus = logging.backends.includes("prometheus")
    ? Tracking.prometheus(logging.prometheus).pipe(
        Layer.provide(NodeHttpServer.layer(createServer, { port, host })),
        Layer.catchCause((cause) => {
          const error = Cause.squash(cause)
          const detail = String((error as { cause?: unknown }).cause ?? error) // ServeError's cause: the listen error
          return Layer.effectDiscard(
            Effect.fail(
              new ConfigError({
                path: "logging.prometheus.port",
                message: detail.includes("EADDRINUSE")
                  ? `logging.prometheus.port ${port} on ${host} is in use: stop what listens there, or set another port (0 = any free port)`
                  : `logging.prometheus: cannot listen on ${host}:${port}: ${detail}`
              })
            )
          )
        })
      )
    : Layer.empty
  return Layer.mergeAll(otlp, prometheus)
}

/** Everything a training run needs. Initialises the tensor backend before any tensor exists. */
export const training = (c: RunConfig, options: RunOptions) =>
  Layer.unwrap(
    Effect.gen(function* () {
      const backend = yield* TensorBackend.initialise(c.backend)
      // resuming: the checkpoint's weights, or for a LoRA run the run's base with the checkpoint's adapter
      const policy =
        options.resumeFrom === undefined
          ? PolicyModel.layer(c.model, options.adapterDir === undefined ? {} : { adapterDir: options.adapterDir })
          : c.model.lora.rank > 0
            ? PolicyModel.layer(c.model, { adapterDir: Checkpointer.adapterDir(options.resumeFrom) })
            : PolicyModel.layer({ path: options.resumeFrom, lora: c.model.lora })
      const tokenizer = AutoTokenizer.layer(c.tokenizer, c.model.path).pipe(Layer.provide(NodeServices.layer))
      const engine = inference(c, options.runDir)
      const weightSync = yield* weightSyncOf(c, options.runDir)
      const judge = yield* Judge.fromConfig(c)
      const trainer = trainerLayer(c, TrainingLoop.totalSteps(c.trainer, options.trainRows))
      const checkpointer = checkpointerLayer(c, options.runDir)
      const track = options.tracking === true
      const store = Layer.mergeAll(
        EpisodeLog.layer(options.runDir),
        Metrics.layer(options.runDir, { progress: c.logging.progress, gauges: track && wantsGauges(c.logging) })
      ).pipe(Layer.provide(NodeServices.layer), Layer.orDie)
      const generator = Layer.effect(
        Generator.Generator,
        Effect.flatMap(Teacher.fromConfig(c), (teacher) => Generator.make({ ...generatorOptions(c), judge, teacher }))
      ).pipe(Layer.provide(agentGateway(c)))
      const core = Layer.mergeAll(generator, weightSync).pipe(
        Layer.provideMerge(engine),
        Layer.provideMerge(environments(c)),
        Layer.provideMerge(checkpointer)
      )
      return Layer.mergeAll(core, trainer, store, Layer.succeed(TensorBackend.TensorBackend, backend)).pipe(
        Layer.provideMerge(tokenizer),
        Layer.provideMerge(policy),
        Layer.provideMerge(track ? tracking(c.logging) : Layer.empty)
      )
    })
  )

/** What `replay` needs: the policy, its trainer and the run's stores; no engine, no environments, no tool servers. */
export const replay = (c: RunConfig, options: { readonly runDir: string; readonly totalSteps: number }) =>
  Layer.unwrap(
    Effect.gen(function* () {
      const backend = yield* TensorBackend.initialise(c.backend)
      const tokenizer = AutoTokenizer.layer(c.tokenizer, c.model.path).pipe(Layer.provide(NodeServices.layer))
      const trainer = trainerLayer(c, options.totalSteps)
      const checkpointer = checkpointerLayer(c, options.runDir)
      const metrics = Metrics.layer(options.runDir, { progress: c.logging.progress }).pipe(
        Layer.provide(NodeServices.layer)
      )
      return Layer.mergeAll(trainer, checkpointer, metrics, Layer.succeed(TensorBackend.TensorBackend, backend)).pipe(
        Layer.provideMerge(tokenizer),
        Layer.provideMerge(PolicyModel.layer(c.model))
      )
    })
  )

/**
 * What `sft` needs, `options.outputDir` opened first as a fresh run directory (an earlier run's config.yaml and
 * metrics.jsonl moved to `earlier/`, the resolved config written): the policy (model.path | model.init), its
 * tokenizer, and SftOutput over Metrics (`<outputDir>/metrics.jsonl`) and a Checkpointer that puts `step-N/` and
 * `latest` in the output directory itself, where `sft` has always written them and configs and docs name them, and
 * keeps every step: a run's checkpoints are compared one by one to choose a warm start.
 */
export const sft = (c: RunConfig, options: { readonly outputDir: string }) =>
  Layer.unwrap(
    Effect.gen(function* () {
      const backend = yield* TensorBackend.initialise(c.backend)
      const runDir = options.outputDir
      yield* RunDirectory.open(
        runDir,
        undefined,
        `${ConfigView.toYaml(ConfigView.forRunDirectory(Schema.encodeSync(RunConfig)(c)))}\n`
      )
      const tokenizer = AutoTokenizer.layer(c.tokenizer, c.model.path).pipe(Layer.provide(NodeServices.layer))
      const lora = SftTrainer.loraOptions(c.model.lora)
      const checkpointer = Layer.effect(
        Checkpointer.Checkpointer,
        Effect.gen(function* () {
          const tok = yield* Tokenizer
          return Checkpointer.make({
            runDir,
            root: runDir,
            keepN: Number.POSITIVE_INFINITY,
            tokenizer: tok.impl,
            ...(lora === undefined ? {} : { lora })
          })
        })
      )
      const metrics = Metrics.layer(runDir, { progress: false }).pipe(Layer.provide(NodeServices.layer), Layer.orDie)
      const output = Layer.effect(
        SftTrainer.SftOutput,
        Effect.gen(function* () {
          const m = yield* Metrics.Metrics
          const checkpoints = yield* Checkpointer.Checkpointer
          return SftTrainer.SftOutput.of({
            record: (step, values) => m.record("train", step, values),
            save: (step, model, trainer, data) => Effect.map(checkpoints.save(step, model, trainer, data), (s) => s.dir)
          })
        })
      ).pipe(Layer.provide(Layer.mergeAll(checkpointer, metrics)))
      return Layer.mergeAll(output, Layer.succeed(TensorBackend.TensorBackend, backend)).pipe(
        Layer.provideMerge(tokenizer),
        Layer.provideMerge(PolicyModel.layer(c.model))
      )
    })
  )
