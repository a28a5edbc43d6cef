/**
 * tfjs's WebGPU backend in Node, through Dawn (the `webgpu` npm package: Dawn's Node binding, prebuilt inside the
 * package). Dawn is no dependency of effect-rl (132 MB for five platforms, used only where a GPU is): `npm run
 * setup:webgpu` installs it, this platform's build alone, into `.webgpu/` (domain/OptionalPackage.ts). On a machine
 * with a GPU and its Vulkan driver this runs the tensors on the GPU; with Mesa's lavapipe (a Vulkan driver on the CPU,
 * `mesa-vulkan-drivers` ≥ 25) it runs anywhere, slowly, which is how CI tests it.
 *
 * Set-up, in this order: Dawn's WebGPU globals (GPUBufferUsage, …) on `globalThis`, `navigator.gpu` defined with
 * `Object.defineProperty` (Node's `navigator` has getters only), then the tfjs backend module, which registers itself
 * only when it finds `navigator.gpu` at import.
 *
 * What differs from the CPU backends:
 * - **No synchronous reads.** tfjs-backend-webgpu's `readSync` needs `OffscreenCanvas`, which Node lacks, so every
 *   read on the training and sampling paths is `await tensor.data()` (that is why they are async on every backend).
 * - **Binding-size limit.** One shader binding may not exceed the adapter's `maxStorageBufferBindingSize` (128 MiB on
 *   lavapipe, WebGPU's guaranteed minimum). `checkModelFits` names a weight that can never fit before a model loads;
 *   the chunked log-prob head's chunks (≤ 2²⁴ floats, 64 MiB) fit every adapter.
 * - **Our own device.** tfjs would request the device itself with the default `maxStorageBuffersPerShaderStage` (8),
 *   and its `AddN` binds every input at once: the global gradient norm over a model's ~25+ parameters failed
 *   validation and silently read back garbage. We request the adapter's limits and register an `AddN` that sums at
 *   most limit − 1 inputs per shader.
 * - **Device errors are errors.** Dawn reports validation and out-of-memory errors to a callback, not to the call
 *   that caused them, and the computation goes on with invalid results. The first such error is kept and thrown by
 *   the next read (`tensor.data()`), so a step that hit one fails instead of training on garbage.
 *
 * `auto` looks for a hardware adapter without a Dawn instance in its own process (`findHardware`): Dawn writes its
 * warnings (e.g. lavapipe's "maxDynamicUniformBuffersPerPipelineLayout artificially reduced") to fd 2 from native
 * code, where no JS-level redirection reaches, and they would otherwise greet every run that then skips webgpu.
 */
import { execFile } from "node:child_process"
import { readdirSync } from "node:fs"
import { pathToFileURL } from "node:url"
import * as OptionalPackage from "../domain/OptionalPackage.ts"
import type { TransformerConfig } from "../model/ModelConfig.ts"
import * as Transformer from "../model/Transformer.ts"
import * as tf from "../tensor/Tf.ts"

export interface Adapter {
  readonly vendor: string
  readonly architecture: string
  readonly device: string
  readonly description: string
  /** A software rasteriser (lavapipe/llvmpipe, SwiftShader): correct but slower than the CPU backends. */
  readonly software: boolean
  readonly maxStorageBufferBindingSize: number
  readonly maxBufferSize: number
  readonly features: ReadonlyArray<string>
}

interface GpuLike {
  requestAdapter(options?: { powerPreference?: string }): Promise<AdapterLike | null>
}
interface DeviceLike {
  addEventListener(type: "uncapturederror", listener: (event: { error: { message: string } }) => void): void
  readonly lost: Promise<{ message: string }>
}
interface AdapterLike {
  readonly info: {
    readonly vendor: string
    readonly architecture: string
    readonly device: string
    readonly description: string
    readonly isFallbackAdapter?: boolean
  }
  readonly limits: Record<string, number>
  readonly features: ReadonlySet<string>
  requestDevice(descriptor: {
    requiredFeatures: Array<string>
    requiredLimits: Record<string, number>
  }): Promise<DeviceLike>
}

