/**
 * The `native` tfjs backend: tensors in JS memory (one typed array each, as tfjs' cpu backend keeps them), computed by
 * effect-rl's native kernels (src/native/, multi-threaded, OpenBLAS where it built). Unlike wasm, whose tensors all
 * share one 32-bit heap (4 GB at most, so a 0.6B-parameter model's training does not fit), it can hold whatever the
 * machine's memory holds. Every tfjs op works: the cpu backend's kernels are registered under this backend too, and the
 * native ones replace them where they exist (NativeKernels.register); an op only they implement runs in JS, single-
 * threaded.
 *
 * Needs the addon: without it `register` refuses (the reason says why), and `auto` moves on to wasm.
 */
import * as tf from "../tensor/Tf.ts"
import { MathBackendCPU } from "@tensorflow/tfjs-backend-cpu"
import * as NativeKernels from "../native/NativeKernels.ts"

export const name = "native"

type Entry = { values?: unknown; dtype: tf.DataType }
type Data = { get(dataId: object): Entry | undefined }

const kernelsOrThrow = () => {
  const kernels = NativeKernels.addon()
  if (kernels === undefined) throw new Error("the native backend needs the native kernels")
  return kernels
}

/**
 * Who holds an ArrayBuffer: how many tensors' values view it, and whether it may be freed once none does. Only
 * buffers a kernel made are freed; never one a caller handed in (tf.tensor(values)) or one a download gave out
 * (dataSync / data: the caller may keep reading it).
 */
type Holders = { count: number; freeable: boolean }

class NativeMemoryBackend extends MathBackendCPU {
  private readonly holders = new WeakMap<ArrayBufferLike, Holders>()
  private writingKernelOutput = false
  /** Bytes of the buffers tensors hold now, and the most since `memory(true)` last reset it. */
  liveBytes = 0
  peakBytes = 0

  constructor() {
    super()
    // the cpu backend greets its first tensor with advice to install tfjs-node; this backend is that advice
    ;(this as unknown as { firstUse: boolean }).firstUse = false
  }

  private hold(values: unknown, freeable: boolean): void {
    if (!ArrayBuffer.isView(values)) return
    const known = this.holders.get(values.buffer)
    if (known !== undefined) {
      known.count++
      return
    }
    this.holders.set(values.buffer, { count: 1, freeable })
    this.liveBytes += values.buffer.byteLength
    if (this.liveBytes > this.peakBytes) this.peakBytes = this.liveBytes
  }

  /**
   * A tensor no longer views `values`: when no tensor views its buffer and a kernel made it, free it now. The cpu
   * backend leaves a dead tensor's array to V8's collector, which runs long after a training step has piled gigabytes
   * of activations and gradients up; detaching (transfer to length 0) returns the memory at once.
   */
  private release(values: unknown): void {
    if (!ArrayBuffer.isView(values)) return
    const known = this.holders.get(values.buffer)
    if (known === undefined || --known.count > 0) return
    this.holders.delete(values.buffer)
    this.liveBytes -= values.buffer.byteLength
    if (known.freeable && values.buffer instanceof ArrayBuffer && !values.buffer.detached) values.buffer.transfer(0)
  }

  private exposed(values: unknown): void {
    if (!ArrayBuffer.isView(values)) return
    const known = this.holders.get(values.buffer)
    if (known !== undefined) known.freeable = false
  }

  override write(values: tf.backend_util.BackendValues, shape: Array<number>, dtype: tf.DataType): object {
    const dataId = super.write(values, shape, dtype)
    this.hold(values, this.writingKernelOutput)
    return dataId
  }

  /** Kernels make their outputs here (JS kernels and, through JsMemory, the native ones): freeable arrays. */
  override makeTensorInfo(
    shape: Array<number>,
    dtype: tf.DataType,
    values?: tf.backend_util.BackendValues | Array<string>
  ): tf.TensorInfo {
    this.writingKernelOutput = true
    try {
      return super.makeTensorInfo(shape, dtype, values)
    } finally {
      this.writingKernelOutput = false
    }
  }

  override move(
    dataId: object,
    values: tf.backend_util.BackendValues,
    shape: Array<number>,
    dtype: tf.DataType,
    refCount: number
  ): void {
    const before = (this.data as unknown as Data).get(dataId)?.values
    super.move(dataId, values, shape, dtype, refCount)
    if (before !== undefined) this.release(before)
    this.hold(values, false)
  }

