/**
 * Native CPU kernels (native/kernels.cc, an N-API addon built by `npm ci`) registered into the tfjs wasm backend.
 *
 * Why wasm and not cpu: wasm is the embedded default, keeps every tensor in one linear heap that native code can read
 * and write in place (`backend.wasm.HEAPU8` + `dataIdMap.get(dataId).memoryOffset`), and its stock kernels for the
 * ops we leave alone are 10–100× faster than the pure-JS cpu backend's. The wasm heap can grow on any allocation,
 * which detaches the old ArrayBuffer, so every kernel takes `HEAPU8` fresh after it has allocated its output.
 *
 * Each native kernel handles the float32 cases it knows and hands anything else to the stock kernel it replaced, so
 * registering never changes which programs run, only how fast. `unregister` restores the stock kernels (tests compare
 * both in one process). When the addon did not build, `register` returns no kernels and warns once.
 */

import { existsSync, readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import * as tf from "@tensorflow/tfjs"

/** The addon's exports (native/kernels.cc). Offsets are bytes into `heap`; strides and indices are elements. */
interface Addon {
  readonly info: () => { blas: string; threads: number; scratchBytes: number; calls: number; simd: string }
  readonly setThreads: (threads: number) => void
  readonly matmul: (
    heap: Uint8Array,
    a: number,
    b: number,
    out: number,
    batch: number,
    aBatchStride: number,
    bBatchStride: number,
    m: number,
    n: number,
    k: number,
    transposeA: boolean,
    transposeB: boolean,
    bias: number,
    activation: number,
    alpha: number,
    aBatchIndex: Int32Array | null,
    bBatchIndex: Int32Array | null
  ) => void
  /** out[i] = op(a[Σ i_k·aStride_k], b[Σ i_k·bStride_k]) over a 4-d out; float32 in, float32 or bool out. */
  readonly binary: (
    heap: Uint8Array,
    op: number,
    compare: boolean,
    a: number,
    b: number,
    out: number,
    ...dimsAndStrides: Array<number> // d0..d3, aStride0..3, bStride0..3
  ) => void
  readonly unary: (heap: Uint8Array, op: number, x: number, out: number, n: number, alpha: number) => void
  /** x as [outer, reduce, inner] → out [outer, inner]. */
  readonly reduce: (
    heap: Uint8Array,
    op: number,
    x: number,
    out: number,
    outer: number,
    red: number,
    inner: number
  ) => void
  readonly transpose: (
    heap: Uint8Array,
    x: number,
    out: number,
    elementBytes: number,
    rank: number,
    outShape: Int32Array,
    inStrides: Int32Array
  ) => void
  readonly cast: (heap: Uint8Array, kind: number, x: number, out: number, n: number) => void
  readonly softmax: (heap: Uint8Array, x: number, out: number, rows: number, n: number, log: boolean) => void
  /** x [outer, axisDim, inner] → out [outer, count, inner]; false (nothing written) when an index is out of range. */
  readonly gather: (
    heap: Uint8Array,
    x: number,
    indices: number,
    out: number,
    outer: number,
    axisDim: number,
    count: number,
    inner: number,
    elementBytes: number
  ) => boolean
  readonly adam: (
    heap: Uint8Array,
    value: number,
    grad: number,
    m: number,
    v: number,
    outValue: number,
    outM: number,
    outV: number,
    n: number,
    learningRate: number,
    beta1: number,
    beta2: number,
    epsilon: number,
    oneMinusAccBeta1: number,
    oneMinusAccBeta2: number
  ) => void
  /** Byte copies: dst[o·dstStride + :chunk] = src[o·srcStride + :chunk] for o < outer. */
  readonly copyBlocks: (
    heap: Uint8Array,
    src: number,
    dst: number,
    outer: number,
    srcStride: number,
    dstStride: number,
    chunk: number
  ) => void
  readonly rmsNorm: (
    heap: Uint8Array,
    x: number,
    w: number,
    out: number,
    rows: number,
    n: number,
    wRows: number,
    eps: number
  ) => void
  readonly rmsNormGrad: (
    heap: Uint8Array,
    x: number,
    w: number,
    dy: number,
    dx: number,
    dw: number,
    rows: number,
    n: number,
    wRows: number,
    eps: number
  ) => void
  readonly swiglu: (
    heap: Uint8Array,
    gate: number,
    up: number,
    out: number,
    rows: number,
    n: number,
    gateStride: number,
    upStride: number
  ) => void
  readonly swigluGrad: (
    heap: Uint8Array,
    gate: number,
    up: number,
    dy: number,
    dgate: number,
    dup: number,
    rows: number,
    n: number
  ) => void
  readonly rope: (
    heap: Uint8Array,
    x: number,
    cos: number,
    sin: number,
    out: number,
    n: number,
    heads: number,
    hd: number,
    backward: boolean
  ) => void
  readonly qkvPrep: (heap: Uint8Array, ...offsetsAndSizes: Array<number>) => void
  readonly attention: (heap: Uint8Array, ...offsetsAndSizes: Array<number>) => void
  readonly attentionGrad: (heap: Uint8Array, ...offsetsAndSizes: Array<number>) => void
  readonly linear: (
    heap: Uint8Array,
    a: number,
    b: number,
    out: number,
    m: number,
    n: number,
    k: number,
    residual: number,
    normEps: number
  ) => void
  readonly segmentSum: (
    heap: Uint8Array,
    x: number,
    ids: number,
    out: number,
    count: number,
    inner: number,
    numSegments: number
  ) => void
}

/** The parts of tfjs-backend-wasm's BackendWasm the kernels use. */
interface WasmBackend {
  readonly wasm: { readonly HEAPU8: Uint8Array }
  readonly dataIdMap: { get(dataId: object): { memoryOffset: number } }
  makeOutput(shape: Array<number>, dtype: tf.DataType): tf.TensorInfo
  incRef(dataId: object): void
  disposeData(dataId: object): boolean
}

export type Status =
  | { readonly available: true; readonly blas: string; readonly simd: string; readonly path: string }
  | { readonly available: false; readonly reason: string }

// ---------------------------------------------------------------------------------------------------------------
// Loading

const addonFile = join("native", "build", "Release", "effect_rl_kernels.node")

/** The package root: the nearest ancestor of this file holding native/ (src/backend in the repo, dist/src/backend built). */
const packageRoot = (): string | undefined => {
  let dir = dirname(fileURLToPath(import.meta.url))
  for (let i = 0; i < 6; i++) {
    if (existsSync(join(dir, "native", "binding.gyp"))) return dir
    dir = dirname(dir)
  }
  return undefined
}

let loaded: { addon: Addon | undefined; status: Status } | undefined

const load = (): { addon: Addon | undefined; status: Status } => {
  if (loaded !== undefined) return loaded
  const root = packageRoot()
  const path = root === undefined ? undefined : join(root, addonFile)
  if (path === undefined || !existsSync(path)) {
    let reason = "the native addon was not built"
    try {
      const statusJson = JSON.parse(readFileSync(join(root ?? ".", "native", "build", "status.json"), "utf8")) as {
        reason?: string
      }
      if (statusJson.reason !== undefined) reason = `the native addon did not build: ${statusJson.reason}`
    } catch {
      reason += " (no native/build/status.json: was `npm ci` run with scripts enabled?)"
    }
    loaded = { addon: undefined, status: { available: false, reason } }
    return loaded
  }
  try {
    const addon = createRequire(import.meta.url)(path) as Addon
    const info = addon.info()
    loaded = { addon, status: { available: true, blas: info.blas, simd: info.simd, path } }
  } catch (cause) {
    loaded = { addon: undefined, status: { available: false, reason: `loading ${path} failed: ${String(cause)}` } }
  }
  return loaded
}

/** Whether the addon loaded, and if not, why. */
export const status = (): Status => load().status

/** Native bookkeeping: scratch bytes currently held (0 between kernels) and kernel calls so far. */
export const stats = (): { readonly scratchBytes: number; readonly calls: number; readonly threads: number } => {
  const addon = load().addon
  if (addon === undefined) return { scratchBytes: 0, calls: 0, threads: 0 }
  const info = addon.info()
  return { scratchBytes: info.scratchBytes, calls: info.calls, threads: info.threads }
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels

type Stock = tf.KernelFunc
/** A native kernel: returns `undefined` to hand the call to the stock kernel. */
type NativeKernel = (
  addon: Addon,
  args: { inputs: tf.NamedTensorInfoMap; backend: WasmBackend; attrs: tf.NamedAttrMap }
) => tf.TensorInfo | Array<tf.TensorInfo> | undefined

const sizeOf = (shape: ReadonlyArray<number>): number => shape.reduce((a, b) => a * b, 1)
const offsetOf = (backend: WasmBackend, t: tf.TensorInfo): number => backend.dataIdMap.get(t.dataId).memoryOffset

/**
 * Element offsets of each output batch's matrix in an input whose batch dims `dims` broadcast to `outDims`:
 * a stride when the input is not broadcast (or is one matrix), else an explicit index per output batch.
 */
const batchLayout = (
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

const activationCode: Record<string, number> = { linear: 0, relu: 1, relu6: 2, elu: 3, leakyrelu: 4, sigmoid: 5 }

const matmul = (
  addon: Addon,
  backend: WasmBackend,
  a: tf.TensorInfo,
  b: tf.TensorInfo,
  transposeA: boolean,
  transposeB: boolean,
  bias: tf.TensorInfo | undefined,
  activation: number,
  alpha: number
): tf.TensorInfo | undefined => {
  if (a.dtype !== "float32" || b.dtype !== "float32" || a.shape.length < 2 || b.shape.length < 2) return undefined
  const aRank = a.shape.length
  const bRank = b.shape.length
  const m = transposeA ? a.shape[aRank - 1]! : a.shape[aRank - 2]!
  const k = transposeA ? a.shape[aRank - 2]! : a.shape[aRank - 1]!
  const kB = transposeB ? b.shape[bRank - 1]! : b.shape[bRank - 2]!
  const n = transposeB ? b.shape[bRank - 2]! : b.shape[bRank - 1]!
  if (k !== kB) return undefined // the stock kernel raises tfjs' own error
  const aDims = a.shape.slice(0, -2)
  const bDims = b.shape.slice(0, -2)
  let outDims: Array<number>
  try {
    outDims = tf.broadcast_util.assertAndGetBroadcastShape(aDims, bDims)
  } catch {
    return undefined
  }
  if (bias !== undefined && (bias.dtype !== "float32" || sizeOf(bias.shape) !== n || bias.shape.at(-1) !== n)) {
    return undefined
  }
  const batch = sizeOf(outDims)
  const aLayout = batchLayout(aDims, outDims, m * k)
  const bLayout = batchLayout(bDims, outDims, k * n)
  const out = backend.makeOutput([...outDims, m, n], "float32")
  addon.matmul(
    backend.wasm.HEAPU8, // after makeOutput: it may have grown the heap
    offsetOf(backend, a),
    offsetOf(backend, b),
    offsetOf(backend, out),
    batch,
    aLayout.stride,
    bLayout.stride,
    m,
    n,
    k,
    transposeA,
    transposeB,
    bias === undefined ? -1 : offsetOf(backend, bias),
    activation,
    alpha,
    aLayout.index,
    bLayout.index
  )
  return out
}

// --- element-wise

/**
 * Broadcast a and b to `outShape` and collapse it to ≤ 4 dims: adjacent dims merge when both inputs step through them
 * alike (both contiguous, or both broadcast). Returns undefined when more than 4 dims remain.
 */
const broadcastLayout = (
  aShape: ReadonlyArray<number>,
  bShape: ReadonlyArray<number>,
  outShape: ReadonlyArray<number>
): Array<number> | undefined => {
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
  dims.reverse()
  as.reverse()
  bs.reverse()
  // Contiguous stride 1 is what the kernel's fast loops look for; a size-1 innermost dim had stride 0.
  return [...dims, ...as, ...bs]
}

const binaryKernel =
  (op: number, compare: boolean): NativeKernel =>
  (addon, { inputs, backend }) => {
    const { a, b } = inputs as { a: tf.TensorInfo; b: tf.TensorInfo }
    if (a.dtype !== "float32" || b.dtype !== "float32") return undefined
    let outShape: Array<number>
    try {
      outShape = tf.broadcast_util.assertAndGetBroadcastShape(a.shape, b.shape)
    } catch {
      return undefined
    }
    const layout = broadcastLayout(a.shape, b.shape, outShape)
    if (layout === undefined) return undefined
    const out = backend.makeOutput(outShape, compare ? "bool" : "float32")
    if (sizeOf(outShape) === 0) return out
    addon.binary(
      backend.wasm.HEAPU8,
      op,
      compare,
      offsetOf(backend, a),
      offsetOf(backend, b),
      offsetOf(backend, out),
      ...layout
    )
    return out
  }

const unaryKernel =
  (op: number): NativeKernel =>
  (addon, { inputs, backend, attrs }) => {
    const { x } = inputs as { x: tf.TensorInfo }
    if (x.dtype !== "float32") return undefined
    const out = backend.makeOutput([...x.shape], "float32")
    const n = sizeOf(x.shape)
    if (n > 0) {
      const alpha = (attrs as { alpha?: number } | undefined)?.alpha ?? 0
      addon.unary(backend.wasm.HEAPU8, op, offsetOf(backend, x), offsetOf(backend, out), n, alpha)
    }
    return out
  }

/** Reductions over one contiguous run of axes (after dropping size-1 axes): x as [outer, reduce, inner]. */
const reduceKernel =
  (op: number, axisAttr: "axis" | "reductionIndices"): NativeKernel =>
  (addon, { inputs, backend, attrs }) => {
    const { x } = inputs as { x: tf.TensorInfo }
    if (x.dtype !== "float32") return undefined
    const { keepDims } = attrs as { keepDims?: boolean }
    const axes = tf.util.parseAxisParam(attrs[axisAttr] as number | Array<number>, [...x.shape]).sort((p, q) => p - q)
    const reduced = axes.filter((d) => x.shape[d]! !== 1)
    for (let i = 1; i < reduced.length; i++) {
      const between = x.shape.slice(reduced[i - 1]! + 1, reduced[i]!)
      if (between.some((n) => n !== 1)) return undefined // not one contiguous run
    }
    const first = reduced[0] ?? x.shape.length
    const last = reduced.at(-1) ?? x.shape.length - 1
    const outer = sizeOf(x.shape.slice(0, first))
    const red = reduced.length === 0 ? 1 : sizeOf(x.shape.slice(first, last + 1))
    const inner = sizeOf(x.shape.slice(last + 1))
    if (red === 0) return undefined
    const outShape =
      keepDims === true
        ? x.shape.map((n, d) => (axes.includes(d) ? 1 : n))
        : x.shape.filter((_, d) => !axes.includes(d))
    const out = backend.makeOutput(outShape, "float32")
    if (outer * inner > 0) {
      addon.reduce(backend.wasm.HEAPU8, op, offsetOf(backend, x), offsetOf(backend, out), outer, red, inner)
    }
    return out
  }

/**
 * A strided copy of `x` (the `transpose` addon call, starting at `begin`). The stock wasm Slice copies the whole input
 * out of the heap and walks it in JS for every non-contiguous slice: slicing a KV cache `[B, C, Hkv, hd]` along C
 * that way was a third of a quickstart run.
 */
const sliceKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const { x } = inputs as { x: tf.TensorInfo }
  if (x.dtype === "string" || x.dtype === "complex64") return undefined
  const { begin, size } = attrs as unknown as { begin: number | Array<number>; size?: number | Array<number> }
  const [start, outShape] = tf.slice_util.parseSliceParams(x, begin, size) as [Array<number>, Array<number>]
  const rank = x.shape.length
  const inStrides = new Array<number>(rank)
  let stride = 1
  for (let d = rank - 1; d >= 0; d--) {
    inStrides[d] = stride
    stride *= x.shape[d]!
  }
  const first = start.reduce((n, b, d) => n + b * inStrides[d]!, 0)
  // Collapse: axis k merges into k-1 when it is taken whole; size-1 axes drop out.
  const shape: Array<number> = []
  const strides: Array<number> = []
  for (let k = 0; k < rank; k++) {
    const n = outShape[k]!
    if (n === 1) continue
    const s = inStrides[k]!
    const last = shape.length - 1
    if (last >= 0 && strides[last] === s * n) {
      shape[last]! *= n
      strides[last] = s
    } else {
      shape.push(n)
      strides.push(s)
    }
  }
  const out = backend.makeOutput(outShape, x.dtype)
  if (sizeOf(outShape) === 0) return out
  if (shape.length === 0) {
    shape.push(1)
    strides.push(1)
  }
  const elementBytes = x.dtype === "bool" ? 1 : 4
  addon.transpose(
    backend.wasm.HEAPU8,
    offsetOf(backend, x) + first * elementBytes,
    offsetOf(backend, out),
    elementBytes,
    shape.length,
    Int32Array.from(shape),
    Int32Array.from(strides)
  )
  return out
}

const transposeKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const { x } = inputs as { x: tf.TensorInfo }
  const { perm } = attrs as unknown as { perm: Array<number> }
  if (x.dtype === "string" || x.dtype === "complex64") return undefined
  const rank = x.shape.length
  const inStrides = new Array<number>(rank)
  let stride = 1
  for (let d = rank - 1; d >= 0; d--) {
    inStrides[d] = stride
    stride *= x.shape[d]!
  }
  const outShape = perm.map((p) => x.shape[p]!)
  // Collapse: out axes k-1, k merge when they are adjacent x axes in order; size-1 axes drop out.
  const shape: Array<number> = []
  const strides: Array<number> = []
  for (let k = 0; k < rank; k++) {
    const n = outShape[k]!
    if (n === 1) continue
    const s = inStrides[perm[k]!]!
    const last = shape.length - 1
    if (last >= 0 && strides[last] === s * n) {
      shape[last]! *= n
      strides[last] = s
    } else {
      shape.push(n)
      strides.push(s)
    }
  }
  const out = backend.makeOutput(outShape, x.dtype)
  if (sizeOf(outShape) === 0) return out
  if (shape.length === 0) {
    shape.push(1)
    strides.push(1)
  }
  addon.transpose(
    backend.wasm.HEAPU8,
    offsetOf(backend, x),
    offsetOf(backend, out),
    x.dtype === "bool" ? 1 : 4,
    shape.length,
    Int32Array.from(shape),
    Int32Array.from(strides)
  )
  return out
}

const castKinds: Record<string, number> = { "int32>float32": 0, "bool>float32": 1, "bool>int32": 2 }

const castKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const { x } = inputs as { x: tf.TensorInfo }
  const { dtype } = attrs as unknown as { dtype: tf.DataType }
  if (x.dtype === dtype && dtype !== "string") {
    backend.incRef(x.dataId) // zero-copy, as Identity
    return { dataId: x.dataId, shape: x.shape, dtype }
  }
  const kind = castKinds[`${x.dtype}>${dtype}`]
  if (kind === undefined) return undefined
  const out = backend.makeOutput([...x.shape], dtype)
  const n = sizeOf(x.shape)
  if (n > 0) addon.cast(backend.wasm.HEAPU8, kind, offsetOf(backend, x), offsetOf(backend, out), n)
  return out
}

const softmaxKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const { logits } = inputs as { logits: tf.TensorInfo }
  const { dim } = attrs as unknown as { dim: number }
  const rank = logits.shape.length
  if (logits.dtype !== "float32" || rank === 0 || (dim !== -1 && dim !== rank - 1)) return undefined
  const n = logits.shape[rank - 1]!
  const out = backend.makeOutput([...logits.shape], "float32")
  const rows = sizeOf(logits.shape) / Math.max(n, 1)
  if (rows * n > 0)
    addon.softmax(backend.wasm.HEAPU8, offsetOf(backend, logits), offsetOf(backend, out), rows, n, false)
  return out
}

// --- embedding lookups and their gradient

const gatherKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const { x, indices } = inputs as { x: tf.TensorInfo; indices: tf.TensorInfo }
  const { axis, batchDims } = attrs as unknown as { axis: number; batchDims?: number }
  if ((batchDims ?? 0) !== 0 || indices.dtype !== "int32" || (x.dtype !== "float32" && x.dtype !== "int32")) {
    return undefined
  }
  const [a] = tf.util.parseAxisParam(axis, [...x.shape])
  if (a === undefined) return undefined
  const outShape = [...x.shape.slice(0, a), ...indices.shape, ...x.shape.slice(a + 1)]
  const out = backend.makeOutput(outShape, x.dtype)
  const count = sizeOf(indices.shape)
  const outer = sizeOf(x.shape.slice(0, a))
  const inner = sizeOf(x.shape.slice(a + 1))
  if (sizeOf(outShape) === 0) return out
  const ok = addon.gather(
    backend.wasm.HEAPU8,
    offsetOf(backend, x),
    offsetOf(backend, indices),
    offsetOf(backend, out),
    outer,
    x.shape[a]!,
    count,
    inner,
    4
  )
  if (ok) return out
  backend.disposeData(out.dataId) // an index is out of range: the stock kernel raises tfjs' error
  return undefined
}

const segmentSumKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const { x, segmentIds } = inputs as { x: tf.TensorInfo; segmentIds: tf.TensorInfo }
  const { numSegments } = attrs as unknown as { numSegments: number }
  if (x.dtype !== "float32" || segmentIds.dtype !== "int32") return undefined
  const rowShape = x.shape.slice(segmentIds.shape.length)
  const out = backend.makeOutput([numSegments, ...rowShape], "float32")
  const inner = sizeOf(rowShape)
  if (numSegments * inner === 0) return out
  addon.segmentSum(
    backend.wasm.HEAPU8,
    offsetOf(backend, x),
    offsetOf(backend, segmentIds),
    offsetOf(backend, out),
    sizeOf(segmentIds.shape),
    inner,
    numSegments
  )
  return out
}

// --- concat / split: one strided block copy per input or output

const elementBytes = (dtype: tf.DataType): number | undefined =>
  dtype === "float32" || dtype === "int32" ? 4 : dtype === "bool" ? 1 : undefined

const concatKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const tensors = Object.values(inputs) as Array<tf.TensorInfo>
  const { axis } = attrs as unknown as { axis: number }
  const first = tensors[0]
  if (first === undefined) return undefined
  const bytes = elementBytes(first.dtype)
  if (bytes === undefined || tensors.some((t) => t.dtype !== first.dtype)) return undefined
  const [a] = tf.util.parseAxisParam(axis, [...first.shape])
  if (a === undefined) return undefined
  let outShape: Array<number>
  try {
    outShape = tf.backend_util.computeOutShape(
      tensors.map((t) => [...t.shape]),
      a
    )
  } catch {
    return undefined
  }
  const out = backend.makeOutput(outShape, first.dtype)
  const outer = sizeOf(outShape.slice(0, a))
  const dstStride = sizeOf(outShape.slice(a)) * bytes
  const heap = backend.wasm.HEAPU8
  const dst = offsetOf(backend, out)
  let offset = 0
  for (const t of tensors) {
    const chunk = sizeOf(t.shape.slice(a)) * bytes
    if (chunk > 0 && outer > 0)
      addon.copyBlocks(heap, offsetOf(backend, t), dst + offset, outer, chunk, dstStride, chunk)
    offset += chunk
  }
  return out
}

