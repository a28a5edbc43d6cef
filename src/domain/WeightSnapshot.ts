/**
 * Weights as plain data: what crosses from the trainer to inference engines (style.md §15). Each side owns its
 * tensors; only typed arrays and shapes cross. Construction validates that every array matches its shape.
 */
import type { PolicyVersion } from "./PolicyVersion.ts"

/**
 * A LoRA adapter as PEFT saves it (`adapter_config.json` + `adapter_model.safetensors`): tensor names
 * `base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r].
 */
export interface AdapterWeights {
  readonly rank: number // r
  readonly alpha: number // the update is scaled by alpha / r
  readonly dropout: number // training only; engines sample without it
  readonly targetModules: ReadonlyArray<string> // last name components, e.g. q_proj, down_proj
  readonly names: ReadonlyArray<string>
  readonly shapes: ReadonlyArray<ReadonlyArray<number>>
  readonly data: ReadonlyArray<Float32Array>
}

/**
 * A version's weights. Full weights: `names`/`shapes`/`data` (all tensors, or the subset that changed). A LoRA run's
 * versions carry `adapter` instead (and no full tensors): the base the engine already holds is unchanged, and the
 * engine replaces its adapter with this one (applied unmerged or merged, its choice).
 */
export interface WeightSnapshot {
  readonly version: PolicyVersion
  readonly names: ReadonlyArray<string> // HF tensor names, e.g. model.layers.0.self_attn.q_proj.weight
  readonly shapes: ReadonlyArray<ReadonlyArray<number>>
  readonly data: ReadonlyArray<Float32Array>
  readonly adapter?: AdapterWeights
}

export const make = (snapshot: WeightSnapshot): WeightSnapshot => {
  if (snapshot.adapter !== undefined) checkArrays("adapter", snapshot.adapter)
  checkArrays("", snapshot)
  return snapshot
}

const checkArrays = (
  what: string,
  { names, shapes, data }: Pick<WeightSnapshot, "names" | "shapes" | "data">
): void => {
  if (names.length !== shapes.length || names.length !== data.length) {
    throw new Error(
      `WeightSnapshot${what === "" ? "" : ` ${what}`}: ${names.length} names, ${shapes.length} shapes, ${data.length} arrays`
    )
  }
  names.forEach((name, i) => {
    const size = shapes[i]!.reduce((a, b) => a * b, 1)
    if (data[i]!.length !== size) {
      throw new Error(`WeightSnapshot: ${name} has ${data[i]!.length} values for shape [${shapes[i]!.join(", ")}]`)
    }
  })
}

/** The bytes a sync moves: the full tensors, plus the adapter's. */
export const byteSize = (snapshot: WeightSnapshot): number =>
  snapshot.data.reduce((n, a) => n + a.byteLength, 0) +
  (snapshot.adapter?.data.reduce((n, a) => n + a.byteLength, 0) ?? 0)
