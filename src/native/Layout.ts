/**
 * Layout maths for the native kernels: how a tensor's elements are reached from the output's index. Batch offsets of
 * a broadcast matmul, a broadcast element-wise op collapsed to the ≤ 4 dims the addon takes, and a strided view
 * (transpose, slice) with the axes that can merge merged. Pure functions of shapes; no tensors.
 */

export const sizeOf = (shape: ReadonlyArray<number>): number => shape.reduce((a, b) => a * b, 1)

/** Row-major strides of a contiguous tensor of `shape`, in elements. */
export const contiguousStrides = (shape: ReadonlyArray<number>): Array<number> => {
  const strides = new Array<number>(shape.length)
  let stride = 1
  for (let d = shape.length - 1; d >= 0; d--) {
    strides[d] = stride
    stride *= shape[d]!
  }
  return strides
}

/**
 * Element offsets of each output batch's matrix in an input whose batch dims `dims` broadcast to `outDims`:
 * a stride when the input is not broadcast (or is one matrix), else an explicit index per output batch.
 */
export const batchLayout = (
  dims: ReadonlyArray<number>,
  outDims: ReadonlyArray<number>,
  matrixSize: number
): { stride: number; index: Int32Array | null } => {
  const size = sizeOf(dims)
  const outSize = sizeOf(outDims)
  if (size === outSize) return { stride: matrixSize, index: null }
  if (size === 1) return { stride: 0, index: null }
  const padded = [...new Array<number>(outDims.length - dims.length).fill(1), ...dims]
  const index = new Int32Array(outSize)
  for (let o = 0; o < outSize; o++) {
    let rest = o
    let offset = 0
    let stride = 1
    for (let d = outDims.length - 1; d >= 0; d--) {
      const coord = rest % outDims[d]!
      rest = Math.floor(rest / outDims[d]!)
      if (padded[d]! !== 1) offset += coord * stride
      stride *= padded[d]!
    }
    index[o] = offset * matrixSize
  }
  return { stride: 0, index }
}

type Four = [number, number, number, number]

/** A broadcast element-wise op over a 4-d out: its dims and each input's strides (0 where broadcast). */
export interface Broadcast4 {
  readonly dims: Four
  readonly aStrides: Four
  readonly bStrides: Four
}

/**
 * Broadcast a and b to `outShape` and collapse it to ≤ 4 dims: adjacent dims merge when both inputs step through them
 * alike (both contiguous, or both broadcast). Returns undefined when more than 4 dims remain.
 */
export const broadcastLayout = (
  aShape: ReadonlyArray<number>,
  bShape: ReadonlyArray<number>,
  outShape: ReadonlyArray<number>
): Broadcast4 | undefined => {
  const rank = outShape.length
  const stridesOf = (shape: ReadonlyArray<number>): Array<number> => {
    const padded = [...new Array<number>(rank - shape.length).fill(1), ...shape]
    const strides = new Array<number>(rank).fill(0)
    let stride = 1
    for (let d = rank - 1; d >= 0; d--) {
      strides[d] = padded[d] === 1 ? 0 : stride
      stride *= padded[d]!
    }
    return strides
  }
  const sa = stridesOf(aShape)
  const sb = stridesOf(bShape)
  // Collapsed dims, innermost first.
  const dims: Array<number> = []
  const as: Array<number> = []
  const bs: Array<number> = []
  for (let d = rank - 1; d >= 0; d--) {
    const n = outShape[d]!
    if (n === 1) continue
    const last = dims.length - 1
    if (last >= 0 && sa[d] === as[last]! * dims[last]! && sb[d] === bs[last]! * dims[last]!) {
      dims[last]! *= n
    } else {
      dims.push(n)
      as.push(sa[d]!)
      bs.push(sb[d]!)
    }
  }
  if (dims.length > 4) return undefined
  while (dims.length < 4) {
    dims.push(1)
    as.push(0)
    bs.push(0)
  }
  // Contiguous stride 1 is what the kernel's fast loops look for; a size-1 innermost dim had stride 0.
  return { dims: dims.reverse() as Four, aStrides: as.reverse() as Four, bStrides: bs.reverse() as Four }
}

/**
 * A strided view of an input, read into a contiguous out of `outShape`, where out axis k steps `strides[k]` input
 * elements: axis k merges into k−1 when the two walk the input as one axis; size-1 axes drop out. At least one axis
 * remains (a single element is [1] with stride 1). This is the addon's `transpose` (Transpose, Slice).
 */
export const stridedView = (
  outShape: ReadonlyArray<number>,
  strides: ReadonlyArray<number>
): { outShape: Int32Array; inStrides: Int32Array } => {
  const shape: Array<number> = []
  const steps: Array<number> = []
  for (let k = 0; k < outShape.length; k++) {
    const n = outShape[k]!
    if (n === 1) continue
    const s = strides[k]!
    const last = shape.length - 1
    if (last >= 0 && steps[last] === s * n) {
      shape[last]! *= n
      steps[last] = s
    } else {
      shape.push(n)
      steps.push(s)
    }
  }
  if (shape.length === 0) {
    shape.push(1)
    steps.push(1)
  }
  return { outShape: Int32Array.from(shape), inStrides: Int32Array.from(steps) }
}
