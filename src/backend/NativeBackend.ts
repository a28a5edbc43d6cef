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
import * as tf from "@tensorflow/tfjs"
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

class NativeMemoryBackend extends MathBackendCPU {
  constructor() {
    super()
    // the cpu backend greets its first tensor with advice to install tfjs-node; this backend is that advice
    ;(this as unknown as { firstUse: boolean }).firstUse = false
  }

  /** Downloads of a bfloat16-stored tensor are float32, widened into a copy. */
  override readSync(dataId: object): tf.backend_util.BackendValues {
    const entry = (this.data as unknown as Data).get(dataId)
    if (entry !== undefined && NativeKernels.isBf16(entry)) {
      return NativeKernels.widen(kernelsOrThrow(), entry.values as Uint16Array)
    }
    return super.readSync(dataId)
  }
}

/** Before a JS (cpu) kernel reads its inputs: any stored as bfloat16 becomes float32 in place. */
const widenInputs = (backend: unknown, inputs: tf.NamedTensorInfoMap): void => {
  const data = (backend as { data: Data }).data
  for (const input of Object.values(inputs)) {
    if (input == null) continue
    const entry = data.get(input.dataId)
    if (entry !== undefined && NativeKernels.isBf16(entry)) NativeKernels.widenInPlace(kernelsOrThrow(), entry)
  }
}

/**
 * Store a float32 tensor of the native backend as bfloat16 (rounded to nearest even): half the memory, read by the
 * matmul as it is (frozen weights: `Transformer.frozenWeights`). Exact for weights loaded from a BF16 checkpoint.
 * Any kernel but the matmul's weight operand widens it back to float32 first, so only store what only matmuls read.
 * No-op on other backends. Returns the bytes saved.
 */
export const storeBf16 = (tensor: tf.Tensor): number => {
  if (tf.getBackend() !== name || tensor.dtype !== "float32") return 0
  const data = (tf.backend() as unknown as { data: Data }).data
  const entry = data.get(tensor.dataId)
  if (entry === undefined || !(entry.values instanceof Float32Array)) return 0
  entry.values = NativeKernels.narrow(kernelsOrThrow(), entry.values)
  return tensor.size * 2
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