/** Dawn's Node binding: the `webgpu` package, from where `npm run setup:webgpu` puts it. */
export const dawnPackage = OptionalPackage.make<{ create: (flags: Array<string>) => GpuLike; globals: object }>({
  name: "webgpu",
  folder: ".webgpu",
  setupCommand: "npm run setup:webgpu"
})

let gpu: GpuLike | undefined
let found: AdapterLike | undefined
let adapter: Adapter | undefined
let deviceError: string | undefined

const isSoftware = (info: AdapterLike["info"]): boolean =>
  info.isFallbackAdapter === true ||
  info.architecture === "software" ||
  /llvmpipe|lavapipe|swiftshader/i.test(`${info.device} ${info.description}`)

const toAdapter = (
  info: AdapterLike["info"],
  limits: Record<string, number | undefined>,
  features: Iterable<string>
): Adapter => ({
  vendor: info.vendor,
  architecture: info.architecture,
  device: info.device,
  description: info.description,
  software: isSoftware(info),
  maxStorageBufferBindingSize: limits["maxStorageBufferBindingSize"] ?? 134_217_728,
  maxBufferSize: limits["maxBufferSize"] ?? 268_435_456,
  features: [...features].sort()
})

/**
 * Load Dawn, install the globals tfjs-backend-webgpu expects and find the adapter tfjs will use (high-performance).
 * Rejects, saying why, when the package does not load or no adapter is found (no Vulkan driver). Idempotent.
 */
export const probe = async (): Promise<Adapter> => {
  if (adapter !== undefined) return adapter
  const dawn = await dawnPackage.load()
  Object.assign(globalThis, dawn.globals)
  gpu ??= dawn.create([])
  // Node 21+ has a getter-only `navigator`; Node 20 has none
  if ((globalThis as { navigator?: object }).navigator === undefined) {
    Object.defineProperty(globalThis, "navigator", { value: {}, configurable: true, writable: true })
  }
  Object.defineProperty(globalThis.navigator, "gpu", { value: gpu, configurable: true, writable: true })
  const requested = await gpu.requestAdapter({ powerPreference: "high-performance" })
  if (requested === null) {
    throw new Error(
      "no WebGPU adapter: Dawn found no Vulkan driver (check `vulkaninfo --summary`; for a CPU-only machine install " +
        "Mesa's lavapipe, mesa-vulkan-drivers ≥ 25, e.g. from bookworm-backports: scripts/setup-system.sh)"
    )
  }
  found = requested
  adapter = toAdapter(requested.info, requested.limits, requested.features)
  return adapter
}

/**
 * The device nodes (under `dev`) through which Linux reaches a GPU: a DRM render node (`dri/renderD128`: Mesa's RADV,
 * ANV, NVK, virtio-gpu, …), the NVIDIA driver's `nvidia0`…, WSL 2's `dxg`, Arm's `mali0`. With none, every Vulkan
 * adapter Dawn could find runs on the CPU (lavapipe).
 */
export const gpuDeviceNodes = (dev = "/dev"): ReadonlyArray<string> => {
  const list = (dir: string): ReadonlyArray<string> => {
    try {
      return readdirSync(dir)
    } catch {
      return [] // no /dev/dri: no DRM driver loaded
    }
  }
  return [
    ...list(`${dev}/dri`)
      .filter((name) => /^renderD\d+$/.test(name))
      .map((name) => `dri/${name}`),
    ...list(dev).filter((name) => /^(nvidia\d+|dxg|mali\d+)$/.test(name))
  ].sort()
}

/** The lookup `probeQuietly`'s child runs: one JSON line with what `requestAdapter` found (null for none). */
const probeScript = `
const dawn = await import(process.argv[1])
const found = await dawn.create([]).requestAdapter({ powerPreference: "high-performance" })
const info = found?.info
const seen = found === null ? null : {
  info: { vendor: info.vendor, architecture: info.architecture, device: info.device, description: info.description,
    isFallbackAdapter: info.isFallbackAdapter },
  limits: { maxStorageBufferBindingSize: found.limits.maxStorageBufferBindingSize,
    maxBufferSize: found.limits.maxBufferSize },
  features: [...found.features]
}
process.stdout.write(JSON.stringify(seen) + "\\n", () => process.exit(0))
`

