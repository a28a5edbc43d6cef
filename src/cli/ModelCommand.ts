/**
 * `model info --model DIR`: architecture, parameter count and dtype of a HF checkpoint directory.
 * `model logprobs --model DIR --ids 1,5,9`: the log-prob of each id after the first given its prefix; the last
 * stdout line is `{"logprobs":[...]}`.
 * `model export --model DIR|RUN_DIR --out DIR [--dtype f32|bf16] [--merge [--base DIR]]`: a checkpoint (or a run's
 * latest) as a plain HF directory — config.json, safetensors, tokenizer files — that HF transformers or vLLM load. A
 * LoRA run's checkpoint (or a PEFT adapter directory) holds the adapter alone: `--merge` folds it into its base (the
 * model its adapter_config.json names, or `--base`) and writes the merged weights.
 * `model export --format gguf --out FILE.gguf [--type f32|f16|bf16|q8_0] [--merge [--base DIR]]`: the same model as
 * one GGUF file for llama.cpp, Ollama or LM Studio, with its tokenizer (GgufExport.ts says what is written).
 * `model export --format gguf --adapter --out FILE.gguf [--type …] [--base DIR]`: a LoRA run's adapter (or a PEFT
 * directory) alone, as a GGUF LoRA adapter (GgufLora.ts) to load over the base's own GGUF export.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { Console, Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as TensorBackend from "../backend/TensorBackend.ts"
import type * as RunConfigModel from "../config/ModelConfig.ts"
import * as RunConfigLoader from "../config/RunConfigLoader.ts"
import * as DiskFull from "../domain/DiskFull.ts"
import { CheckpointError, ConfigError } from "../domain/Errors.ts"
import * as Checkpoint from "../model/Checkpoint.ts"
import * as GgufExport from "../model/GgufExport.ts"
import * as GgufLora from "../model/GgufLora.ts"
import * as HfCache from "../model/HfCache.ts"
import * as LogProbs from "../model/LogProbs.ts"
import * as Lora from "../model/Lora.ts"
import * as ModelConfig from "../model/ModelConfig.ts"
import * as Transformer from "../model/Transformer.ts"
import * as TensorFile from "../native/TensorFile.ts"
import * as Checkpointer from "../store/Checkpointer.ts"

const modelFlag = Flag.String("model").pipe(
  Flag.withDescription(
    "a HF checkpoint directory (config.json + safetensors), or org/name[@revision] from the Hugging Face cache"
  )
)
/** The tensor backend, as configs default it (`backend.name: auto`): a model too big for wasm's 4 GB heap loads. */
const backendFlag = Flag.Literals("backend", [
  "auto",
  "native",
  "wasm",
  "cpu",
  "webgpu",
  "tensorflow",
  "tensorflow-gpu"
]).pipe(
  Flag.withDefault("auto"),
  Flag.withDescription("tfjs backend (default auto, as backend.name: the fastest one installed)")
)

/** Load a checkpoint as a scoped resource (disposed when the command ends). */
const loadModel = (dir: string) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        const resolved = HfCache.resolve(dir) // a directory, or org/name[@revision] from the Hugging Face cache
        TensorBackend.checkModelFits(await Checkpoint.readConfig(resolved))
        return TensorFile.load(resolved)
      },
      catch: (cause) =>
        new CheckpointError({ path: dir, message: cause instanceof Error ? cause.message : String(cause) })
    }),
    (loaded) => Effect.sync(() => Transformer.dispose(loaded.model))
  )

const parseIds = (text: string): Effect.Effect<Array<number>, ConfigError> => {
  const ids = text.split(",").map((s) => Number(s.trim()))
  return ids.length < 2 || ids.some((id) => !Number.isInteger(id) || id < 0)
    ? Effect.fail(
        new ConfigError({ path: "--ids", message: `expected at least two comma-separated token ids, got "${text}"` })
      )
    : Effect.succeed(ids)
}

