/**
 * `serve --model DIR [--served-model-name NAME] [--host 127.0.0.1] [--port 8000] [--token-env EFFECT_RL_SERVE_TOKEN] [--watch DIR]
 * [--max-model-len N] [--max-request-bytes B] [--max-n N] [--enable-lora [--max-loras N]] [--enable-weight-reload]`: an OpenAI-compatible
 * inference server over a HF checkpoint directory (composed in layers/Serve.ts: a LocalEngine inside; routes, wire
 * shapes and request limits in serve/OpenAiServer.ts). `POST /v1/weights` takes new weights from a trainer
 * (sync/HttpWeightSync.ts) and is open only when the environment variable named by `--token-env` holds a token;
 * `--watch DIR` also loads the versions a FileWeightSync writes there. `--enable-lora` (or vLLM's
 * `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` in the environment) opens vLLM's `/v1/load_lora_adapter` and
 * `/v1/unload_lora_adapter`. `--enable-weight-reload` (or vLLM's `VLLM_SERVER_DEV_MODE=1`) opens vLLM's and SGLang's
 * weight-update endpoints (serve/DialectRoutes.ts), so a run with `generator.engine.dialect: vllm | sglang` can
 * use this server in place of either.
 * `--model` is read as `eval --model` reads it: a checkpoint, a run directory (its latest checkpoint) or a
 * `checkpoints/latest` pointer. Binds 127.0.0.1 unless told otherwise; a port in use is a named error. The last stdout line, once listening, is
 * `{"event":"listening","url":"http://HOST:PORT"}`; it runs until SIGINT/SIGTERM.
 */
import { Config, Console, Effect, Option, Redacted } from "effect"
import { Command, Flag } from "effect/cli"
import * as TensorBackend from "../backend/TensorBackend.ts"
import * as Serve from "../layers/Serve.ts"
import * as OpenAiServer from "../serve/OpenAiServer.ts"
import * as Checkpointer from "../store/Checkpointer.ts"

export const command = Command.make(
  "serve",
  {
    model: Flag.String("model").pipe(
      Flag.withDescription(
        "a HF checkpoint directory (config.json + safetensors), a run directory (its latest checkpoint) or checkpoints/latest"
      )
    ),
    servedModelName: Flag.String("served-model-name").pipe(
      Flag.optional,
      Flag.withDescription(
        "the model name clients give and /v1/models lists (default: the checkpoint directory's name)"
      )
    ),
    host: Flag.String("host").pipe(
      Flag.withDefault("127.0.0.1"),
      Flag.withDescription("address to bind (default 127.0.0.1)")
    ),
    port: Flag.Int("port").pipe(Flag.withDefault(8000), Flag.withDescription("port, 0 = any free port (default 8000)")),
    tokenEnv: Flag.String("token-env").pipe(
      Flag.withDefault("EFFECT_RL_SERVE_TOKEN"),
      Flag.withDescription(
        "environment variable holding the bearer token of POST /v1/weights (default EFFECT_RL_SERVE_TOKEN)"
      )
    ),
    watch: Flag.String("watch").pipe(
      Flag.optional,
      Flag.withDescription("a FileWeightSync directory: load each new version written there")
    ),
    maxBatch: Flag.Int("max-batch").pipe(
      Flag.withDefault(16),
      Flag.withDescription("rows decoded together (default 16)")
    ),
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
      Flag.withDescription(
        `the most choices per prompt (n) a request may ask for (default ${OpenAiServer.defaultMaxN})`
      )
    ),
    enableLora: Flag.Boolean("enable-lora").pipe(
      Flag.withDefault(false),
      Flag.withDescription(
        "open POST /v1/load_lora_adapter and /v1/unload_lora_adapter (also: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; default off)"
      )
    ),
    enableWeightReload: Flag.Boolean("enable-weight-reload").pipe(
      Flag.withDefault(false),
      Flag.withDescription(
        "open vLLM's (/pause, /collective_rpc reload_weights, /resume, …) and SGLang's (/update_weights_from_disk, …) weight-update endpoints (also: VLLM_SERVER_DEV_MODE=1; default off)"
      )
    ),
    maxLoras: Flag.Int("max-loras").pipe(
      Flag.optional,
      Flag.withDescription("the most LoRA adapters held at once; further loads are refused (default: no limit)")
    ),
    backend: Flag.Literals("backend", ["auto", "native", "wasm", "cpu", "webgpu", "tensorflow", "tensorflow-gpu"]).pipe(
      Flag.withDefault("auto"),
      Flag.withDescription("tfjs backend (default auto, as backend.name: the fastest one installed)")
    )
  },
  ({
    model,
    servedModelName,
    host,
    port,
    tokenEnv,
    watch,
    maxBatch,
    maxModelLen,
    maxRequestBytes,
    maxN,
    enableLora,
    enableWeightReload,
    maxLoras,
    backend
  }) =>
    Effect.scoped(
      Effect.gen(function* () {
        // auto and native take effect-rl's native kernels, as training does, so auto reaches the native backend (no
        // 4 GB heap: a 0.6B model serves); wasm keeps tfjs's own, one thread per server, so replicas side by side do
        // not compete for the cores (bench/replicas.ts)
        yield* TensorBackend.initialise({ name: backend, threads: 0, kernels: backend === "wasm" ? "stock" : "native" })
        const token = yield* Config.option(Config.Redacted(tokenEnv))
        if (Option.isNone(token)) {
          yield* Console.error(`${tokenEnv} is not set: POST /v1/weights is disabled`)
        }
        // vLLM reads the variable as "1" or "true", any case
        const runtimeLora = yield* Config.option(Config.String("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
        const loraFromEnv = Option.isSome(runtimeLora) && ["1", "true"].includes(runtimeLora.value.trim().toLowerCase())
        const devMode = yield* Config.option(Config.String("VLLM_SERVER_DEV_MODE"))
        const reloadFromEnv = Option.isSome(devMode) && ["1", "true"].includes(devMode.value.trim().toLowerCase())
        const url = yield* Serve.start({
          model: yield* Effect.promise(() => Checkpointer.resolveModelDir(model)),
          ...(Option.isSome(servedModelName) ? { modelName: servedModelName.value } : {}),
          host,
          port,
          token: Option.isSome(token) ? Redacted.value(token.value) : undefined,
          maxBatch,
          maxN,
          enableLora: enableLora || loraFromEnv,
          weightReload: enableWeightReload || reloadFromEnv,
          ...(Option.isSome(maxLoras) ? { maxLoras: maxLoras.value } : {}),
          ...(Option.isSome(watch) ? { watch: watch.value } : {}),
          ...(Option.isSome(maxModelLen) ? { maxModelLen: maxModelLen.value } : {}),
          ...(Option.isSome(maxRequestBytes) ? { maxRequestBytes: maxRequestBytes.value } : {})
        })
        yield* Console.log(JSON.stringify({ event: "listening", url }))
        return yield* Effect.never
      })
    )
).pipe(
  Command.withDescription(
    "Serve a checkpoint over an OpenAI-compatible HTTP API (completions, chat, weights, LoRA adapters)"
  ),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --model runs/quickstart --port 8000 --enable-lora`,
      description: "the quickstart run's latest checkpoint on :8000, LoRA adapters loadable at run time"
    }
  ])
)
