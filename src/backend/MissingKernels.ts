/**
 * Kernels that some tfjs backends lack, registered so every op training needs works on every backend.
 *
 * wasm (tfjs 4.22) has no `UnsortedSegmentSum`, which is the gradient of `tf.gather` (embedding lookups): without
 * it, backprop through an embedding throws "Kernel 'UnsortedSegmentSum' not registered for backend 'wasm'".
 */
import * as tf from "../tensor/Tf.ts"

interface HeapBackend {
  readSync(dataId: object): ArrayLike<number>
  makeOutput(shape: Array<number>, dtype: tf.DataType): tf.TensorInfo
  typedArrayFromHeap(info: tf.TensorInfo): Float32Array | Int32Array
}

/**
 * out[s, …] = Σ_{i : segmentIds[i] = s} x[i, …], for segmentIds of any rank r over the first r axes of x.
 * Ids outside [0, numSegments) are dropped, as in TensorFlow.
 */
const unsortedSegmentSum: tf.KernelFunc = ({ inputs, backend, attrs }) => {
  const { x, segmentIds } = inputs as { x: tf.TensorInfo; segmentIds: tf.TensorInfo }
  const { numSegments } = attrs as unknown as { numSegments: number }
  const heap = backend as unknown as HeapBackend
  const xValues = heap.readSync(x.dataId)
  const ids = heap.readSync(segmentIds.dataId)
  const inner = x.shape.slice(segmentIds.shape.length).reduce((a, b) => a * b, 1) // elements per segment row
  const out = heap.makeOutput([numSegments, ...x.shape.slice(segmentIds.shape.length)], x.dtype)
  const outValues = heap.typedArrayFromHeap(out)
  outValues.fill(0)
  for (let i = 0; i < ids.length; i++) {
    const s = ids[i]!
    if (s < 0 || s >= numSegments) continue
    const src = i * inner
    const dst = s * inner
    for (let j = 0; j < inner; j++) outValues[dst + j]! += xValues[src + j]!
  }
  return out
}

/** Register what `backendName` lacks. Idempotent. */
export const register = (backendName: string): ReadonlyArray<string> => {
  const added: Array<string> = []
  if (backendName === "wasm" && tf.getKernel("UnsortedSegmentSum", "wasm") === undefined) {
    tf.registerKernel({ kernelName: "UnsortedSegmentSum", backendName: "wasm", kernelFunc: unsortedSegmentSum })
    added.push("UnsortedSegmentSum")
  }
  return added
}
