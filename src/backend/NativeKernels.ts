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
}

/** The parts of tfjs-backend-wasm's BackendWasm the kernels use. */
interface WasmBackend {
  readonly wasm: { readonly HEAPU8: Uint8Array }
  readonly dataIdMap: { get(dataId: object): { memoryOffset: number } }
  makeOutput(shape: Array<number>, dtype: tf.DataType): tf.TensorInfo
  incRef(dataId: object): void
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

const kernels: Record<string, NativeKernel> = {
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
  return names
}

/** Put the stock kernels back (for side-by-side tests). */
export const unregister = (backendName: string): void => {
  for (const [key, config] of stockKernels) {
    if (!key.startsWith(`${backendName}/`)) continue
    tf.unregisterKernel(config.kernelName, backendName)
    tf.registerKernel(config)
    stockKernels.delete(key)
  }
}
