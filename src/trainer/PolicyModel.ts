/**
 * The policy's weights and their one owner (style.md §17): a Transformer loaded from a HF checkpoint directory or
 * initialised at random, disposed when the layer's scope closes. The trainer updates these variables in place; an
 * in-process engine samples from the same variables (InProcess weight sync shares tensors, it copies nothing).
 *
 * With `model.lora.rank > 0` the base is frozen and LoRA adapters are attached to `model.lora.target_modules`: fresh
 * ones (A seeded, B zero: the policy starts equal to the base), or a saved PEFT adapter (`adapterDir`: a LoRA run's
 * checkpoint being resumed). `model.lora.base_dtype: bfloat16` keeps the frozen projections as bfloat16 on the native
 * backend, narrowed as each loads.
 */
import * as tf from "../tensor/Tf.ts"
import { Context, Effect, Layer } from "effect"
import * as NativeBackend from "../backend/NativeBackend.ts"
import * as TensorBackend from "../backend/TensorBackend.ts"
import type { ModelConfig } from "../config/ModelConfig.ts"
import { CheckpointError } from "../domain/Errors.ts"
import * as Checkpoint from "../model/Checkpoint.ts"
import * as HfCache from "../model/HfCache.ts"
import * as Lora from "../model/Lora.ts"
import * as HfConfig from "../model/ModelConfig.ts"
import * as Transformer from "../model/Transformer.ts"
import * as TensorFile from "../native/TensorFile.ts"

export class PolicyModel extends Context.Service<
  PolicyModel,
  {
    readonly model: Transformer.Transformer
    /** where the weights came from: a directory, or `init:<seed>` */
    readonly source: string
  }
>()("rl/trainer/PolicyModel") {}

/** A policy is loaded to be trained: its adapters only when LoRA is configured. */
const useOf = (config: ModelConfig): TensorBackend.ModelUse => (config.lora.rank > 0 ? "lora-training" : "training")

/** `model.lora` as the adapters take it; undefined unless rank > 0 (no adapters). */
export const loraOptions = (config: ModelConfig["lora"]): Lora.LoraOptions | undefined =>
  config.rank > 0
    ? { rank: config.rank, alpha: config.alpha, dropout: config.dropout, targetModules: config.target_modules }
    : undefined

export interface LoadOptions {
  /** A PEFT adapter directory to attach instead of fresh adapters (LoRA runs only). */
  readonly adapterDir?: string
}

/** The projections a LoRA run's adapters leave frozen (`model.lora.base_dtype: bfloat16` stores them as bf16). */
const frozenBy = (lora: Lora.LoraOptions) => (name: string) =>
  name.endsWith("_proj.weight") && lora.targetModules.includes(name.slice(0, -".weight".length).split(".").pop()!)

/** Attach `model.lora`'s adapters (or the saved ones), freezing the base; no-op without LoRA. */
const withAdapters = (
  model: Transformer.Transformer,
  config: ModelConfig,
  options: LoadOptions
): Effect.Effect<Transformer.Transformer, CheckpointError> => {
  const lora = loraOptions(config.lora)
  if (lora === undefined) return Effect.succeed(model)
  const dir = options.adapterDir
  return Effect.tryPromise({
    try: async () => {
      if (dir === undefined) Lora.attach(model, lora, 0)
      else {
        const saved = await Lora.load(model, dir)
        if (saved.rank !== lora.rank || saved.alpha !== lora.alpha)
          throw new Error(
            `the adapter has r ${saved.rank}, lora_alpha ${saved.alpha}; model.lora has rank ${lora.rank}, alpha ${lora.alpha}`
          )
      }
      if (config.lora.base_dtype === "bfloat16") Transformer.storeFrozen(model, NativeBackend.storeBf16)
      return model
    },
    catch: (cause) =>
      new CheckpointError({
        path: dir ?? "model.lora",
        message: cause instanceof Error ? cause.message : String(cause)
      })
  }).pipe(Effect.tapError(() => Effect.sync(() => Transformer.dispose(model))))
}

/** Load or initialise the model described by `config`. Fails with CheckpointError naming the directory. */
export const load = (
  config: ModelConfig,
  options: LoadOptions = {}
): Effect.Effect<Transformer.Transformer, CheckpointError> => {
  const lora = loraOptions(config.lora)
  if (config.lora.base_dtype === "bfloat16" && lora !== undefined && tf.getBackend() !== NativeBackend.name) {
    return Effect.fail(
      new CheckpointError({
        path: "model.lora.base_dtype",
        message: `bfloat16 base weights need backend.name: native (the active backend is ${tf.getBackend()}): use float32`
      })
    )
  }
  if (config.path !== undefined) {
    const spec = config.path
    const frozen = lora === undefined || config.lora.base_dtype !== "bfloat16" ? undefined : frozenBy(lora)
    return Effect.tryPromise({
      try: async () => {
        const dir = HfCache.resolve(spec) // a directory, or org/name[@revision] from the Hugging Face cache
        TensorBackend.checkModelFits(await Checkpoint.readConfig(dir), useOf(config))
        return TensorFile.load(
          dir,
          frozen === undefined ? {} : { store: (name, v) => void (frozen(name) && NativeBackend.storeBf16(v)) }
        )
      },
      catch: (cause) =>
        new CheckpointError({ path: spec, message: cause instanceof Error ? cause.message : String(cause) })
    }).pipe(Effect.flatMap((loaded) => withAdapters(loaded.model, config, options)))
  }
  const init = config.init!
  return Effect.try({
    try: () => {
      const shape = HfConfig.fromInit(init)
      TensorBackend.checkModelFits(shape, useOf(config))
      return Transformer.init(shape, init.seed)
    },
    catch: (cause) =>
      new CheckpointError({ path: "model.init", message: cause instanceof Error ? cause.message : String(cause) })
  }).pipe(Effect.flatMap((model) => withAdapters(model, config, options)))
}

export const make = Effect.fn("PolicyModel.make")(function* (config: ModelConfig, options: LoadOptions = {}) {
  const model = yield* Effect.acquireRelease(load(config, options), (m) => Effect.sync(() => Transformer.dispose(m)))
  yield* Effect.logDebug(
    `policy: ${model.config.architecture}, ${HfConfig.parameterCount(model.config).toLocaleString()} parameters, ` +
      `${tf.memory().numTensors} tensors live`
  )
  return PolicyModel.of({ model, source: config.path ?? `init:${config.init?.seed ?? 0}` })
})

export const layer = (config: ModelConfig, options: LoadOptions = {}): Layer.Layer<PolicyModel, CheckpointError> =>
  Layer.effect(PolicyModel, make(config, options))