/**
 * The adapter `probe` would find (undefined for none), looked up in a child process whose output is kept from the
 * terminal: nothing Dawn prints reaches this process's stderr and no Dawn instance is created here. About 0.1 s.
 * Rejects, with the child's last words, when Dawn fails to load or the lookup takes over `timeoutMs`.
 */
export const probeQuietly = (timeoutMs = 30_000): Promise<Adapter | undefined> => {
  const resolved = dawnPackage.resolve()
  if (resolved === undefined) {
    return Promise.reject(new Error(`Dawn (the webgpu package) is not installed: run \`${dawnPackage.setupCommand}\``))
  }
  const entry = pathToFileURL(resolved).href
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      ["--input-type=module", "-e", probeScript, entry],
      { timeout: timeoutMs, killSignal: "SIGKILL" },
      (error, stdout, stderr) => {
        if (error !== null) {
          const last = stderr.trim().split("\n").at(-1) || error.message
          return reject(new Error(`the WebGPU adapter lookup failed (${error.signal ?? error.code}): ${last}`))
        }
        try {
          // the last line: anything a driver wrote to stdout comes before it
          const seen = JSON.parse(stdout.trim().split("\n").at(-1)!) as {
            info: AdapterLike["info"]
            limits: Record<string, number | undefined>
            features: Array<string>
          } | null
          resolve(seen === null ? undefined : toAdapter(seen.info, seen.limits, seen.features))
        } catch (cause) {
          reject(new Error(`the WebGPU adapter lookup printed no adapter: ${String(cause)}`))
        }
      }
    )
  })
}

/**
 * The hardware adapter `auto` may use, found without anything printed: rejects, saying why, when no GPU device node
 * exists (Linux; no Dawn is loaded then), when Dawn finds no adapter, or when the only one is a software rasteriser.
 */
export const findHardware = async (): Promise<Adapter> => {
  if (process.platform === "linux" && gpuDeviceNodes().length === 0) {
    throw new Error("no GPU here (no /dev/dri render node, /dev/nvidia0 or /dev/dxg)")
  }
  const seen = await probeQuietly()
  if (seen === undefined) throw new Error("no WebGPU adapter (no Vulkan driver)")
  if (seen.software) throw new Error(`only a software adapter (${seen.description})`)
  return seen
}

/** The limits we ask the device for: the adapter's, for what tfjs's kernels are bounded by. */
const limitNames = [
  "maxComputeWorkgroupStorageSize",
  "maxComputeWorkgroupsPerDimension",
  "maxStorageBufferBindingSize",
  "maxBufferSize",
  "maxComputeWorkgroupSizeX",
  "maxComputeInvocationsPerWorkgroup",
  "maxStorageBuffersPerShaderStage"
]

type BackendClass = new (
  device: DeviceLike,
  info: unknown
) => tf.KernelBackend & {
  read(dataId: object): Promise<tf.backend_util.BackendValues>
}

/** Make `webgpu` the active tfjs backend on a device we request (after `probe`). */
export const activate = async (): Promise<Adapter> => {
  const info = await probe()
  const webgpu = (await import("@tensorflow/tfjs-backend-webgpu")) as unknown as { WebGPUBackend: BackendClass }
  if (!registeredOurs) {
    const source = found!
    tf.removeBackend("webgpu")
    tf.registerBackend(
      "webgpu",
      async () => {
        const requiredLimits: Record<string, number> = {}
        for (const name of limitNames) {
          const value = source.limits[name]
          if (value !== undefined) requiredLimits[name] = value
        }
        const requiredFeatures = ["timestamp-query"].filter((f) => source.features.has(f))
        const device = await source.requestDevice({ requiredFeatures, requiredLimits })
        device.addEventListener("uncapturederror", (event) => {
          deviceError ??= event.error.message
        })
        void device.lost.then((lost) => {
          deviceError ??= `device lost: ${lost.message}`
        })
        return new (checked(webgpu.WebGPUBackend))(device, source.info)
      },
      3
    )
    registeredOurs = true
    registerAddN(source.limits["maxStorageBuffersPerShaderStage"] ?? 8)
  }
  const ok = await tf.setBackend("webgpu")
  if (!ok) throw new Error('tf.setBackend("webgpu") returned false')
  await tf.ready()
  return info
}

let registeredOurs = false

