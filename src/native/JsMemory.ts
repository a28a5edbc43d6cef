/**
 * Native kernels over tensors in JS memory: the `native` tfjs backend (src/backend/NativeBackend.ts) keeps each
 * tensor's data in its own typed array, as tfjs' cpu backend does, so no tensor is bounded by the 4 GB wasm heap. Its
 * kernels see it through `WasmBackend` (WasmKernel.ts), the surface the wasm kernels are written against, with a null
 * heap: every buffer is passed by its absolute address (`addressOf`), which V8 keeps fixed while the typed array lives.
 *
 * A float32 tensor may be stored as bfloat16 bits (a Uint16Array: frozen weights, NativeBackend.storeBf16). Kernels
 * that read bfloat16 (the matmul's weight operand) take it as it is (`bf16Offset`); any other kernel widens it to
 * float32 in place first, so a result is never computed from the bits as if they were floats.
 */
import * as tf from "../tensor/Tf.ts"
import type * as Abi from "./Abi.ts"
import type { WasmBackend } from "./WasmKernel.ts"

/** What the kernels read of a cpu-style backend: its data map (values by data id) and tensor bookkeeping. */
export interface JsMemoryBackend {
  readonly data: {
    get(dataId: object): { values?: unknown; dtype: tf.DataType } | undefined
  }
  makeTensorInfo(shape: Array<number>, dtype: tf.DataType, values?: tf.backend_util.BackendValues): tf.TensorInfo
  incRef(dataId: object): void
  disposeData(dataId: object): boolean
  /** Put new values in a tensor's entry, letting the backend free the old ones (NativeBackend); else assigned. */
  replaceValues?(entry: { values?: unknown }, values: ArrayBufferView): void
}

const replace = (backend: JsMemoryBackend, entry: { values?: unknown }, values: ArrayBufferView): void => {
  if (backend.replaceValues !== undefined) backend.replaceValues(entry, values)
  else entry.values = values
}

const addresses = new WeakMap<ArrayBufferView, number>()
const views = new WeakMap<object, WasmBackend>()

const sizeOf = (shape: ReadonlyArray<number>): number => shape.reduce((a, b) => a * b, 1)

const arrayTypes: Partial<Record<tf.DataType, abstract new (...args: never) => ArrayBufferView>> = {
  float32: Float32Array,
  int32: Int32Array,
  bool: Uint8Array
}

/** A float32 tensor stored as bfloat16 bits (`storeBf16`). */
export const isBf16 = (entry: { values?: unknown; dtype: tf.DataType }): boolean =>
  entry.dtype === "float32" && entry.values instanceof Uint16Array

/** bfloat16 bits widened to a new float32 array. */
export const widen = (kernels: Abi.Kernels, bits: Uint16Array): Float32Array => {
  const out = new Float32Array(bits.length)
  if (bits.length > 0) kernels.fromBf16({ x: bits, out, n: bits.length })
  return out
}

/** float32 values rounded to a new array of bfloat16 bits (to nearest even). */
export const narrow = (kernels: Abi.Kernels, values: Float32Array): Uint16Array => {
  const out = new Uint16Array(values.length)
  if (values.length > 0) kernels.toBf16({ x: values, out, n: values.length })
  return out
}

/** A bfloat16-stored entry made float32 in place (for a kernel that reads float32 only); its new values. */
export const widenInPlace = (
  kernels: Abi.Kernels,
  backend: JsMemoryBackend,
  entry: { values?: unknown }
): Float32Array => {
  const widened = widen(kernels, entry.values as Uint16Array)
  replace(backend, entry, widened)
  return widened
}

/**
 * The data of `dataId` as a typed array of its dtype's type, made one if the backend holds something else: a plain
 * array, or another typed array (the cpu backend's OneHot, for one, keeps an int32 tensor in a Float32Array).
 */
const valuesOf = (kernels: Abi.Kernels, backend: JsMemoryBackend, dataId: object): ArrayBufferView => {
  const entry = backend.data.get(dataId)
  if (entry === undefined) throw new Error("native backend: a kernel input was already disposed")
  if (isBf16(entry)) return widenInPlace(kernels, backend, entry)
  if (ArrayBuffer.isView(entry.values) && entry.values.constructor === arrayTypes[entry.dtype]) return entry.values
  if (entry.dtype === "string" || entry.dtype === "complex64") {
    throw new Error(`native backend: native kernels do not take ${entry.dtype} tensors`)
  }
  const typed =
    entry.values === undefined
      ? tf.util.getTypedArrayFromDType(entry.dtype as "float32", 0)
      : tf.util.toTypedArray(entry.values as ArrayLike<number>, entry.dtype)
  replace(backend, entry, typed)
  return typed
}

/** The kernels' view of `backend`: memoised per backend instance. */
export const view = (kernels: Abi.Kernels, backend: JsMemoryBackend): WasmBackend => {
  const known = views.get(backend)
  if (known !== undefined) return known
  const addressOfView = (values: ArrayBufferView): number => {
    let at = addresses.get(values)
    if (at === undefined) {
      at = kernels.addressOf({ view: values })
      addresses.set(values, at)
    }
    return at
  }
  const address = (dataId: object): number => addressOfView(valuesOf(kernels, backend, dataId))
  const made: WasmBackend = {
    wasm: { HEAPU8: null },
    dataIdMap: { get: (dataId) => ({ memoryOffset: address(dataId) }) },
    bf16Offset: (dataId) => {
      const entry = backend.data.get(dataId)
      return entry !== undefined && isBf16(entry) ? addressOfView(entry.values as Uint16Array) : undefined
    },
    makeOutput: (shape, dtype) =>
      backend.makeTensorInfo(shape, dtype, tf.util.getTypedArrayFromDType(dtype as "float32", sizeOf(shape))),
    incRef: (dataId) => backend.incRef(dataId),
    disposeData: (dataId) => backend.disposeData(dataId)
  }
  views.set(backend, made)
  return made
}
