/**
 * Weight snapshots (domain/WeightSnapshot.ts): the plain-data form weights cross between the trainer and inference
 * engines in. Names and shapes are HF's (linear weights `[out, in]`), so a snapshot is also what a remote vLLM would
 * be sent. LoRA adapters are merged into the snapshot (W + s·B·A), so engines never need to know about them.
 */
import * as tf from "../tensor/Tf.ts"
import type { PolicyVersion } from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as Lora from "./Lora.ts"
import * as Transformer from "./Transformer.ts"

/**
 * Export the model's effective weights (adapters merged) as a snapshot at `version`. Async (webgpu has no synchronous
 * download); the weights must not change until it resolves.
 */
export const fromModel = async (
  model: Transformer.Transformer,
  version: PolicyVersion
): Promise<WeightSnapshot.WeightSnapshot> => {
  const arrays = await Transformer.toHfArrays(model)
  const data: Array<Float32Array> = []
  for (const t of arrays) {
    const adapter = model.adapters.get(t.name.replace(/\.weight$/, ""))
    if (adapter === undefined) {
      data.push(t.data)
      continue
    }
    // held Δ = s · Aᵀ Bᵀ [in, out]; HF layout is its transpose [out, in]
    const deltaTensor = tf.tidy(() => tf.transpose(tf.mul(tf.matMul(adapter.a, adapter.b), adapter.scale))) // [out, in]
    const delta = await deltaTensor.data().finally(() => deltaTensor.dispose())
    const out = new Float32Array(t.data)
    for (let i = 0; i < out.length; i++) out[i] = out[i]! + delta[i]!
    data.push(out)
  }
  return WeightSnapshot.make({ version, names: arrays.map((t) => t.name), shapes: arrays.map((t) => t.shape), data })
}

/** The attached adapter alone (no full tensors) as a snapshot at `version`: what a LoRA run's weight sync sends. */
export const adapterOf = async (
  model: Transformer.Transformer,
  version: PolicyVersion
): Promise<WeightSnapshot.WeightSnapshot> =>
  WeightSnapshot.make({ version, names: [], shapes: [], data: [], adapter: await Lora.toWeights(model) })

/**
 * The base weights, unmerged, and the attached adapter (when there is one): an engine that applies adapters itself
 * starts from this and then takes `adapterOf` snapshots.
 */
export const withAdapter = async (
  model: Transformer.Transformer,
  version: PolicyVersion
): Promise<WeightSnapshot.WeightSnapshot> => {
  const arrays = await Transformer.toHfArrays(model)
  return WeightSnapshot.make({
    version,
    names: arrays.map((t) => t.name),
    shapes: arrays.map((t) => t.shape),
    data: arrays.map((t) => t.data),
    ...(model.adapters.size === 0 ? {} : { adapter: await Lora.toWeights(model) })
  })
}

/**
 * Overwrite the model's weights in place from a snapshot (all of them or a subset), and replace its adapter with the
 * snapshot's when it carries one. Throws on an unknown name or a shape mismatch before changing any weight.
 */
export const load = (model: Transformer.Transformer, snapshot: WeightSnapshot.WeightSnapshot): void => {
  snapshot.names.forEach((name, i) => {
    const variable = model.params.get(name)
    if (variable === undefined) throw new Error(`snapshot weight ${name} is not in the model`)
    const shape = snapshot.shapes[i]!
    const held = Transformer.isTransposed(name) ? [shape[1], shape[0]] : shape
    if (held.length !== variable.shape.length || held.some((d, j) => d !== variable.shape[j])) {
      throw new Error(`snapshot weight ${name} has shape [${shape.join(", ")}], the model's differs`)
    }
  })
  snapshot.names.forEach((name, i) => {
    Transformer.assignHf(model, name, snapshot.shapes[i]!, snapshot.data[i]!)
  })
  if (snapshot.adapter !== undefined) Lora.attachWeights(model, snapshot.adapter)
}
