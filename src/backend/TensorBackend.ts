/**
 * The tfjs backend a process computes on. tfjs backends are process-global, so this service is initialised once per
 * process (or worker thread) and reports what it picked. `auto` prefers the native TensorFlow bindings when the user
 * has installed them (`@tensorflow/tfjs-node-gpu`; they are optional peers that cannot be installed in every
 * environment), then WebGPU through Dawn when it finds a hardware adapter (a GPU with a Vulkan driver, looked for only
 * where a GPU device exists and without printing; a software rasteriser such as lavapipe only when asked for by name),
 * then `@tensorflow/tfjs-node`, effect-rl's `native` backend (when its kernels built: tensors in JS memory, no 4 GB
 * ceiling), wasm, and the pure-JS cpu backend.
 */

import { availableParallelism } from "node:os"
import { isMainThread } from "node:worker_threads"
import { Context, Effect, Layer, Schema } from "effect"
import type { BackendConfig, BackendName } from "../config/BackendConfig.ts"
import type { TransformerConfig } from "../model/ModelConfig.ts"
import * as ModelConfig from "../model/ModelConfig.ts"
import * as NativeKernels from "../native/NativeKernels.ts"
import * as tf from "../tensor/Tf.ts"
import * as Backprop from "./Backprop.ts"
import * as MissingKernels from "./MissingKernels.ts"
import * as NativeBackend from "./NativeBackend.ts"
import * as WebGpu from "./WebGpu.ts"

export type ResolvedBackend = Exclude<BackendName, "auto">