/** What `model info` prints. */
export const info = (spec: string) =>
  Effect.gen(function* () {
    const dir = yield* Effect.try({
      try: () => HfCache.resolve(spec), // a directory, or org/name[@revision] from the Hugging Face cache
      catch: (cause) =>
        new CheckpointError({ path: spec, message: cause instanceof Error ? cause.message : String(cause) })
    })
    const config = yield* Effect.tryPromise({
      try: () => Checkpoint.readConfig(dir),
      catch: (cause) =>
        new CheckpointError({ path: dir, message: cause instanceof Error ? cause.message : String(cause) })
    })
    const located = yield* Effect.tryPromise({
      try: () => Checkpoint.readEntries(dir),
      catch: (cause) =>
        new CheckpointError({ path: dir, message: cause instanceof Error ? cause.message : String(cause) })
    })
    const dtypes = [...new Set([...located.values()].map((t) => t.entry.dtype))]
    return {
      architecture: config.architecture,
      parameters: ModelConfig.parameterCount(config),
      dtype: dtypes.join(","),
      vocab_size: config.vocabSize,
      hidden_size: config.hiddenSize,
      intermediate_size: config.intermediateSize,
      num_hidden_layers: config.numLayers,
      num_attention_heads: config.numHeads,
      num_key_value_heads: config.numKvHeads,
      head_dim: config.headDim,
      tie_word_embeddings: config.tieWordEmbeddings,
      rope_theta: config.ropeTheta,
      rope_scaling: ModelConfig.toHf(config)["rope_scaling"] // null, or llama3's parameters
    }
  })

/** What `model logprobs` prints: log p(ids[t] | ids[<t]) for t ≥ 1. */
export const logprobs = (dir: string, ids: ReadonlyArray<number>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const { model } = yield* loadModel(dir)
      const bad = ids.find((id) => id >= model.config.vocabSize)
      if (bad !== undefined) {
        return yield* new ConfigError({
          path: "--ids",
          message: `id ${bad} is outside the vocabulary (${model.config.vocabSize})`
        })
      }
      return yield* Effect.promise(() => LogProbs.ofIds(model, ids))
    })
  )

const infoCommand = Command.make("info", { model: modelFlag }, ({ model }) =>
  Effect.gen(function* () {
    const result = yield* info(model)
    yield* Console.log(
      `${result.architecture}: ${result.parameters.toLocaleString("en-US")} parameters, ${result.dtype}`
    )
    yield* Console.log(JSON.stringify(result))
  })
).pipe(
  Command.withDescription("Print a checkpoint's architecture, parameter count and dtype"),
  Command.withExamples(({ commandPath }) => [
    { command: `${commandPath.join(" ")} --model data/quickstart/policy`, description: "the shipped quickstart policy" }
  ])
)

