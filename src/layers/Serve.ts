/**
 * The composition of `serve`: a HF checkpoint directory loaded into a LocalEngine behind the OpenAI-compatible HTTP
 * app (serve/OpenAiServer.ts), with the request limits checked against the checkpoint, an optional
 * FileWeightSync watch and, with `enableLora`, LoRA adapters loaded at run time (serve/AdapterRegistry.ts: one
 * LocalEngine per adapter over the base's weights) and, with `weightReload`, vLLM's and SGLang's weight-update endpoints
 * (serve/DialectRoutes.ts: reload full weights from a HF directory). The tensor backend must be initialised already.
 *
 * When the checkpoint is a run's (`<run>/checkpoints/step-N` beside `<run>/config.yaml`), a chat request's `tools` are
 * put in the prompt as that run's `environment.tool_prompt` put them in front of the policy in training: `template`
 * through the chat template (also the default for a checkpoint of no run), `system`/`compact` as the env's own tool
 * system message (env/McpToolEnv.ts `systemPrompt`, in the run's `tool_call_format`), `none` not at all.
 */
import { createServer } from "node:http"
import * as path from "node:path"
import { NodeHttpServer } from "@effect/platform-node"
import { Context, Effect, Layer } from "effect"
import { HttpRouter, HttpServer } from "effect/http"
import * as TensorBackend from "../backend/TensorBackend.ts"
import * as RunConfigLoader from "../config/RunConfigLoader.ts"
import { CheckpointError, ConfigError } from "../domain/Errors.ts"
import type * as ToolCallParser from "../env/ToolCallParser.ts"
import type { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as LocalEngine from "../inference/LocalEngine.ts"
import * as Checkpoint from "../model/Checkpoint.ts"
import * as HfCache from "../model/HfCache.ts"
import * as LogProbs from "../model/LogProbs.ts"
import * as Transformer from "../model/Transformer.ts"
import * as TensorFile from "../native/TensorFile.ts"
import * as AdapterRegistry from "../serve/AdapterRegistry.ts"
import * as ChatCompletions from "../serve/ChatCompletions.ts"
import * as DialectRoutes from "../serve/DialectRoutes.ts"
import * as OpenAiServer from "../serve/OpenAiServer.ts"
import * as ToolPrompts from "../serve/ToolPrompts.ts"
import * as RunDirectory from "../store/RunDirectory.ts"
import * as FileWeightSync from "../sync/FileWeightSync.ts"
import * as AutoTokenizer from "../tokenizer/AutoTokenizer.ts"

export interface ServeOptions {
  readonly model: string
  readonly host: string
  readonly port: number // 0 = any free port
  /** The weight endpoint's token; undefined = closed. */
  readonly token: string | undefined
  readonly modelName?: string
  readonly maxBatch?: number
  /** A FileWeightSync directory whose new versions are loaded as they appear. */
  readonly watch?: string
  /** The context served, prompt + max_tokens (vLLM's --max-model-len); default and most: max_position_embeddings. */
  readonly maxModelLen?: number
  /** Request bodies past this many bytes are refused (413); default OpenAiServer.defaultMaxRequestBytes. */
  readonly maxRequestBytes?: number
  /** The most choices per prompt a request may ask for (`n`); default OpenAiServer.defaultMaxN. */
  readonly maxN?: number
  /** Open vLLM's runtime LoRA endpoints (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`). */
  readonly enableLora?: boolean
  /** With `enableLora`: the most adapters held at once; loads past it are refused. Default unbounded. */
  readonly maxLoras?: number
  /** Open vLLM's and SGLang's weight-update endpoints (serve/DialectRoutes.ts): reload from a HF directory. */
  readonly weightReload?: boolean
}

/** A limit flag's value: a positive integer, and `--max-model-len` within the checkpoint's positions. */
const checkLimits = (options: ServeOptions, positions: number) => {
  for (const [flag, value] of [
    ["--max-model-len", options.maxModelLen],
    ["--max-request-bytes", options.maxRequestBytes],
    ["--max-n", options.maxN],
    ["--max-loras", options.maxLoras]
  ] as const) {
    if (value !== undefined && !(Number.isInteger(value) && value >= 1)) {
      return Effect.fail(new ConfigError({ path: flag, message: `${flag} must be a positive integer, got ${value}` }))
    }
  }
  if (options.maxLoras !== undefined && options.enableLora !== true) {
    return Effect.fail(new ConfigError({ path: "--max-loras", message: "--max-loras needs --enable-lora" }))
  }
  return options.maxModelLen !== undefined && options.maxModelLen > positions
    ? Effect.fail(
        new ConfigError({
          path: "--max-model-len",
          message: `--max-model-len ${options.maxModelLen} exceeds the checkpoint's max_position_embeddings ${positions}`
        })
      )
    : Effect.void
}

/**
 * Load the checkpoint and serve it until the scope closes; returns the URL it listens on. The tensor backend must be
 * initialised already.
 */
export const start = Effect.fnUntraced(function* (given: ServeOptions) {
  // a directory, or org/name[@revision] from the Hugging Face cache (served under that name)
  const modelDir = yield* Effect.try({
    try: () => HfCache.resolve(given.model),
    catch: (cause) =>
      new CheckpointError({ path: given.model, message: cause instanceof Error ? cause.message : String(cause) })
  })
  const options: ServeOptions =
    modelDir === given.model ? given : { ...given, model: modelDir, modelName: given.modelName ?? given.model }
  const { model } = yield* Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        TensorBackend.checkModelFits(await Checkpoint.readConfig(options.model))
        return TensorFile.load(options.model)
      },
      catch: (cause) =>
        new CheckpointError({ path: options.model, message: cause instanceof Error ? cause.message : String(cause) })
    }),
    (loaded) => Effect.sync(() => Transformer.dispose(loaded.model))
  )
  yield* checkLimits(options, model.config.maxPositionEmbeddings)
  const tokenizer = yield* AutoTokenizer.load(options.model)
  const decode = (ids: ReadonlyArray<number>) => tokenizer.decode(ids)
  const maxBatch = options.maxBatch ?? 16
  const baseEngine = yield* LocalEngine.make({ model, decode, maxBatch })
  const adapters =
    options.enableLora === true
      ? yield* AdapterRegistry.make({
          base: model,
          baseEngine,
          decode,
          maxBatch,
          ...(options.maxLoras === undefined ? {} : { maxLoras: options.maxLoras })
        })
      : undefined
  // new base weights (an upload, a watched version) reach the adapter engines too
  const engine: InferenceEngine["Service"] =
    adapters === undefined
      ? baseEngine
      : {
          ...baseEngine,
          updateWeights: (snapshot) => Effect.andThen(baseEngine.updateWeights(snapshot), adapters.refresh)
        }
  if (options.watch !== undefined) yield* FileWeightSync.watch(options.watch, engine)
  const api = OpenAiServer.routes({
    engine,
    tokenizer,
    modelName: options.modelName ?? path.basename(path.resolve(options.model)),
    maxModelLen: options.maxModelLen ?? model.config.maxPositionEmbeddings,
    ...(options.maxRequestBytes === undefined ? {} : { maxRequestBytes: options.maxRequestBytes }),
    ...(options.maxN === undefined ? {} : { maxN: options.maxN }),
    promptLogprobs: (ids) => LogProbs.ofIds(model, ids),
    topLogprobs: (ids, from, k, temperature) => LogProbs.topK(model, ids, from, k, temperature),
    toolPrompt: yield* toolPromptOf(options.model),
    ...(options.token === undefined ? {} : { weightToken: options.token }),
    ...(adapters === undefined ? {} : { adapters })
  })
  const dialects = DialectRoutes.routes({
    engine,
    modelDir: path.resolve(options.model),
    weightReload: options.weightReload === true
  })
  const server = HttpRouter.serve(Layer.mergeAll(api, dialects), { disableLogger: true }).pipe(
    Layer.provideMerge(NodeHttpServer.layer(createServer, { port: options.port, host: options.host }))
  )
  const context = yield* Layer.build(server).pipe(
    Effect.mapError((e) => {
      const detail = String((e as { cause?: unknown }).cause ?? e)
      return new ConfigError({
        path: "--port",
        message: detail.includes("EADDRINUSE")
          ? `port ${options.port} on ${options.host} is in use: stop what listens there, or pass another --port ` +
            `(0 = any free port)`
          : `cannot listen on ${options.host}:${options.port}: ${detail}`
      })
    })
  )
  return HttpServer.formatAddress(Context.get(context, HttpServer.HttpServer).address)
})

/** The chat requests' tool prompt, as the served checkpoint's run was trained with (see the module header). */
const toolPromptOf = (checkpoint: string) =>
  Effect.gen(function* () {
    const dir = path.resolve(checkpoint)
    if (path.basename(path.dirname(dir)) !== "checkpoints") return ChatCompletions.templateTools
    const file = path.join(path.dirname(path.dirname(dir)), RunDirectory.configFile)
    const raw = yield* RunConfigLoader.readFile(file).pipe(Effect.option)
    if (raw._tag === "None") return ChatCompletions.templateTools
    const environment = (raw.value["environment"] ?? {}) as Record<string, unknown>
    const style = String(environment["tool_prompt"] ?? "system")
    const format = (environment["tool_call_format"] ?? "auto") as ToolCallParser.Format
    return style === "system" || style === "compact" || style === "none"
      ? ToolPrompts.fromEnvironment(style, format)
      : ChatCompletions.templateTools
  })