const splitKernel: NativeKernel = (addon, { inputs, backend, attrs }) => {
  const { x } = inputs as { x: tf.TensorInfo }
  const { numOrSizeSplits, axis } = attrs as unknown as { numOrSizeSplits: number | Array<number>; axis: number }
  const bytes = elementBytes(x.dtype)
  if (bytes === undefined) return undefined
  const [a] = tf.util.parseAxisParam(axis, [...x.shape])
  if (a === undefined) return undefined
  const sizes = tf.backend_util.prepareSplitSize(x, numOrSizeSplits, a)
  const outer = sizeOf(x.shape.slice(0, a))
  const inner = sizeOf(x.shape.slice(a + 1)) * bytes
  const srcStride = x.shape[a]! * inner
  const outs = sizes.map((size) =>
    backend.makeOutput(
      x.shape.map((n, d) => (d === a ? size : n)),
      x.dtype
    )
  )
  const heap = backend.wasm.HEAPU8 // after every makeOutput
  const src = offsetOf(backend, x)
  let offset = 0
  outs.forEach((out, i) => {
    const chunk = sizes[i]! * inner
    if (chunk > 0 && outer > 0)
      addon.copyBlocks(heap, src + offset, offsetOf(backend, out), outer, srcStride, chunk, chunk)
    offset += chunk
  })
  return outs
}

