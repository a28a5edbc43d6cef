/**
 * Weight snapshots (domain/WeightSnapshot.ts): the plain-data form weights cross between the trainer and inference
 * engines in. Names and shapes are HF's (linear weights `[out, in]`), so a snapshot is also what a remote vLLM would
 * be sent. LoRA adapters are merged into the snapshot (W + s·B·A), so engines never need to know about them.
 */
import * as tf from "@tensorflow/tfjs"
import type { PolicyVersion } from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as Transformer from "./Transformer.ts"

/** Export the model's effective weights (adapters merged) as a snapshot at `version`. Reads synchronously. */
export const fromModel = (model: Transformer.Transformer, version: PolicyVersion): WeightSnapshot.WeightSnapshot => {
  const arrays = Transformer.toHfArrays(model)
  const data = arrays.map((t) => {
    const adapter = model.adapters.get(t.name.replace(/\.weight$/, ""))
    if (adapter === undefined) return t.data
    // held Δ = s · Aᵀ Bᵀ [in, out]; HF layout is its transpose [out, in]
    const delta = tf.tidy(() => tf.transpose(tf.mul(tf.matMul(adapter.a, adapter.b), adapter.scale)).dataSync())
    const out = new Float32Array(t.data)
    for (let i = 0; i < out.length; i++) out[i] = out[i]! + delta[i]!
    return out
  })
  return WeightSnapshot.make({ version, names: arrays.map((t) => t.name), shapes: arrays.map((t) => t.shape), data })
}

/**
 * Overwrite the model's weights in place from a snapshot (all of them or a subset). Throws on an unknown name or a
 * shape mismatch before changing anything.
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
}
