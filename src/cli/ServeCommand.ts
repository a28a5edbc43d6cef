/**
 * `serve --model DIR [--host 127.0.0.1] [--port 8000] [--token-env EFFECT_RL_SERVE_TOKEN] [--watch DIR]
 * [--max-model-len N] [--max-request-bytes B] [--max-n N]`: an OpenAI-compatible inference server over a HF checkpoint
 * directory (a LocalEngine inside; routes, wire shapes and request limits in inference/OpenAiServer.ts).
 * `POST /v1/weights` takes new weights from a trainer (sync/HttpWeightSync.ts) and is open only when the environment
 * variable named by `--token-env` holds a token; `--watch DIR` also loads the versions a FileWeightSync writes there.
 * Binds 127.0.0.1 unless told otherwise. The last stdout line, once listening, is
 * `{"event":"listening","url":"http://HOST:PORT"}`; it runs until SIGINT/SIGTERM.
 */
import { createServer } from "node:http"
import * as path from "node:path"
import { NodeHttpServer } from "@effect/platform-node"
import { Config, Console, Context, Effect, Layer, Option, Redacted } from "effect"
import { Command, Flag } from "effect/cli"
import { HttpServer } from "effect/http"
import * as TensorBackend from "../backend/TensorBackend.ts"
import * as WebGpu from "../backend/WebGpu.ts"
import { CheckpointError, ConfigError } from "../domain/Errors.ts"
import * as LocalEngine from "../inference/LocalEngine.ts"
import * as OpenAiServer from "../inference/OpenAiServer.ts"
import * as Checkpoint from "../model/Checkpoint.ts"
import * as LogProbs from "../model/LogProbs.ts"
import * as Transformer from "../model/Transformer.ts"
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
}

/** A limit flag's value: a positive integer, and `--max-model-len` within the checkpoint's positions. */
const checkLimits = (options: ServeOptions, positions: number) => {
  for (const [flag, value] of [
    ["--max-model-len", options.maxModelLen],
    ["--max-request-bytes", options.maxRequestBytes],
    ["--max-n", options.maxN]
  ] as const) {
    if (value !== undefined && !(Number.isInteger(value) && value >= 1)) {
      return Effect.fail(new ConfigError({ path: flag, message: `${flag} must be a positive integer, got ${value}` }))
    }
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
export const start = Effect.fnUntraced(function* (options: ServeOptions) {
  const { model } = yield* Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        WebGpu.checkModelFits(await Checkpoint.readConfig(options.model))
        return Checkpoint.load(options.model)
      },
      catch: (cause) =>
        new CheckpointError({ path: options.model, message: cause instanceof Error ? cause.message : String(cause) })
    }),
    (loaded) => Effect.sync(() => Transformer.dispose(loaded.model))
  )
  yield* checkLimits(options, model.config.maxPositionEmbeddings)
  const tokenizer = yield* AutoTokenizer.load(options.model)
  const engine = yield* LocalEngine.make({
    model,
    decode: (ids) => tokenizer.decode(ids),
    maxBatch: options.maxBatch ?? 16
  })
  if (options.watch !== undefined) yield* FileWeightSync.watch(options.watch, engine)
  const server = OpenAiServer.layer({
    engine,
    tokenizer,
    modelName: options.modelName ?? path.basename(path.resolve(options.model)),
    maxModelLen: options.maxModelLen ?? model.config.maxPositionEmbeddings,
    ...(options.maxRequestBytes === undefined ? {} : { maxRequestBytes: options.maxRequestBytes }),
    ...(options.maxN === undefined ? {} : { maxN: options.maxN }),
    promptLogprobs: (ids) => LogProbs.ofIds(model, ids),
    ...(options.token === undefined ? {} : { weightToken: options.token })
  }).pipe(Layer.provideMerge(NodeHttpServer.layer(createServer, { port: options.port, host: options.host })))
  const context = yield* Layer.build(server)
  return HttpServer.formatAddress(Context.get(context, HttpServer.HttpServer).address)
})

export const command = Command.make(
  "serve",
  {
    model: Flag.String("model").pipe(Flag.withDescription("a HF checkpoint directory (config.json + safetensors)")),
    host: Flag.String("host").pipe(Flag.withDefault("127.0.0.1"), Flag.withDescription("address to bind")),
    port: Flag.Int("port").pipe(Flag.withDefault(8000), Flag.withDescription("port (0 = any free port)")),
    tokenEnv: Flag.String("token-env").pipe(
      Flag.withDefault("EFFECT_RL_SERVE_TOKEN"),
      Flag.withDescription("environment variable holding the bearer token of POST /v1/weights")
    ),
    watch: Flag.String("watch").pipe(
      Flag.optional,
      Flag.withDescription("a FileWeightSync directory: load each new version written there")
    ),
    maxBatch: Flag.Int("max-batch").pipe(Flag.withDefault(16), Flag.withDescription("rows decoded together")),
    maxModelLen: Flag.Int("max-model-len").pipe(
      Flag.optional,
      Flag.withDescription("context served, prompt + max_tokens (default: the checkpoint's max_position_embeddings)")
    ),
    maxRequestBytes: Flag.Int("max-request-bytes").pipe(
      Flag.optional,
      Flag.withDescription("refuse larger request bodies with 413 (default: 32 bytes per token of context, ≥ 1 MiB)")
    ),
    maxN: Flag.Int("max-n").pipe(
      Flag.withDefault(OpenAiServer.defaultMaxN),
      Flag.withDescription("the most choices per prompt (n) a request may ask for")
    ),
    backend: Flag.Literals("backend", ["auto", "wasm", "cpu", "webgpu", "tensorflow", "tensorflow-gpu"]).pipe(
      Flag.withDefault("wasm"),
      Flag.withDescription("tfjs backend")
    )
  },
  ({ model, host, port, tokenEnv, watch, maxBatch, maxModelLen, maxRequestBytes, maxN, backend }) =>
    Effect.scoped(
      Effect.gen(function* () {
        yield* TensorBackend.initialise({ name: backend, threads: 0, kernels: "stock" })
        const token = yield* Config.option(Config.Redacted(tokenEnv))
        if (Option.isNone(token)) {
          yield* Console.error(`${tokenEnv} is not set: POST /v1/weights is disabled`)
        }
        const url = yield* start({
          model,
          host,
          port,
          token: Option.isSome(token) ? Redacted.value(token.value) : undefined,
          maxBatch,
          maxN,
          ...(Option.isSome(watch) ? { watch: watch.value } : {}),
          ...(Option.isSome(maxModelLen) ? { maxModelLen: maxModelLen.value } : {}),
          ...(Option.isSome(maxRequestBytes) ? { maxRequestBytes: maxRequestBytes.value } : {})
        })
        yield* Console.log(JSON.stringify({ event: "listening", url }))
        return yield* Effect.never
      })
    )
).pipe(Command.withDescription("Serve a checkpoint over an OpenAI-compatible HTTP API (completions, chat, weights)"))