const logprobsCommand = Command.make(
  "logprobs",
  {
    model: modelFlag,
    ids: Flag.String("ids").pipe(Flag.withDescription("comma-separated token ids, e.g. 1,5,9")),
    backend: backendFlag
  },
  ({ model, ids, backend }) =>
    Effect.gen(function* () {
      const parsed = yield* parseIds(ids)
      yield* TensorBackend.initialise({ name: backend, threads: 0, kernels: "native" })
      const values = yield* logprobs(model, parsed)
      yield* Console.log(JSON.stringify({ logprobs: values }))
    })
).pipe(
  Command.withDescription("Print the log-prob of each token id after the first, given its prefix"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --model data/quickstart/policy --ids 72,105,33,10`,
      description: 'log p of each byte of "Hi!\\n" after the ones before it'
    }
  ])
)

/** A run directory means its latest checkpoint; anything else is taken as a checkpoint directory. */
const resolveCheckpoint = (dir: string) => Effect.promise(() => Checkpointer.resolveModelDir(dir))

export interface ExportOptions {
  /** Fold a LoRA adapter into its base (required when the source is an adapter). */
  readonly merge?: boolean
  /** The adapter's base model directory, when its adapter_config.json names none (or another). */
  readonly base?: string
}

/**
 * The model `source` holds: its own weights, or for an adapter (a LoRA run's checkpoint, a PEFT directory) its base
 * with the adapter merged in; `merge` must be asked for then.
 */
const loadMerged = (source: string, options: ExportOptions) =>
  Effect.gen(function* () {
    const adapter = yield* Effect.promise(() => Checkpointer.adapterSourceOf(source))
    if (adapter === undefined) return (yield* loadModel(source)).model
    const base = options.base ?? adapter.base
    if (options.merge === true && base === undefined) {
      // a run over a random-init base (`model.init`): rebuild it from the run's config.yaml
      const init = yield* runInitOf(source)
      if (init !== undefined) {
        const model = yield* Effect.acquireRelease(
          Effect.sync(() => Transformer.init(ModelConfig.fromInit(init), init.seed)),
          (m) => Effect.sync(() => Transformer.dispose(m))
        )
        return yield* mergeInto(model, adapter.adapterDir, "model.init")
      }
    }
    if (options.merge !== true || base === undefined) {
      return yield* new ConfigError({
        path: options.merge !== true ? "--merge" : "--base",
        message:
          options.merge !== true
            ? `${source} holds a LoRA adapter (${adapter.adapterDir}), not a model: add --merge to write its base with ` +
              `the adapter merged in, or --format gguf --adapter to write the adapter alone as a GGUF LoRA adapter`
            : `${adapter.adapterDir}/adapter_config.json names no base model: pass --base DIR (the model the run trained over)`
      })
    }
    return yield* mergeInto((yield* loadModel(base)).model, adapter.adapterDir, base)
  })

/** Attach the adapter at `adapterDir` to `model` and fold it in. */
const mergeInto = (model: Transformer.Transformer, adapterDir: string, base: string) =>
  Effect.tryPromise({
    try: async () => {
      await Lora.load(model, adapterDir)
      Lora.merge(model)
      return model
    },
    catch: (cause) =>
      new CheckpointError({
        path: adapterDir,
        message: `cannot merge into ${base}: ${cause instanceof Error ? cause.message : String(cause)}`
      })
  })

/** `model.init` of the run a checkpoint belongs to (`<run>/checkpoints/step-N` → `<run>/config.yaml`), if any. */
const runInitOf = (checkpoint: string): Effect.Effect<RunConfigModel.ModelInit | undefined> =>
  RunConfigLoader.load(path.join(checkpoint, "..", "..", "config.yaml")).pipe(
    Effect.map((c) => c.model.init),
    Effect.provide(NodeServices.layer),
    Effect.orElseSucceed(() => undefined)
  )

/** Write the model at `dir` (a checkpoint, a run directory or an adapter with `merge`) as a HF directory at `out`. */
export const exportHf = (dir: string, out: string, dtype: "F32" | "BF16", options: ExportOptions = {}) =>
  Effect.scoped(
    Effect.gen(function* () {
      const source = yield* resolveCheckpoint(dir)
      const model = yield* loadMerged(source, options)
      yield* Effect.tryPromise({
        try: async () => {
          await Checkpoint.save(model, out, { dtype })
          for (const file of [
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "chat_template.jinja"
          ]) {
            await fs.copyFile(path.join(source, file), path.join(out, file)).catch(() => undefined)
          }
        },
        catch: (cause) =>
          new CheckpointError({ path: out, message: cause instanceof Error ? cause.message : String(cause) })
      })
      return { event: "export", source, out, dtype, parameters: ModelConfig.parameterCount(model.config) }
    })
  )

/** The HF tokenizer files in the first of `dirs` that has a tokenizer.json. */
const tokenizerFilesOf = async (dirs: ReadonlyArray<string>): Promise<GgufExport.TokenizerFiles> => {
  for (const dir of dirs) {
    const json = await fs.readFile(path.join(dir, "tokenizer.json"), "utf8").catch(() => undefined)
    if (json === undefined) continue
    const config = await fs.readFile(path.join(dir, "tokenizer_config.json"), "utf8").catch(() => "{}")
    const template = await fs.readFile(path.join(dir, "chat_template.jinja"), "utf8").catch(() => undefined)
    return {
      tokenizerJson: JSON.parse(json),
      tokenizerConfig: JSON.parse(config),
      ...(template === undefined ? {} : { chatTemplate: template })
    }
  }
  throw new Error(`no tokenizer.json in ${dirs.join(" or ")}: a GGUF file carries its tokenizer`)
}

/** Write the model at `dir` (a checkpoint, a run directory or an adapter with `merge`) as one GGUF file at `out`. */
export const exportGguf = (dir: string, out: string, type: GgufExport.ExportType, options: ExportOptions = {}) =>
  Effect.scoped(
    Effect.gen(function* () {
      const source = yield* resolveCheckpoint(dir)
      const model = yield* loadMerged(source, options)
      const adapter = yield* Effect.promise(() => Checkpointer.adapterSourceOf(source))
      const bytes = yield* Effect.tryPromise({
        try: async () => {
          const base = options.base ?? adapter?.base
          const tokenizer = await tokenizerFilesOf(base === undefined ? [source] : [source, base])
          await fs.mkdir(path.dirname(path.resolve(out)), { recursive: true })
          return GgufExport.write(out, {
            config: model.config,
            arrays: await Transformer.toHfArrays(model),
            tokenizer,
            type,
            name: path.basename(path.resolve(out)).replace(/\.gguf$/, "")
          })
        },
        catch: DiskFull.orElse(
          out,
          (cause) =>
            new CheckpointError({ path: out, message: cause instanceof Error ? cause.message : String(cause) }),
          "free space, then export again"
        )
      })
      return {
        event: "export",
        format: "gguf",
        source,
        out,
        type,
        bytes,
        parameters: ModelConfig.parameterCount(model.config)
      }
    })
  )

/** The config of an adapter's base: `--base`, the one its adapter_config.json names, or the run's `model.init`. */
const adapterBaseConfig = (source: string, adapter: Checkpointer.AdapterSource, base: string | undefined) =>
  Effect.gen(function* () {
    const named = base ?? adapter.base
    if (named === undefined) {
      const init = yield* runInitOf(source)
      if (init !== undefined) return ModelConfig.fromInit(init)
      return yield* new ConfigError({
        path: "--base",
        message: `${adapter.adapterDir}/adapter_config.json names no base model: pass --base DIR (the model the run trained over)`
      })
    }
    return yield* Effect.tryPromise({
      try: () => Checkpoint.readConfig(HfCache.resolve(named)),
      catch: (cause) =>
        new CheckpointError({
          path: named,
          message: `the adapter's base: ${cause instanceof Error ? cause.message : String(cause)}`
        })
    })
  })

