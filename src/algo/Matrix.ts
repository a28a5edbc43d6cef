/**
 * The plain-array boundary of the algo core: `[B][T]` rows of numbers, as a SkyRL user passes them, to and
 * from float32 tensors. Rows must all have the same length; a ragged batch is a caller bug, reported here
 * with the argument's name rather than as a tfjs shape error deep inside a loss.
 *
 * The plain-array functions (`PolicyLoss.compute`, `Kl.estimate`, `Kl.applyKlPenalty`) are synchronous: their
 * inputs are small, and every backend but webgpu in Node reads a tensor back synchronously.
 */
import * as tf from "../tensor/Tf.ts"

/** Rows of numbers, `[B][T]`. */
export type Rows = ReadonlyArray<ReadonlyArray<number>>

/** `[B][T]` → float32 `[B, T]`. Throws a RangeError naming `name` if the rows are ragged. */
export const toTensor = (rows: Rows, name: string): tf.Tensor2D => {
  const width = rows[0]?.length ?? 0
  rows.forEach((row, b) => {
    if (row.length !== width) throw new RangeError(`${name}: row ${b} has ${row.length} entries, row 0 has ${width}`)
  })
  return tf.tensor2d(rows as Array<Array<number>>, [rows.length, width], "float32")
}

/** Throws a RangeError unless `rows` is `[B][T]` with the same B and T as `like`. */
export const assertSameShape = (rows: Rows, like: Rows, name: string, likeName: string): void => {
  const same = rows.length === like.length && rows.every((row, b) => row.length === (like[b]?.length ?? -1))
  if (!same) throw new RangeError(`${name} must have the shape of ${likeName}`)
}

/** float32 `[B, T]` → `[B][T]`, read synchronously; the tensor is disposed. */
export const readRows = (tensor: tf.Tensor2D): Array<Array<number>> => {
  try {
    return tensor.arraySync()
  } finally {
    tensor.dispose()
  }
}

/**
 * Throws a RangeError, naming `caller` and saying what to call `instead`, when the active backend cannot read a tensor
 * synchronously: tfjs-backend-webgpu's `readSync` needs `OffscreenCanvas`, which Node lacks. The CPU backends
 * (cpu, wasm, native, tensorflow) read synchronously.
 */
export const assertSyncRead = (caller: string, instead: string): void => {
  if (tf.getBackend() === "webgpu" && !("OffscreenCanvas" in globalThis)) {
    throw new RangeError(
      `${caller} reads its result synchronously, which the webgpu backend cannot do in Node: ${instead}`
    )
  }
}
