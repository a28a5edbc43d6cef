/**
 * Native CPU kernels (native/, an N-API addon built by `npm ci`) registered into the tfjs wasm backend: the public
 * surface of src/native/.
 *
 * Why wasm and not cpu: wasm is the embedded default, keeps every tensor in one linear heap that native code can read
 * and write in place (`backend.wasm.HEAPU8` + `dataIdMap.get(dataId).memoryOffset`), and its stock kernels for the
 * ops we leave alone are 10–100× faster than the pure-JS cpu backend's.
 *
 * `register` replaces stock kernels (StockKernels.ts; each declines what it does not handle, back to the stock one)
 * and adds the fused transformer kernels (FusedKernels.ts) and the Adam update (Adam.ts). `unregister` restores the
 * stock kernels (tests compare both in one process). When the addon is unavailable (Addon.ts says why), `register`
 * returns no kernels and warns once.
 */
import * as tf from "@tensorflow/tfjs"
import * as Adam from "./Adam.ts"
import * as Addon from "./Addon.ts"
import * as FusedKernels from "./FusedKernels.ts"
import * as StockKernels from "./StockKernels.ts"
import type { KernelArgs, OwnKernel } from "./WasmKernel.ts"

export { adam, NativeAdam } from "./Adam.ts"
export type { Status } from "./Addon.ts"
export { stats, status } from "./Addon.ts"

/** All kernels with no stock counterpart, by name. */
const ownKernels: Readonly<Record<string, OwnKernel>> = { ...FusedKernels.kernels, [Adam.kernelName]: Adam.kernel }

const stockKernels = new Map<string, tf.KernelConfig>() // key: `${backend}/${kernel}`
let warned = false

/**
 * Replace the stock kernels of `backendName` with native ones (wasm only; other backends are left alone) and set the
 * native thread count (0 = one per core). Returns the names of the kernels now native: empty when the addon is
 * unavailable, in which case one warning says why. Idempotent.
 */
export const register = (backendName: string, threads = 0): ReadonlyArray<string> => {
  if (backendName !== "wasm") return []
  const { kernels, status } = Addon.load()
  if (kernels === undefined) {
    if (!warned && !status.available) {
      warned = true
      process.emitWarning(`effect-rl native kernels unavailable, using tfjs stock kernels: ${status.reason}`)
    }
    return []
  }
  kernels.setThreads({ threads })
  const names: Array<string> = []
  for (const [kernelName, native] of Object.entries(StockKernels.kernels)) {
    const key = `${backendName}/${kernelName}`
    const current = tf.getKernel(kernelName, backendName)
    if (!stockKernels.has(key)) {
      if (current === undefined) continue
      stockKernels.set(key, current)
      const stock: tf.KernelFunc = current.kernelFunc
      tf.unregisterKernel(kernelName, backendName)
      tf.registerKernel({
        ...current,
        kernelFunc: (args) =>
          native(kernels, args as unknown as KernelArgs) ?? (stock(args) as tf.TensorInfo | Array<tf.TensorInfo>)
      })
    }
    names.push(kernelName)
  }
  for (const [kernelName, own] of Object.entries(ownKernels)) {
    if (tf.getKernel(kernelName, backendName) === undefined) {
      tf.registerKernel({
        kernelName,
        backendName,
        kernelFunc: (args) => own(kernels, args as unknown as KernelArgs)
      })
    }
    names.push(kernelName)
  }
  return names
}

/** Put the stock kernels back (for side-by-side tests). */
export const unregister = (backendName: string): void => {
  for (const kernelName of Object.keys(ownKernels)) {
    if (tf.getKernel(kernelName, backendName) !== undefined) tf.unregisterKernel(kernelName, backendName)
  }
  for (const [key, config] of stockKernels) {
    if (!key.startsWith(`${backendName}/`)) continue
    tf.unregisterKernel(config.kernelName, backendName)
    tf.registerKernel(config)
    stockKernels.delete(key)
  }
}