  override disposeData(dataId: object, force = false): boolean {
    const data = this.data as unknown as Data & { has(dataId: object): boolean }
    const values = data.get(dataId)?.values
    const result = super.disposeData(dataId, force)
    if (values !== undefined && !data.has(dataId)) this.release(values)
    return result
  }

  /** Downloads of a bfloat16-stored tensor are float32, widened into a copy; any other download is the caller's. */
  override readSync(dataId: object): tf.backend_util.BackendValues {
    const entry = (this.data as unknown as Data).get(dataId)
    if (entry !== undefined && NativeKernels.isBf16(entry)) {
      return NativeKernels.widen(kernelsOrThrow(), entry.values as Uint16Array)
    }
    if (entry !== undefined) this.exposed(entry.values)
    return super.readSync(dataId)
  }

  /** A tensor's values replaced by a new array (stored as bfloat16, or widened back): the old one freed if it may be. */
  replaceValues(entry: Entry, values: ArrayBufferView): void {
    const before = entry.values
    entry.values = values
    this.hold(values, true)
    this.release(before)
  }
}

/** Before a JS (cpu) kernel reads its inputs: any stored as bfloat16 becomes float32 in place. */
const widenInputs = (backend: unknown, inputs: tf.NamedTensorInfoMap): void => {
  const data = (backend as { data: Data }).data
  for (const input of Object.values(inputs)) {
    if (input == null) continue
    const entry = data.get(input.dataId)
    if (entry !== undefined && NativeKernels.isBf16(entry)) {
      NativeKernels.widenInPlace(kernelsOrThrow(), backend as NativeMemoryBackend, entry)
    }
  }
}

/**
 * Store a float32 tensor of the native backend as bfloat16 (rounded to nearest even): half the memory, read by the
 * matmul as it is (frozen weights: `Transformer.frozenWeights`). Exact for weights loaded from a BF16 checkpoint.
 * Any kernel but the matmul's weight operand widens it back to float32 first, so only store what only matmuls read.
 * No-op on other backends. Returns the bytes saved against float32 (also when it was stored so already).
 */
export const storeBf16 = (tensor: tf.Tensor): number => {
  if (tf.getBackend() !== name || tensor.dtype !== "float32") return 0
  const backend = tf.backend() as unknown as NativeMemoryBackend
  const entry = (backend.data as unknown as Data).get(tensor.dataId)
  if (entry !== undefined && NativeKernels.isBf16(entry)) return tensor.size * 2 // stored already
  if (entry === undefined || !(entry.values instanceof Float32Array)) return 0
  backend.replaceValues(entry, NativeKernels.narrow(kernelsOrThrow(), entry.values))
  return tensor.size * 2
}

/**
 * The bytes the native backend's tensors hold now and at most since the last call with `reset` (what tf.memory()
 * cannot say: it counts a bfloat16-stored tensor at 4 bytes an element, and a variable's clone as a copy). Undefined
 * on other backends.
 */
export const memory = (reset = false): { readonly liveBytes: number; readonly peakBytes: number } | undefined => {
  if (tf.getBackend() !== name) return undefined
  const backend = tf.backend() as unknown as NativeMemoryBackend
  const result = { liveBytes: backend.liveBytes, peakBytes: backend.peakBytes }
  if (reset) backend.peakBytes = backend.liveBytes
  return result
}

/** Whether a tensor is stored as bfloat16 (`storeBf16`). */
export const storedBf16 = (tensor: tf.Tensor): boolean => {
  if (tf.getBackend() !== name) return false
  const entry = (tf.backend() as unknown as { data: Data }).data.get(tensor.dataId)
  return entry !== undefined && NativeKernels.isBf16(entry)
}

let registered = false

/**
 * Register the backend with tfjs (idempotent), with the cpu backend's kernels copied under its name;
 * TensorBackend.initialise then puts the native ones over them. Throws when the addon is unavailable, saying why.
 */
export const register = (): void => {
  const status = NativeKernels.status()
  if (!status.available) throw new Error(`the native backend needs the native kernels: ${status.reason}`)
  if (!registered) {
    tf.registerBackend(name, () => new NativeMemoryBackend(), 0)
    for (const kernel of tf.getKernelsForBackend("cpu")) {
      if (tf.getKernel(kernel.kernelName, name) !== undefined) continue
      const run = kernel.kernelFunc
      tf.registerKernel({
        ...kernel,
        backendName: name,
        kernelFunc: (args) => {
          widenInputs(args.backend, args.inputs)
          return run(args)
        }
      })
    }
    registered = true
  }
}
