/**
 * Native CPU kernels (native/, an N-API addon built by `npm ci`) registered into a tfjs backend: the public surface of
 * src/native/. Two backends take them:
 * - `wasm`: every tensor in one linear heap that native code reads and writes in place (`backend.wasm.HEAPU8` +
 *   `dataIdMap.get(dataId).memoryOffset`); its stock kernels for the ops we leave alone are fast (XNNPACK), but the
 *   heap is 32-bit: 4 GB for everything.
 * - `native` (src/backend/NativeBackend.ts): tfjs' cpu backend with every tensor in its own typed array (JS memory,
 *   no ceiling but the machine's), the kernels addressing them absolutely (JsMemory.ts); ops we leave alone run as
 *   the cpu backend's JS kernels.
 *
 * `register` replaces stock kernels (StockKernels.ts; each declines what it does not handle, back to the stock one)
 * and adds the fused transformer kernels (FusedKernels.ts) and the Adam update (Adam.ts). `unregister` restores the
 * stock kernels (tests compare both in one process). When the addon is unavailable (Addon.ts says why), `register`
 * returns no kernels and warns once.
 */
import * as tf from "../tensor/Tf.ts"
import type * as Abi from "./Abi.ts"
import * as Adam from "./Adam.ts"
import * as Addon from "./Addon.ts"
import * as FusedKernels from "./FusedKernels.ts"
import * as JsMemory from "./JsMemory.ts"
import * as StockKernels from "./StockKernels.ts"
import type { KernelArgs, OwnKernel } from "./WasmKernel.ts"

export { adam, NativeAdam } from "./Adam.ts"
export type { Status } from "./Addon.ts"
export { stats, status } from "./Addon.ts"
export { isBf16, narrow, widen, widenInPlace } from "./JsMemory.ts"

/** The addon's functions (undefined when it is unavailable: `status()` says why). */
export const addon = (): Abi.Kernels | undefined => Addon.load().kernels

type KernelCall = Parameters<tf.KernelFunc>[0]

/** All kernels with no stock counterpart, by name. */
const ownKernels: Readonly<Record<string, OwnKernel>> = { ...FusedKernels.kernels, [Adam.kernelName]: Adam.kernel }

const stockKernels = new Map<string, tf.KernelConfig>() // key: `${backend}/${kernel}`
let warned = false

/** The backends native kernels run on (see the module header). */
export const backends: ReadonlyArray<string> = ["wasm", "native"]

/**
 * Replace the stock kernels of `backendName` with native ones (wasm and native only; other backends are left alone)
 * and set the native thread count (0 = one per core). Returns the names of the kernels now native: empty when the
 * addon is unavailable, in which case one warning says why. Idempotent.
 */
export const register = (backendName: string, threads = 0): ReadonlyArray<string> => {
  if (!backends.includes(backendName)) return []
  const { kernels, status } = Addon.load()
  if (kernels === undefined) {
    if (!warned && !status.available) {
      warned = true
      process.emitWarning(`effect-rl native kernels unavailable, using tfjs stock kernels: ${status.reason}`)
    }
    return []
  }
  kernels.setThreads({ threads })
  // wasm kernels get the backend itself; the native backend's are given its JsMemory view
  const adapt =
    backendName === "wasm"
      ? (args: KernelCall) => args as unknown as KernelArgs
      : (args: KernelCall) =>
          ({
            ...args,
            backend: JsMemory.view(kernels, args.backend as unknown as JsMemory.JsMemoryBackend)
          }) as unknown as KernelArgs
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
        kernelFunc: (args) => native(kernels, adapt(args)) ?? (stock(args) as tf.TensorInfo | Array<tf.TensorInfo>)
      })
    }
    names.push(kernelName)
  }
  for (const [kernelName, own] of Object.entries(ownKernels)) {
    if (tf.getKernel(kernelName, backendName) === undefined) {
      tf.registerKernel({
        kernelName,
        backendName,
        kernelFunc: (args) => own(kernels, adapt(args))
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