/** The backend with reads that fail once the device has reported an error. */
const checked = (Base: BackendClass): BackendClass =>
  class CheckedWebGpuBackend extends Base {
    override async read(dataId: object): Promise<tf.backend_util.BackendValues> {
      const values = await super.read(dataId)
      if (deviceError !== undefined) {
        const message = deviceError
        deviceError = undefined
        throw new Error(`WebGPU device error (the values computed since are invalid): ${message}`)
      }
      return values
    }
  }

/**
 * AddN in groups of at most `maxStorageBuffers − 1` inputs (one binding is the output), then the partial sums: the
 * stock kernel binds every input in one shader.
 */
const registerAddN = (maxStorageBuffers: number): void => {
  const stock = tf.getKernel("AddN", "webgpu")
  if (stock === undefined) return
  const group = Math.max(2, maxStorageBuffers - 1)
  const kernelFunc: tf.KernelFunc = (args) => {
    const inputs = args.inputs as unknown as Array<tf.TensorInfo>
    const backend = args.backend as unknown as { disposeData(dataId: object): void }
    if (inputs.length <= group) return stock.kernelFunc(args)
    let level = inputs
    while (level.length > group) {
      const next: Array<tf.TensorInfo> = []
      for (let i = 0; i < level.length; i += group) {
        const part = level.slice(i, i + group)
        next.push(
          part.length === 1
            ? part[0]!
            : (stock.kernelFunc({ ...args, inputs: part as unknown as tf.NamedTensorInfoMap }) as tf.TensorInfo)
        )
      }
      // partial sums of an earlier level are ours to free; the caller's inputs are not
      if (level !== inputs) for (const t of level) if (!next.includes(t)) backend.disposeData(t.dataId)
      level = next
    }
    const out = stock.kernelFunc({ ...args, inputs: level as unknown as tf.NamedTensorInfoMap }) as tf.TensorInfo
    if (level !== inputs) for (const t of level) backend.disposeData(t.dataId)
    return out
  }
  tf.unregisterKernel("AddN", "webgpu")
  tf.registerKernel({ kernelName: "AddN", backendName: "webgpu", kernelFunc })
}

/** The adapter in use, once `probe` has run. */
export const current = (): Adapter | undefined => adapter

/** One binding's byte limit on the active webgpu backend; Infinity on other backends. */
export const bindingLimitBytes = (): number =>
  tf.getBackend() === "webgpu" && adapter !== undefined ? adapter.maxStorageBufferBindingSize : Number.POSITIVE_INFINITY

/** Throws, naming the tensor, when one of `shape`'s float32 tensors could never be bound by a shader. */
export const checkBindingSize = (name: string, shape: ReadonlyArray<number>): void => {
  const bytes = shape.reduce((a, b) => a * b, 1) * 4
  const limit = bindingLimitBytes()
  if (bytes > limit) {
    throw new Error(
      `${name} ${JSON.stringify(shape)} is ${(bytes / 2 ** 20).toFixed(0)} MiB, over this WebGPU adapter's ` +
        `maxStorageBufferBindingSize of ${(limit / 2 ** 20).toFixed(0)} MiB (${adapter?.description ?? "?"}): ` +
        "use a GPU whose driver allows larger bindings, or another backend (backend.name: wasm | cpu)"
    )
  }
}

/**
 * Throws, naming the first tensor, when a model of this shape cannot run on the active webgpu adapter. Call before
 * loading: a 1.2 GB checkpoint is not read only to fail at the first shader. No-op on other backends.
 */
export const checkModelFits = (config: TransformerConfig): void => {
  if (bindingLimitBytes() === Number.POSITIVE_INFINITY) return
  for (const spec of Transformer.parameterSpecs(config)) checkBindingSize(spec.name, spec.hfShape)
}

/** The adapter and its limits in one log line. */
export const describe = (a: Adapter): string =>
  `${a.description || a.device} (vendor ${a.vendor || "?"}, ${a.architecture || "?"}` +
  `${a.software && a.architecture !== "software" ? ", software" : ""}; ` +
  `maxStorageBufferBindingSize ${(a.maxStorageBufferBindingSize / 2 ** 20).toFixed(0)} MiB, maxBufferSize ` +
  `${(a.maxBufferSize / 2 ** 20).toFixed(0)} MiB)`