const kernels: Record<string, NativeKernel> = {
  Concat: concatKernel,
  SplitV: splitKernel,
  GatherV2: gatherKernel,
  UnsortedSegmentSum: segmentSumKernel,
  Add: binaryKernel(0, false),
  Sub: binaryKernel(1, false),
  Multiply: binaryKernel(2, false),
  RealDiv: binaryKernel(3, false),
  Maximum: binaryKernel(4, false),
  Minimum: binaryKernel(5, false),
  SquaredDifference: binaryKernel(6, false),
  Equal: binaryKernel(0, true),
  NotEqual: binaryKernel(1, true),
  Greater: binaryKernel(2, true),
  GreaterEqual: binaryKernel(3, true),
  Less: binaryKernel(4, true),
  LessEqual: binaryKernel(5, true),
  Exp: unaryKernel(0),
  Log: unaryKernel(1),
  Sqrt: unaryKernel(2),
  Rsqrt: unaryKernel(3),
  Square: unaryKernel(4),
  Neg: unaryKernel(5),
  Sigmoid: unaryKernel(6),
  Tanh: unaryKernel(7),
  Abs: unaryKernel(8),
  Relu: unaryKernel(9),
  Reciprocal: unaryKernel(10),
  Step: unaryKernel(11),
  Sum: reduceKernel(0, "axis"),
  Mean: reduceKernel(1, "axis"),
  Max: reduceKernel(2, "reductionIndices"),
  Min: reduceKernel(3, "axis"),
  Prod: reduceKernel(4, "axis"),
  Transpose: transposeKernel,
  Slice: sliceKernel,
  Cast: castKernel,
  Softmax: softmaxKernel,
  BatchMatMul: (addon, { inputs, backend, attrs }) => {
    const { a, b } = inputs as { a: tf.TensorInfo; b: tf.TensorInfo }
    const { transposeA, transposeB } = attrs as unknown as { transposeA: boolean; transposeB: boolean }
    return matmul(addon, backend, a, b, transposeA, transposeB, undefined, 0, 0)
  },
  _FusedMatMul: (addon, { inputs, backend, attrs }) => {
    const { a, b, bias, preluActivationWeights } = inputs as {
      a: tf.TensorInfo
      b: tf.TensorInfo
      bias?: tf.TensorInfo
      preluActivationWeights?: tf.TensorInfo
    }
    const { transposeA, transposeB, activation, leakyreluAlpha } = attrs as unknown as {
      transposeA: boolean
      transposeB: boolean
      activation: string
      leakyreluAlpha?: number
    }
    const code = activationCode[activation]
    if (code === undefined || preluActivationWeights != null) return undefined
    return matmul(addon, backend, a, b, transposeA, transposeB, bias ?? undefined, code, leakyreluAlpha ?? 0.2)
  },
  // Zero-copy, like the cpu backend: the output shares the input's buffer (tfjs never writes into an input).
  Identity: (_addon, { inputs, backend }) => {
    const { x } = inputs as { x: tf.TensorInfo }
    if (x.dtype === "string") return undefined
    backend.incRef(x.dataId)
    return { dataId: x.dataId, shape: x.shape, dtype: x.dtype }
  }
}

// --- fused transformer kernels (no stock counterpart: src/model/Fused.ts runs tfjs compositions when these are absent)

