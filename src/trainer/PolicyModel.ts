/**
 * The policy's weights and their one owner (style.md §17): a Transformer loaded from a HF checkpoint directory or
 * initialised at random, disposed when the layer's scope closes. The trainer updates these variables in place; an
 * in-process engine samples from the same variables (InProcess weight sync shares tensors, it copies nothing).
 */
import * as tf from "@tensorflow/tfjs"
import { Context, Effect, Layer } from "effect"
import * as TensorBackend from "../backend/TensorBackend.ts"
import type { ModelConfig } from "../config/ModelConfig.ts"
import { CheckpointError } from "../domain/Errors.ts"
import * as Checkpoint from "../model/Checkpoint.ts"
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

/** Load or initialise the model described by `config`. Fails with CheckpointError naming the directory. */
export const load = (config: ModelConfig): Effect.Effect<Transformer.Transformer, CheckpointError> => {
  if (config.path !== undefined) {
    const dir = config.path
    return Effect.tryPromise({
      try: async () => {
        TensorBackend.checkModelFits(await Checkpoint.readConfig(dir), useOf(config))
        return TensorFile.load(dir)
      },
      catch: (cause) =>
        new CheckpointError({ path: dir, message: cause instanceof Error ? cause.message : String(cause) })
    }).pipe(Effect.map((loaded) => loaded.model))
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
  })
}

export const make = Effect.fn("PolicyModel.make")(function* (config: ModelConfig) {
  const model = yield* Effect.acquireRelease(load(config), (m) => Effect.sync(() => Transformer.dispose(m)))
  yield* Effect.logDebug(
    `policy: ${model.config.architecture}, ${HfConfig.parameterCount(model.config).toLocaleString()} parameters, ` +
      `${tf.memory().numTensors} tensors live`
  )
  return PolicyModel.of({ model, source: config.path ?? `init:${config.init?.seed ?? 0}` })
})

export const layer = (config: ModelConfig): Layer.Layer<PolicyModel, CheckpointError> =>
  Layer.effect(PolicyModel, make(config))
