/**
 * Weights as plain data: what crosses from the trainer to inference engines (style.md §15). Each side owns its
 * tensors; only typed arrays and shapes cross. Construction validates that every array matches its shape.
 */
import type { PolicyVersion } from "./PolicyVersion.ts"

export interface WeightSnapshot {
  readonly version: PolicyVersion
  readonly names: ReadonlyArray<string> // HF tensor names, e.g. model.layers.0.self_attn.q_proj.weight
  readonly shapes: ReadonlyArray<ReadonlyArray<number>>
  readonly data: ReadonlyArray<Float32Array>
}

export const make = (snapshot: WeightSnapshot): WeightSnapshot => {
  const { names, shapes, data } = snapshot
  if (names.length !== shapes.length || names.length !== data.length) {
    throw new Error(`WeightSnapshot: ${names.length} names, ${shapes.length} shapes, ${data.length} arrays`)
  }
  names.forEach((name, i) => {
    const size = shapes[i]!.reduce((a, b) => a * b, 1)
    if (data[i]!.length !== size) {
      throw new Error(`WeightSnapshot: ${name} has ${data[i]!.length} values for shape [${shapes[i]!.join(", ")}]`)
    }
  })
  return snapshot
}

export const byteSize = (snapshot: WeightSnapshot): number => snapshot.data.reduce((n, a) => n + a.byteLength, 0)