/**
 * Write the LoRA adapter at `dir` (a LoRA run, its checkpoint, or a PEFT directory) as a GGUF LoRA adapter at `out`,
 * shaped for its base (`options.base`, the base its adapter_config.json names, or the run's `model.init`).
 */
export const exportGgufAdapter = (
  dir: string,
  out: string,
  type: GgufExport.ExportType,
  options: Pick<ExportOptions, "base"> = {}
) =>
  Effect.gen(function* () {
    const source = yield* resolveCheckpoint(dir)
    const adapter = yield* Effect.promise(() => Checkpointer.adapterSourceOf(source))
    if (adapter === undefined) {
      return yield* new ConfigError({
        path: "--adapter",
        message: `${source} holds a whole model, not a LoRA adapter (no adapter_config.json): drop --adapter to export it`
      })
    }
    const config = yield* adapterBaseConfig(source, adapter, options.base)
    const weightsFile = path.join(adapter.adapterDir, Lora.weightsFile)
    const written = yield* Effect.tryPromise({
      try: async () => {
        const weights = await Lora.readDir(adapter.adapterDir)
        await fs.mkdir(path.dirname(path.resolve(out)), { recursive: true })
        const bytes = await GgufLora.writeAdapter(out, {
          config,
          adapter: weights,
          type,
          name: path.basename(path.resolve(out)).replace(/\.gguf$/, ""),
          source: weightsFile
        })
        return { bytes, weights }
      },
      catch: (cause) => {
        const at = cause instanceof Checkpoint.CheckpointLoadError ? cause.path : weightsFile
        const message = cause instanceof Error ? cause.message : String(cause)
        return new CheckpointError({
          path: at,
          message: message.startsWith(`${at}: `) ? message.slice(at.length + 2) : message
        })
      }
    })
    return {
      event: "export",
      format: "gguf-lora",
      source: adapter.adapterDir,
      out,
      type,
      bytes: written.bytes,
      architecture: config.architecture,
      rank: written.weights.rank,
      alpha: written.weights.alpha,
      modules: written.weights.names.length / 2
    }
  })

