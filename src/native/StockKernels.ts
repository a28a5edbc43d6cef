/**
 * Native versions of tfjs' stock wasm kernels: matmul, element-wise ops, reductions, layout (transpose, slice, concat,
 * split, cast), softmax, gathers and their gradient. Each handles the cases it knows (float32 mostly) and returns
 * undefined for anything else, which NativeKernels.register hands to the stock kernel it replaced: registering never
 * changes which programs run, only how fast.
 */
import * as tf from "../tensor/Tf.ts"
import type * as Abi from "./Abi.ts"
import * as Layout from "./Layout.ts"
import { type NativeKernel, offsetOf, type WasmBackend } from "./WasmKernel.ts"

const { sizeOf } = Layout

const activationCode: Record<string, number> = { linear: 0, relu: 1, relu6: 2, elu: 3, leakyrelu: 4, sigmoid: 5 }

const matmul = (
  kernels: Abi.Kernels,
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
  const bf16 = backend.bf16Offset?.(b.dataId)
  if (bf16 !== undefined && a.shape.length === 2 && b.shape.length === 2 && !transposeA && bias === undefined) {
    // a frozen bfloat16 weight: widened a block at a time (other shapes widen it whole, through offsetOf below)
    const [m, k] = a.shape as [number, number]
    const [kB, n] = transposeB ? [b.shape[1]!, b.shape[0]!] : [b.shape[0]!, b.shape[1]!]
    if (k === kB && activation === 0) {
      const out = backend.makeOutput([m, n], "float32")
      kernels.matmulBf16({
        heap: backend.wasm.HEAPU8,
        a: offsetOf(backend, a),
        b: bf16,
        out: offsetOf(backend, out),
        m,
        n,
        k,
        transposeB
      })
      return out
    }
  }
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
  const aLayout = Layout.batchLayout(aDims, outDims, m * k)
  const bLayout = Layout.batchLayout(bDims, outDims, k * n)
  const out = backend.makeOutput([...outDims, m, n], "float32")
  kernels.matmul({
    heap: backend.wasm.HEAPU8, // after makeOutput: it may have grown the heap
    a: offsetOf(backend, a),
    b: offsetOf(backend, b),
    out: offsetOf(backend, out),
    batch: sizeOf(outDims),
    aBatchStride: aLayout.stride,
    bBatchStride: bLayout.stride,
    m,
    n,
    k,
    transposeA,
    transposeB,
    bias: bias === undefined ? -1 : offsetOf(backend, bias),
    activation,
    alpha,
    aBatchIndex: aLayout.index,
    bBatchIndex: bLayout.index
  })
  return out
}

// --- element-wise

const binaryKernel =
  (op: number, compare: boolean): NativeKernel =>
  (kernels, { inputs, backend }) => {
    const { a, b } = inputs as { a: tf.TensorInfo; b: tf.TensorInfo }
    if (a.dtype !== "float32" || b.dtype !== "float32") return undefined
    let outShape: Array<number>
    try {
      outShape = tf.broadcast_util.assertAndGetBroadcastShape(a.shape, b.shape)
    } catch {
      return undefined
    }
    const layout = Layout.broadcastLayout(a.shape, b.shape, outShape)
    if (layout === undefined) return undefined
    const out = backend.makeOutput(outShape, compare ? "bool" : "float32")
    if (sizeOf(outShape) === 0) return out
    kernels.binary({
      heap: backend.wasm.HEAPU8,
      op,
      compare,
      a: offsetOf(backend, a),
      b: offsetOf(backend, b),
      out: offsetOf(backend, out),
      ...layout
    })
    return out
  }

const unaryKernel =
  (op: number): NativeKernel =>
  (kernels, { inputs, backend, attrs }) => {
    const { x } = inputs as { x: tf.TensorInfo }
    if (x.dtype !== "float32") return undefined
    const out = backend.makeOutput([...x.shape], "float32")
    const n = sizeOf(x.shape)
    if (n > 0) {
      const alpha = (attrs as { alpha?: number } | undefined)?.alpha ?? 0
      kernels.unary({ heap: backend.wasm.HEAPU8, op, x: offsetOf(backend, x), out: offsetOf(backend, out), n, alpha })
    }
    return out
  }

