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

class NativeMemoryBackend extends MathBackendCPU {
  constructor() {
    super()
    // the cpu backend greets its first tensor with advice to install tfjs-node; this backend is that advice
    ;(this as unknown as { firstUse: boolean }).firstUse = false
  }
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
      if (tf.getKernel(kernel.kernelName, name) === undefined) tf.registerKernel({ ...kernel, backendName: name })
    }
    registered = true
  }
}