const exportCommand = Command.make(
  "export",
  {
    model: modelFlag,
    out: Flag.String("out").pipe(Flag.withDescription("the HF directory (or, with --format gguf, the file) to write")),
    format: Flag.Literals("format", ["hf", "gguf"]).pipe(
      Flag.withDefault("hf"),
      Flag.withDescription("hf: a HF directory; gguf: one GGUF file for llama.cpp / Ollama")
    ),
    dtype: Flag.Literals("dtype", ["f32", "bf16"]).pipe(
      Flag.withDefault("f32"),
      Flag.withDescription("weight dtype (--format hf)")
    ),
    type: Flag.Literals("type", ["f32", "f16", "bf16", "q8_0"]).pipe(
      Flag.withDefault("f32"),
      Flag.withDescription("tensor type of the 2-D weights (--format gguf; norms and biases stay f32)")
    ),
    merge: Flag.Boolean("merge").pipe(
      Flag.withDefault(false),
      Flag.withDescription("fold a LoRA adapter (a LoRA run's checkpoint, a PEFT directory) into its base")
    ),
    base: Flag.String("base").pipe(
      Flag.withDescription("the adapter's base model directory (default: the one its adapter_config.json names)"),
      Flag.optional
    ),
    adapter: Flag.Boolean("adapter").pipe(
      Flag.withDefault(false),
      Flag.withDescription(
        "with --format gguf: write a LoRA adapter (a LoRA run's checkpoint, a PEFT directory) alone, as a GGUF LoRA " +
          "adapter for llama.cpp --lora / Ollama ADAPTER over the base's own GGUF export"
      )
    )
  },
  ({ model, out, format, dtype, type, merge, base, adapter }) =>
    Effect.gen(function* () {
      if (adapter && (format !== "gguf" || merge)) {
        return yield* new ConfigError({
          path: "--adapter",
          message:
            format !== "gguf"
              ? "--adapter writes a GGUF LoRA adapter: add --format gguf (for a PEFT adapter, use the checkpoint's adapter/ directory as it is)"
              : "--adapter writes the adapter alone and --merge folds it into its base: pass one of them"
        })
      }
      yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
      const options = { merge, ...(Option.isSome(base) ? { base: base.value } : {}) }
      const result = adapter
        ? yield* exportGgufAdapter(model, out, ggufTypes[type], options)
        : format === "gguf"
          ? yield* exportGguf(model, out, ggufTypes[type], options)
          : yield* exportHf(model, out, dtype === "bf16" ? "BF16" : "F32", options)
      yield* Console.log(JSON.stringify(result))
    })
).pipe(
  Command.withDescription("Write a checkpoint (or a run's latest) as a plain HF directory or a GGUF file"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --model runs/quickstart --out runs/quickstart/hf`,
      description: "the run's latest checkpoint as a HF directory"
    },
    {
      command: `${commandPath.join(" ")} --model runs/quickstart-lora --merge --out runs/quickstart-lora/merged`,
      description: "a LoRA run's adapter merged into its base"
    },
    {
      command: `${commandPath.join(" ")} --model runs/quickstart --format gguf --type q8_0 --out runs/quickstart/policy.gguf`,
      description: "a GGUF file for llama.cpp / Ollama"
    },
    {
      command: `${commandPath.join(" ")} --model runs/quickstart-lora --format gguf --adapter --out runs/quickstart-lora/adapter.gguf`,
      description: "a LoRA run's adapter as a GGUF LoRA adapter (llama-cli --lora, Ollama ADAPTER)"
    }
  ])
)

const ggufTypes = { f32: "F32", f16: "F16", bf16: "BF16", q8_0: "Q8_0" } as const

export const command = Command.make("model").pipe(
  Command.withDescription("Inspect, evaluate and export HF-layout checkpoints"),
  Command.withSubcommands([infoCommand, logprobsCommand, exportCommand])
)
