/**
 * `serve --model DIR [--host 127.0.0.1] [--port 8000] [--token-env EFFECT_RL_SERVE_TOKEN] [--watch DIR]`: an
 * OpenAI-compatible inference server over a HF checkpoint directory (a LocalEngine inside; routes and wire shapes in
 * inference/OpenAiServer.ts). `POST /v1/weights` takes new weights from a trainer (sync/HttpWeightSync.ts) and is
 * open only when the environment variable named by `--token-env` holds a token; `--watch DIR` also loads the
 * versions a FileWeightSync writes there. Binds 127.0.0.1 unless told otherwise. The last stdout line, once
 * listening, is `{"event":"listening","url":"http://HOST:PORT"}`; it runs until SIGINT/SIGTERM.
 */
import { createServer } from "node:http"
import * as path from "node:path"
import { NodeHttpServer } from "@effect/platform-node"
import { Config, Console, Context, Effect, Layer, Option, Redacted } from "effect"
import { Command, Flag } from "effect/cli"
import { HttpServer } from "effect/http"
import * as TensorBackend from "../backend/TensorBackend.ts"
import * as WebGpu from "../backend/WebGpu.ts"
import { CheckpointError } from "../domain/Errors.ts"
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
    maxModelLen: model.config.maxPositionEmbeddings,
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
    backend: Flag.Literals("backend", ["auto", "wasm", "cpu", "webgpu", "tensorflow", "tensorflow-gpu"]).pipe(
      Flag.withDefault("wasm"),
      Flag.withDescription("tfjs backend")
    )
  },
  ({ model, host, port, tokenEnv, watch, maxBatch, backend }) =>
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
          ...(Option.isSome(watch) ? { watch: watch.value } : {})
        })
        yield* Console.log(JSON.stringify({ event: "listening", url }))
        return yield* Effect.never
      })
    )
).pipe(Command.withDescription("Serve a checkpoint over an OpenAI-compatible HTTP API (completions, chat, weights)"))