export class TensorBackendError extends Schema.TaggedError<TensorBackendError>()("TensorBackendError", {
  backend: Schema.String,
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

export interface BackendInfo {
  readonly name: ResolvedBackend
  readonly tfjsName: string // what tf.getBackend() says: tensorflow, wasm, cpu
  readonly threads: number
  readonly kernels: "native" | "stock"
  readonly addedKernels: ReadonlyArray<string>
  readonly adapter?: WebGpu.Adapter // webgpu only
}

export class TensorBackend extends Context.Service<TensorBackend, BackendInfo>()("rl/backend/TensorBackend") {}

const tfjsNameOf = (name: ResolvedBackend): string =>
  name === "tensorflow-gpu" || name === "tensorflow" ? "tensorflow" : name

/** Load and activate one backend; rejects when its package is not installed or it fails to start. */
const activate = async (
  name: ResolvedBackend,
  threads: number,
  auto: boolean,
  kernels: "native" | "stock"
): Promise<void> => {
  switch (name) {
    case "webgpu": {
      // auto decides in a child process (no Dawn here): Dawn's warnings reach the terminal only if webgpu is chosen
      if (auto) await WebGpu.findHardware()
      const adapter = await WebGpu.probe()
      if (auto && adapter.software) throw new Error(`only a software adapter (${adapter.description})`)
      await WebGpu.activate()
      return
    }
    case "tensorflow-gpu":
    case "tensorflow": {
      if (threads > 0) {
        // Read by libtensorflow when the binding loads; must be set before the import.
        process.env["TF_NUM_INTRAOP_THREADS"] ??= String(threads)
        process.env["TF_NUM_INTEROP_THREADS"] ??= "1"
      }
      const pkg = name === "tensorflow-gpu" ? "@tensorflow/tfjs-node-gpu" : "@tensorflow/tfjs-node"
      await import(/* @vite-ignore */ pkg)
      break
    }
    case "native":
      // with stock kernels it is the cpu backend under another name: auto takes wasm instead
      if (auto && kernels === "stock") throw new Error("kernels: stock (the native backend runs native kernels)")
      NativeBackend.register()
      break
    case "wasm": {
      const wasm = await import("@tensorflow/tfjs-backend-wasm")
      if (threads > 0) wasm.setThreadsCount(threads)
      break
    }
    case "cpu":
      break
  }
  const ok = await tf.setBackend(tfjsNameOf(name))
  if (!ok) throw new Error(`tf.setBackend("${tfjsNameOf(name)}") returned false`)
  await tf.ready()
}

/**
 * The configured kernels, unless `EFFECT_RL_KERNELS` (native | stock) overrides them: how the whole test suite is run
 * both ways (`EFFECT_RL_KERNELS=native npx vitest run`).
 */
const kernelsOf = (config: BackendConfig): "native" | "stock" => {
  const forced = process.env["EFFECT_RL_KERNELS"]
  return forced === "native" || forced === "stock" ? forced : config.kernels
}

const autoOrder: ReadonlyArray<ResolvedBackend> = ["tensorflow-gpu", "webgpu", "tensorflow", "native", "wasm", "cpu"]

let loggedAdapter = false

let warnedNoBlas = false

/**
 * The one line saying which backend runs and how: `tensor backend: native (auto), native kernels (OpenBLAS), 2
 * threads; not installed: tensorflow-gpu, tensorflow; webgpu: no GPU adapter`. A backend whose optional package is
 * absent is named as not installed, not reported as an error.
 */
export const chosenLine = (info: BackendInfo, auto: boolean, failures: ReadonlyArray<string>): string => {
  const absent: Array<string> = []
  const other: Array<string> = []
  for (const failure of failures) {
    const [name, ...rest] = failure.split(": ")
    const reason = rest.join(": ")
    if (/ERR_MODULE_NOT_FOUND|Cannot find (package|module)/.test(reason)) absent.push(name!)
    else other.push(`${name}: ${reason.slice(0, 120)}`)
  }
  const status = info.kernels === "native" ? NativeKernels.status() : undefined
  const blas = status?.available === true ? status.blas : undefined
  return (
    `tensor backend: ${info.name}${auto ? " (auto)" : ""}, ${info.kernels} kernels` +
    `${blas === undefined ? "" : ` (${blas === "openblas" ? "OpenBLAS" : "own SGEMM"})`}${info.threads > 0 ? `, ${info.threads} thread(s)` : ""}` +
    (absent.length > 0 ? `; not installed: ${absent.join(", ")}` : "") +
    (other.length > 0 ? `; skipped ${other.join("; ")}` : "")
  )
}

/** Initialise tfjs as configured. Also usable outside Effect (tests, workers) through `Effect.runPromise`. */
export const initialise = Effect.fn("TensorBackend.initialise")(function* (config: BackendConfig) {
  Backprop.install() // every backend: the backward pass frees each node's gradients and saved tensors once used
  const candidates = config.name === "auto" ? autoOrder : [config.name]
  const failures: Array<string> = []
  for (const name of candidates) {
    const started = yield* Effect.tryPromise({
      try: () => activate(name, config.threads, config.name === "auto", kernelsOf(config)),
      catch: (cause) => new TensorBackendError({ backend: name, message: String(cause), cause })
    }).pipe(Effect.result)
    if (started._tag === "Failure") {
      failures.push(`${name}: ${started.failure.message.split("\n")[0]}`)
      if (config.name !== "auto") return yield* started.failure
      continue
    }
    const tfjsName = tf.getBackend()
    // After MissingKernels: the native UnsortedSegmentSum replaces the JS one and keeps it as its fallback.
    const missing = MissingKernels.register(tfjsName)
    const native = kernelsOf(config) === "native" ? NativeKernels.register(tfjsName, config.threads) : []
    const info: BackendInfo = {
      name,
      tfjsName,
      // wasm in Node runs single-threaded whatever setThreadsCount says (measured); our native kernels use their own
      // thread pool; tensorflow uses the env setting.
      threads:
        native.length > 0
          ? config.threads || availableParallelism()
          : name === "wasm" || name === "cpu" || name === "native"
            ? 1
            : config.threads,
      kernels: native.length > 0 ? "native" : "stock",
      addedKernels: [...missing, ...native],
      ...(name === "webgpu" && WebGpu.current() !== undefined ? { adapter: WebGpu.current()! } : {})
    }
    if (info.adapter !== undefined && !loggedAdapter && isMainThread) {
      loggedAdapter = true
      yield* Effect.logInfo(`webgpu adapter: ${WebGpu.describe(info.adapter)}`)
    }
    const nativeStatus = native.length > 0 ? NativeKernels.status() : undefined
    // once per process: the worker engine's thread loads the same build
    if (nativeStatus?.available === true && nativeStatus.blas !== "openblas" && !warnedNoBlas && isMainThread) {
      warnedNoBlas = true
      yield* Effect.logWarning(
        "native kernels built without OpenBLAS (their own SGEMM): a training step takes about twice as long " +
          "(bench/quickstart-sizes.ts); install libopenblas-dev (Debian/Ubuntu) and run `node native/install.mjs`"
      )
    }
    if (isMainThread) yield* Effect.logInfo(chosenLine(info, config.name === "auto", failures))
    return info
  }
  return yield* new TensorBackendError({
    backend: config.name,
    message: `no backend could start: ${failures.join("; ")}`
  })
})

export const layer = (config: BackendConfig): Layer.Layer<TensorBackend, TensorBackendError> =>
  Layer.effect(TensorBackend, initialise(config))

/** What a model is loaded for: the tensors it needs beside its weights. */
export type ModelUse = "inference" | "training" | "lora-training"

/** The wasm heap: every tensor of the backend in one 32-bit address space. */
const wasmHeapBytes = 4 * 2 ** 30

/**
 * Throws, naming the backend and what to use instead, when a model of this shape cannot run on the active backend:
 * on wasm when its tensors (weights; for inference the fused copies too; for full training gradients and Adam's two
 * moments) would not fit the 4 GB heap, which otherwise fails deep inside XNNPACK ("status 6"); on webgpu when a
 * tensor passes the adapter's binding limit (WebGpu.checkModelFits). Call before loading. No-op elsewhere.
 */
export const checkModelFits = (config: TransformerConfig, use: ModelUse = "inference"): void => {
  WebGpu.checkModelFits(config)
  if (tf.getBackend() !== "wasm") return
  const weights = ModelConfig.parameterCount(config) * 4
  const copies = use === "training" ? 4.25 : use === "lora-training" ? 1.25 : 1.75
  const needed = weights * copies
  if (needed > wasmHeapBytes * 0.85) {
    const gb = (b: number) => `${(b / 1e9).toFixed(1)} GB`
    throw new Error(
      `backend wasm cannot hold this model: ${ModelConfig.parameterCount(config).toLocaleString("en")} parameters ` +
        `need about ${gb(needed)} of tensors for ${use}, and wasm keeps every tensor in one 4 GB heap; use ` +
        "backend.name: native (tensors in JS memory; `auto` picks it when the native kernels built)"
    )
  }
}