type FusedKernel = (addon: Addon, args: Parameters<NativeKernel>[1]) => tf.TensorInfo | Array<tf.TensorInfo>
const optionalOffset = (backend: WasmBackend, t: tf.TensorInfo | undefined): number =>
  t === undefined ? -1 : offsetOf(backend, t)

const fusedKernels: Record<string, FusedKernel> = {
  // x [..., n], w [n] or [wRows, n] (row r of x uses w[r mod wRows]) or absent
  EffectRlRmsNorm: (addon, { inputs, backend, attrs }) => {
    const { x, w } = inputs as { x: tf.TensorInfo; w?: tf.TensorInfo }
    const n = x.shape.at(-1)!
    const out = backend.makeOutput([...x.shape], "float32")
    const rows = sizeOf(x.shape) / n
    if (rows > 0) {
      addon.rmsNorm(
        backend.wasm.HEAPU8,
        offsetOf(backend, x),
        optionalOffset(backend, w),
        offsetOf(backend, out),
        rows,
        n,
        w === undefined ? 1 : sizeOf(w.shape) / n,
        (attrs as { eps: number }).eps
      )
    }
    return out
  },
  EffectRlRmsNormGrad: (addon, { inputs, backend, attrs }) => {
    const { x, w, dy } = inputs as { x: tf.TensorInfo; w?: tf.TensorInfo; dy: tf.TensorInfo }
    const n = x.shape.at(-1)!
    const dx = backend.makeOutput([...x.shape], "float32")
    const dw = w === undefined ? undefined : backend.makeOutput([...w.shape], "float32")
    addon.rmsNormGrad(
      backend.wasm.HEAPU8,
      offsetOf(backend, x),
      optionalOffset(backend, w),
      offsetOf(backend, dy),
      offsetOf(backend, dx),
      optionalOffset(backend, dw),
      sizeOf(x.shape) / n,
      n,
      w === undefined ? 1 : sizeOf(w.shape) / n,
      (attrs as { eps: number }).eps
    )
    return dw === undefined ? [dx] : [dx, dw]
  },
  // {gate, up} [..., n] each, or {x} [..., 2n] holding gate|up
  EffectRlSwiGlu: (addon, { inputs, backend }) => {
    const { gate, up, x } = inputs as { gate?: tf.TensorInfo; up?: tf.TensorInfo; x?: tf.TensorInfo }
    const joined = x !== undefined
    const source = (joined ? x : gate)!
    const width = source.shape.at(-1)!
    const n = joined ? width / 2 : width
    const outShape = [...source.shape.slice(0, -1), n]
    const out = backend.makeOutput(outShape, "float32")
    const rows = sizeOf(outShape) / Math.max(1, n)
    const g = offsetOf(backend, source)
    addon.swiglu(
      backend.wasm.HEAPU8,
      g,
      joined ? g + 4 * n : offsetOf(backend, up!),
      offsetOf(backend, out),
      rows,
      n,
      width,
      joined ? width : n
    )
    return out
  },
  EffectRlSwiGluGrad: (addon, { inputs, backend }) => {
    const { gate, up, dy } = inputs as Record<"gate" | "up" | "dy", tf.TensorInfo>
    const n = gate.shape.at(-1)!
    const dgate = backend.makeOutput([...gate.shape], "float32")
    const dup = backend.makeOutput([...up.shape], "float32")
    addon.swigluGrad(
      backend.wasm.HEAPU8,
      offsetOf(backend, gate),
      offsetOf(backend, up),
      offsetOf(backend, dy),
      offsetOf(backend, dgate),
      offsetOf(backend, dup),
      sizeOf(gate.shape) / n,
      n
    )
    return [dgate, dup]
  },
  // x [N, heads, hd], cos/sin [N, hd]
  EffectRlRope: (addon, { inputs, backend, attrs }) => {
    const { x, cos, sin } = inputs as Record<"x" | "cos" | "sin", tf.TensorInfo>
    const hd = x.shape.at(-1)!
    const N = sizeOf(cos.shape) / hd
    const out = backend.makeOutput([...x.shape], "float32")
    addon.rope(
      backend.wasm.HEAPU8,
      offsetOf(backend, x),
      offsetOf(backend, cos),
      offsetOf(backend, sin),
      offsetOf(backend, out),
      N,
      sizeOf(x.shape) / (N * hd),
      hd,
      (attrs as { backward: boolean }).backward
    )
    return out
  },
  // qkv [B·T, (H + 2Hkv)·hd], cos/sin [B·T, hd], norm? [H + Hkv, hd], pastK/pastV? [B, C, Hkv, hd] holding P = pastLength
  // slots → q [B·T, H, hd], keys/values [B, C', Hkv, hd] holding P + T. When the past has room (C ≥ P + T) the new
  // slots are written into it in place and keys/values share its buffers (the cache owns them and drops the old
  // tensors); else, with `reserve`, C' leaves room for later steps.
  EffectRlQkvPrep: (addon, { inputs, backend, attrs }) => {
    const { qkv, cos, sin, norm, pastK, pastV } = inputs as Record<"qkv" | "cos" | "sin", tf.TensorInfo> & {
      norm?: tf.TensorInfo
      pastK?: tf.TensorInfo
      pastV?: tf.TensorInfo
    }
    const a = attrs as unknown as Record<"batch" | "heads" | "kvHeads" | "headDim" | "eps" | "pastLength", number> & {
      reserve: boolean
    }
    const N = qkv.shape[0]!
    const B = a.batch
    const T = N / B
    const P = pastK === undefined ? 0 : a.pastLength
    const pastCap = pastK === undefined ? 0 : pastK.shape[1]!
    const inPlace = pastK !== undefined && pastV !== undefined && pastCap >= P + T
    const q = backend.makeOutput([N, a.heads, a.headDim], "float32")
    let keys: tf.TensorInfo
    let values: tf.TensorInfo
    if (inPlace) {
      backend.incRef(pastK.dataId)
      backend.incRef(pastV.dataId)
      keys = { dataId: pastK.dataId, shape: pastK.shape, dtype: "float32" }
      values = { dataId: pastV.dataId, shape: pastV.shape, dtype: "float32" }
    } else {
      const slots = a.reserve ? P + T + Math.max(16, Math.ceil((P + T) / 2)) : P + T
      keys = backend.makeOutput([B, slots, a.kvHeads, a.headDim], "float32")
      values = backend.makeOutput([B, slots, a.kvHeads, a.headDim], "float32")
    }
    addon.qkvPrep(
      backend.wasm.HEAPU8,
      offsetOf(backend, qkv),
      offsetOf(backend, cos),
      offsetOf(backend, sin),
      optionalOffset(backend, norm),
      a.eps,
      optionalOffset(backend, pastK),
      optionalOffset(backend, pastV),
      offsetOf(backend, q),
      offsetOf(backend, keys),
      offsetOf(backend, values),
      B,
      T,
      P,
      a.heads,
      a.kvHeads,
      a.headDim,
      pastCap,
      keys.shape[1]!
    )
    return [q, keys, values]
  },
  // q [B·T, H, hd], k/v [B, C, Hkv, hd] of which the first `length` (default C) slots count, bias? [B, T, length]
  // → out [B·T, H·hd] (+ probs [B, H, T, length] when keepProbs)
  EffectRlAttention: (addon, { inputs, backend, attrs }) => {
    const { q, k, v, bias } = inputs as Record<"q" | "k" | "v", tf.TensorInfo> & { bias?: tf.TensorInfo }
    const a = attrs as unknown as { scale: number; keepProbs: boolean; length?: number }
    const [B, C, Hkv, hd] = k.shape as [number, number, number, number]
    const L = a.length ?? C
    const H = q.shape[1]!
    const T = q.shape[0]! / B
    const out = backend.makeOutput([B * T, H * hd], "float32")
    const probs = a.keepProbs ? backend.makeOutput([B, H, T, L], "float32") : undefined
    addon.attention(
      backend.wasm.HEAPU8,
      offsetOf(backend, q),
      offsetOf(backend, k),
      offsetOf(backend, v),
      optionalOffset(backend, bias),
      offsetOf(backend, out),
      optionalOffset(backend, probs),
      B,
      T,
      L,
      H,
      Hkv,
      hd,
      a.scale,
      C
    )
    return probs === undefined ? [out] : [out, probs]
  },
  EffectRlAttentionGrad: (addon, { inputs, backend, attrs }) => {
    const { q, k, v, probs, dy } = inputs as Record<"q" | "k" | "v" | "probs" | "dy", tf.TensorInfo>
    const [B, L, Hkv, hd] = k.shape as [number, number, number, number]
    const H = q.shape[1]!
    const T = q.shape[0]! / B
    const dq = backend.makeOutput([...q.shape], "float32")
    const dk = backend.makeOutput([...k.shape], "float32")
    const dv = backend.makeOutput([...v.shape], "float32")
    addon.attentionGrad(
      backend.wasm.HEAPU8,
      offsetOf(backend, q),
      offsetOf(backend, k),
      offsetOf(backend, v),
      offsetOf(backend, probs),
      offsetOf(backend, dy),
      offsetOf(backend, dq),
      offsetOf(backend, dk),
      offsetOf(backend, dv),
      B,
      T,
      L,
      H,
      Hkv,
      hd,
      (attrs as { scale: number }).scale
    )
    return [dq, dk, dv]
  },
  // a [M, K] @ b [K, N] (rows of a RMS-normed first when normEps ≥ 0) + residual? [M, N]
  EffectRlLinear: (addon, { inputs, backend, attrs }) => {
    const { a, b, residual } = inputs as { a: tf.TensorInfo; b: tf.TensorInfo; residual?: tf.TensorInfo }
    const [M, K] = a.shape as [number, number]
    const N = b.shape[1]!
    const out = backend.makeOutput([M, N], "float32")
    addon.linear(
      backend.wasm.HEAPU8,
      offsetOf(backend, a),
      offsetOf(backend, b),
      offsetOf(backend, out),
      M,
      N,
      K,
      optionalOffset(backend, residual),
      (attrs as { normEps: number }).normEps
    )
    return out
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Registration

const stockKernels = new Map<string, tf.KernelConfig>() // key: `${backend}/${kernel}`
let warned = false

/**
 * Replace the stock kernels of `backendName` with native ones (wasm only; other backends are left alone) and set the
 * native thread count (0 = one per core). Returns the names of the kernels now native: empty when the addon is
 * unavailable, in which case one warning says why. Idempotent.
 */
export const register = (backendName: string, threads = 0): ReadonlyArray<string> => {
  if (backendName !== "wasm") return []
  const { addon, status: loadStatus } = load()
  if (addon === undefined) {
    if (!warned && !loadStatus.available) {
      warned = true
      process.emitWarning(`effect-rl native kernels unavailable, using tfjs stock kernels: ${loadStatus.reason}`)
    }
    return []
  }
  addon.setThreads(threads)
  const names: Array<string> = []
  for (const [kernelName, native] of Object.entries(kernels)) {
    const key = `${backendName}/${kernelName}`
    const current = tf.getKernel(kernelName, backendName)
    if (!stockKernels.has(key)) {
      if (current === undefined) continue
      stockKernels.set(key, current)
      const stock: Stock = current.kernelFunc
      tf.unregisterKernel(kernelName, backendName)
      tf.registerKernel({
        ...current,
        kernelFunc: (args) =>
          native(addon, args as unknown as Parameters<NativeKernel>[1]) ??
          (stock(args) as tf.TensorInfo | Array<tf.TensorInfo>)
      })
    }
    names.push(kernelName)
  }
  for (const [kernelName, fused] of Object.entries(fusedKernels)) {
    if (tf.getKernel(kernelName, backendName) === undefined) {
      tf.registerKernel({
        kernelName,
        backendName,
        kernelFunc: (args) => fused(addon, args as unknown as Parameters<NativeKernel>[1])
      })
    }
    names.push(kernelName)
  }
  if (tf.getKernel(adamKernelName, backendName) === undefined) {
    tf.registerKernel({
      kernelName: adamKernelName,
      backendName,
      kernelFunc: (args) => adamKernel(addon, args as unknown as Parameters<NativeKernel>[1])
    })
  }
  names.push(adamKernelName)
  return names
}

// ---------------------------------------------------------------------------------------------------------------
// Adam in one native pass

const adamKernelName = "EffectRlAdamUpdate"

const adamKernel = (addon: Addon, { inputs, backend, attrs }: Parameters<NativeKernel>[1]): Array<tf.TensorInfo> => {
  const { value, grad, m, v } = inputs as Record<"value" | "grad" | "m" | "v", tf.TensorInfo>
  const a = attrs as unknown as Record<"lr" | "beta1" | "beta2" | "epsilon" | "c1" | "c2", number>
  const outs = [value, m, v].map((t) => backend.makeOutput([...t.shape], "float32"))
  addon.adam(
    backend.wasm.HEAPU8,
    offsetOf(backend, value),
    offsetOf(backend, grad),
    offsetOf(backend, m),
    offsetOf(backend, v),
    offsetOf(backend, outs[0]!),
    offsetOf(backend, outs[1]!),
    offsetOf(backend, outs[2]!),
    sizeOf(value.shape),
    a.lr,
    a.beta1,
    a.beta2,
    a.epsilon,
    a.c1,
    a.c2
  )
  return outs
}

/** The parts of tfjs' AdamOptimizer (4.22) that `NativeAdam` reuses. */
interface AdamState {
  readonly learningRate: number
  readonly beta1: number
  readonly beta2: number
  readonly epsilon: number
  readonly accBeta1: tf.Variable
  readonly accBeta2: tf.Variable
  readonly accumulatedFirstMoment: Array<{ originalName: string; variable: tf.Variable } | undefined>
  readonly accumulatedSecondMoment: Array<{ originalName: string; variable: tf.Variable } | undefined>
}

/**
 * tfjs' Adam (same state, weights and serialisation) whose update runs as one native kernel per variable instead of
 * ~12 element-wise ops; falls back to tfjs' own update where the kernel is not registered (stock kernels, other
 * backends). Use in place of `tf.train.adam`.
 */
export class NativeAdam extends tf.AdamOptimizer {
  override applyGradients(variableGradients: Parameters<tf.AdamOptimizer["applyGradients"]>[0]): void {
    if (tf.getKernel(adamKernelName, tf.getBackend()) === undefined) {
      super.applyGradients(variableGradients)
      return
    }
    const self = this as unknown as AdamState
    const names = Array.isArray(variableGradients)
      ? variableGradients.map((v) => v.name)
      : Object.keys(variableGradients)
    const c1 = Math.fround(1 - self.accBeta1.dataSync()[0]!) // 1 − β1ᵗ, in float32 as tfjs computes it
    const c2 = Math.fround(1 - self.accBeta2.dataSync()[0]!)
    tf.tidy(() => {
      names.forEach((name, i) => {
        const value = tf.engine().registeredVariables[name]!
        const moment = (suffix: string) => ({
          originalName: `${name}/${suffix}`,
          variable: tf.tidy(() => tf.zerosLike(value).variable(false))
        })
        self.accumulatedFirstMoment[i] ??= moment("m")
        self.accumulatedSecondMoment[i] ??= moment("v")
        const gradient = Array.isArray(variableGradients) ? variableGradients[i]!.tensor : variableGradients[name]
        if (gradient == null) return
        const m = self.accumulatedFirstMoment[i]!.variable
        const v = self.accumulatedSecondMoment[i]!.variable
        const [newValue, newM, newV] = tf
          .engine()
          .runKernel(
            adamKernelName,
            { value, grad: gradient, m, v },
            { lr: self.learningRate, beta1: self.beta1, beta2: self.beta2, epsilon: self.epsilon, c1, c2 }
          ) as Array<tf.Tensor>
        m.assign(newM!)
        v.assign(newV!)
        value.assign(newValue!)
      })
      self.accBeta1.assign(tf.mul(self.accBeta1, self.beta1))
      self.accBeta2.assign(tf.mul(self.accBeta2, self.beta2))
    })
    this.incrementIterations()
  }
}

/** `tf.train.adam` with the native update (see NativeAdam). */
export const adam = (learningRate = 0.001, beta1 = 0.9, beta2 = 0.999, epsilon?: number): tf.AdamOptimizer =>
  new NativeAdam(learningRate, beta1, beta2, epsilon)

/** Put the stock kernels back (for side-by-side tests). */
export const unregister = (backendName: string): void => {
  if (tf.getKernel(adamKernelName, backendName) !== undefined) tf.unregisterKernel(adamKernelName, backendName)
  for (const kernelName of Object.keys(fusedKernels)) {
    if (tf.getKernel(kernelName, backendName) !== undefined) tf.unregisterKernel(kernelName, backendName)
  }
  for (const [key, config] of stockKernels) {
    if (!key.startsWith(`${backendName}/`)) continue
    tf.unregisterKernel(config.kernelName, backendName)
    tf.registerKernel(config)
    stockKernels.delete(key)
  }
}