/** Reductions over one contiguous run of axes (after dropping size-1 axes): x as [outer, reduce, inner]. */
const reduceKernel =
  (op: number, axisAttr: "axis" | "reductionIndices"): NativeKernel =>
  (kernels, { inputs, backend, attrs }) => {
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
    const reduce = reduced.length === 0 ? 1 : sizeOf(x.shape.slice(first, last + 1))
    const inner = sizeOf(x.shape.slice(last + 1))
    if (reduce === 0) return undefined
    const outShape =
      keepDims === true
        ? x.shape.map((n, d) => (axes.includes(d) ? 1 : n))
        : x.shape.filter((_, d) => !axes.includes(d))
    const out = backend.makeOutput(outShape, "float32")
    if (outer * inner > 0) {
      kernels.reduce({
        heap: backend.wasm.HEAPU8,
        op,
        x: offsetOf(backend, x),
        out: offsetOf(backend, out),
        outer,
        reduce,
        inner
      })
    }
    return out
  }

// --- layout

/**
 * A strided copy of `x` (the `transpose` addon call, starting at `begin`). The stock wasm Slice copies the whole input
 * out of the heap and walks it in JS for every non-contiguous slice: slicing a KV cache `[B, C, Hkv, hd]` along C
 * that way was a third of a quickstart run.
 */
const sliceKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
  const { x } = inputs as { x: tf.TensorInfo }
  if (x.dtype === "string" || x.dtype === "complex64") return undefined
  const { begin, size } = attrs as unknown as { begin: number | Array<number>; size?: number | Array<number> }
  const [start, outShape] = tf.slice_util.parseSliceParams(x, begin, size) as [Array<number>, Array<number>]
  const inStrides = Layout.contiguousStrides(x.shape)
  const first = start.reduce((n, b, d) => n + b * inStrides[d]!, 0)
  const out = backend.makeOutput(outShape, x.dtype)
  if (sizeOf(outShape) === 0) return out
  const elementBytes = x.dtype === "bool" ? 1 : 4
  const view = Layout.stridedView(outShape, inStrides)
  kernels.transpose({
    heap: backend.wasm.HEAPU8,
    x: offsetOf(backend, x) + first * elementBytes,
    out: offsetOf(backend, out),
    elementBytes,
    rank: view.outShape.length,
    ...view
  })
  return out
}

const transposeKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
  const { x } = inputs as { x: tf.TensorInfo }
  const { perm } = attrs as unknown as { perm: Array<number> }
  if (x.dtype === "string" || x.dtype === "complex64") return undefined
  const inStrides = Layout.contiguousStrides(x.shape)
  const outShape = perm.map((p) => x.shape[p]!)
  const out = backend.makeOutput(outShape, x.dtype)
  if (sizeOf(outShape) === 0) return out
  const view = Layout.stridedView(
    outShape,
    perm.map((p) => inStrides[p]!)
  )
  kernels.transpose({
    heap: backend.wasm.HEAPU8,
    x: offsetOf(backend, x),
    out: offsetOf(backend, out),
    elementBytes: x.dtype === "bool" ? 1 : 4,
    rank: view.outShape.length,
    ...view
  })
  return out
}

const castKinds: Record<string, number> = { "int32>float32": 0, "bool>float32": 1, "bool>int32": 2 }

const castKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
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
  if (n > 0) kernels.cast({ heap: backend.wasm.HEAPU8, kind, x: offsetOf(backend, x), out: offsetOf(backend, out), n })
  return out
}

const softmaxKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
  const { logits } = inputs as { logits: tf.TensorInfo }
  const { dim } = attrs as unknown as { dim: number }
  const rank = logits.shape.length
  if (logits.dtype !== "float32" || rank === 0 || (dim !== -1 && dim !== rank - 1)) return undefined
  const n = logits.shape[rank - 1]!
  const out = backend.makeOutput([...logits.shape], "float32")
  const rows = sizeOf(logits.shape) / Math.max(n, 1)
  if (rows * n > 0) {
    kernels.softmax({
      heap: backend.wasm.HEAPU8,
      x: offsetOf(backend, logits),
      out: offsetOf(backend, out),
      rows,
      n,
      log: false
    })
  }
  return out
}

// --- embedding lookups and their gradient

const gatherKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
  const { x, indices } = inputs as { x: tf.TensorInfo; indices: tf.TensorInfo }
  const { axis, batchDims } = attrs as unknown as { axis: number; batchDims?: number }
  if ((batchDims ?? 0) !== 0 || indices.dtype !== "int32" || (x.dtype !== "float32" && x.dtype !== "int32")) {
    return undefined
  }
  const [a] = tf.util.parseAxisParam(axis, [...x.shape])
  if (a === undefined) return undefined
  const outShape = [...x.shape.slice(0, a), ...indices.shape, ...x.shape.slice(a + 1)]
  const out = backend.makeOutput(outShape, x.dtype)
  if (sizeOf(outShape) === 0) return out
  const ok = kernels.gather({
    heap: backend.wasm.HEAPU8,
    x: offsetOf(backend, x),
    indices: offsetOf(backend, indices),
    out: offsetOf(backend, out),
    outer: sizeOf(x.shape.slice(0, a)),
    axisDim: x.shape[a]!,
    count: sizeOf(indices.shape),
    inner: sizeOf(x.shape.slice(a + 1)),
    elementBytes: 4
  })
  if (ok) return out
  backend.disposeData(out.dataId) // an index is out of range: the stock kernel raises tfjs' error
  return undefined
}

const segmentSumKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
  const { x, segmentIds } = inputs as { x: tf.TensorInfo; segmentIds: tf.TensorInfo }
  const { numSegments } = attrs as unknown as { numSegments: number }
  if (x.dtype !== "float32" || segmentIds.dtype !== "int32") return undefined
  const rowShape = x.shape.slice(segmentIds.shape.length)
  const out = backend.makeOutput([numSegments, ...rowShape], "float32")
  const inner = sizeOf(rowShape)
  if (numSegments * inner === 0) return out
  kernels.segmentSum({
    heap: backend.wasm.HEAPU8,
    x: offsetOf(backend, x),
    segmentIds: offsetOf(backend, segmentIds),
    out: offsetOf(backend, out),
    count: sizeOf(segmentIds.shape),
    inner,
    numSegments
  })
  return out
}

// --- concat / split: one strided block copy per input or output

const elementBytes = (dtype: tf.DataType): number | undefined =>
  dtype === "float32" || dtype === "int32" ? 4 : dtype === "bool" ? 1 : undefined

const concatKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
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
    if (chunk > 0 && outer > 0) {
      kernels.copyBlocks({
        heap,
        src: offsetOf(backend, t),
        dst: dst + offset,
        outer,
        srcStride: chunk,
        dstStride,
        chunk
      })
    }
    offset += chunk
  }
  return out
}

const splitKernel: NativeKernel = (kernels, { inputs, backend, attrs }) => {
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
    if (chunk > 0 && outer > 0) {
      kernels.copyBlocks({
        heap,
        src: src + offset,
        dst: offsetOf(backend, out),
        outer,
        srcStride,
        dstStride: chunk,
        chunk
      })
    }
    offset += chunk
  })
  return outs
}

/** The stock kernels replaced, by tfjs kernel name. Op codes are native/elementwise.cc's enums. */
export const kernels: Readonly<Record<string, NativeKernel>> = {
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
  BatchMatMul: (kernels, { inputs, backend, attrs }) => {
    const { a, b } = inputs as { a: tf.TensorInfo; b: tf.TensorInfo }
    const { transposeA, transposeB } = attrs as unknown as { transposeA: boolean; transposeB: boolean }
    return matmul(kernels, backend, a, b, transposeA, transposeB, undefined, 0, 0)
  },
  _FusedMatMul: (kernels, { inputs, backend, attrs }) => {
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
    return matmul(kernels, backend, a, b, transposeA, transposeB, bias ?? undefined, code, leakyreluAlpha ?? 0.2)
  },
  // Zero-copy, like the cpu backend: the output shares the input's buffer (tfjs never writes into an input).
  Identity: (_kernels, { inputs, backend }) => {
    const { x } = inputs as { x: tf.TensorInfo }
    if (x.dtype === "string") return undefined
    backend.incRef(x.dataId)
    return { dataId: x.dataId, shape: x.shape, dtype: x.dtype }
  }
}
