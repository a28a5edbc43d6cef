/**
 * Shared by bench/train-step.ts and bench/sample.ts: the perf model (the one bench/model-throughput.ts uses:
 * Qwen3-style, vocab 512, d_model 256, 4 layers, 4 heads, SwiGLU 1024, tied embeddings, fp32) or a HF checkpoint
 * (`--model DIR`, e.g. one made by scripts/make-checkpoint.ts), backend set-up (`--backend NAME`: any name the run
 * config accepts but auto: wasm (default), native, cpu, webgpu, tensorflow, tensorflow-gpu; native or stock kernels),
 * medians, peak memory, and the PyTorch peer (bench/torch/*.py, run with the system python3 in the same run, loading
 * the same safetensors; with `--torch-device cuda` on the GPU).
 *
 * Peak memory: ours is this process's maxRSS (a child's memory never counts in it); the peer, which runs first so that
 * the two never hold memory at once, reports its own ru_maxrss. When the kernel kills the peer (SIGKILL, most likely out of memory) the run goes on
 * and records `torch: {"error": "killed (out of memory?) at X MB"}`, X the peer's high-water mark as last sampled.
 */
import { execFileSync, spawn, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import type * as WebGpu from "../src/backend/WebGpu.ts"
import * as BackendConfig from "../src/config/BackendConfig.ts"
import * as Checkpoint from "../src/model/Checkpoint.ts"
import * as Decoder from "../src/model/Decoder.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as NativeKernels from "../src/native/NativeKernels.ts"
import * as TensorFile from "../src/native/TensorFile.ts"
import { arg, writeResult } from "./args.ts"

export { arg, has } from "./args.ts"

/** True when `--model DIR` names a checkpoint (the benches' defaults then move to real-model sizes). */
export const hasModel = (): boolean => arg("model", "") !== ""

export const perfConfig = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 512,
  hidden_size: 256,
  intermediate_size: 1024,
  num_hidden_layers: 4,
  num_attention_heads: 4,
  num_key_value_heads: 4,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 1024,
  tie_word_embeddings: true
})

export const perfModel = (): Transformer.Transformer => Transformer.init(perfConfig, 0)

/** The model to bench: `--model DIR` (a HF checkpoint directory), else the perf model. */
export const benchModel = async (
  use: TensorBackend.ModelUse = "inference",
  store?: (name: string, variable: tf.Variable) => void
): Promise<{ model: Transformer.Transformer; name: string; loadSeconds: number }> => {
  const dir = arg("model", "")
  if (dir === "") return { model: perfModel(), name: "perf", loadSeconds: 0 }
  const start = performance.now()
  const config = await Checkpoint.readConfig(dir)
  TensorBackend.checkModelFits(config, use) // a backend that cannot hold it says so, before loading
  const { model } = await TensorFile.load(dir, store === undefined ? {} : { store })
  // one tiny forward so the upload of the weights counts as loading, not as the first step
  const probe = tf.tidy(() => Decoder.forward(model, { ids: [[1, 2]] }))
  await probe.data()
  probe.dispose()
  return { model, name: path.basename(path.resolve(dir)), loadSeconds: (performance.now() - start) / 1000 }
}

export type BenchBackend = Exclude<BackendConfig.BackendName, "auto">

/** Every backend the run config names, but auto: the bench measures one backend, named. */
const backendNames = BackendConfig.BackendName.literals.filter((n): n is BenchBackend => n !== "auto")

/**
 * `--backend NAME` (default wasm; with `--model`, native when the native kernels built) with native kernels (default) or stock ones (`--kernels stock`). `threads` is what
 * the backend computes with (cores with native kernels, 1 for stock wasm and cpu), and the most the PyTorch peer may
 * use.
 */
export const setUpBackend = async (): Promise<{
  backend: BenchBackend
  kernels: "native" | "stock"
  threads: number
  registered: number
  adapter: WebGpu.Adapter | null
}> => {
  const fallback = hasModel() && NativeKernels.status().available ? "native" : "wasm"
  const backend = arg("backend", fallback) as BenchBackend
  if (!backendNames.includes(backend)) throw new Error(`--backend ${backend}: one of ${backendNames.join(", ")}`)
  const threads = Number(arg("threads", String(os.availableParallelism())))
  const kernels = arg("kernels", "native") === "stock" ? "stock" : "native"
  const info = await Effect.runPromise(TensorBackend.initialise({ name: backend, threads, kernels }))
  const native = info.kernels === "native"
  return {
    backend,
    kernels: info.kernels,
    // a GPU backend's peer on the CPU gets one thread, as before (compare with --torch-device cuda instead)
    threads:
      backend === "webgpu" || backend === "tensorflow-gpu" ? 1 : native ? info.threads || threads : info.threads || 1,
    registered: native ? info.addedKernels.length : 0,
    adapter: info.adapter ?? null
  }
}

/** This process's peak resident memory so far, MB (children excluded). */
export const peakRssMb = (): number => process.resourceUsage().maxRSS / 1024

const median = (xs: Array<number>): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/**
 * Median wall and CPU milliseconds (CPU: all threads of the process) of `iters` runs after `warmup` runs. On a loaded
 * machine wall time depends on the neighbours; CPU time much less so.
 */
export const medianMs = async (
  run: () => void | Promise<void>,
  iters: number,
  warmup = 1
): Promise<{ wall: number; cpu: number }> => {
  for (let i = 0; i < warmup; i++) await run()
  const wall: Array<number> = []
  const cpu: Array<number> = []
  for (let i = 0; i < iters; i++) {
    const start = performance.now()
    const cpuStart = process.cpuUsage()
    await run()
    const used = process.cpuUsage(cpuStart)
    wall.push(performance.now() - start)
    cpu.push((used.user + used.system) / 1000)
  }
  return { wall: median(wall), cpu: median(cpu) }
}

export interface Throughput {
  readonly msPerStep: number
  readonly tokensPerSec: number
  readonly cpuMsPerStep: number // CPU time of all threads per step
}

export interface TorchResult extends Throughput {
  readonly threads: number
  readonly matmulGflops: number
  readonly peakRssMb: number
  readonly trainable?: number // train-step: parameters the optimizer updates
}

/** The peer did not finish: the kernel killed it (most likely out of memory). */
export interface TorchFailure {
  readonly error: string
}

export const failed = (torch: TorchResult | TorchFailure | undefined): torch is TorchFailure =>
  torch !== undefined && "error" in torch

// BENCH_PYTHON: another interpreter with torch (e.g. a GPU machine's CUDA build); then nothing is installed
const python = process.env["BENCH_PYTHON"] ?? "/usr/bin/python3"

/** Make sure PyTorch (Debian python3-torch, with pthread OpenBLAS) is installed; installs it with apt when missing. */
const ensureTorch = (): void => {
  const probe = spawnSync(python, ["-c", "import torch"], { stdio: "ignore" })
  if (probe.status === 0) return
  if (process.env["BENCH_PYTHON"] !== undefined) throw new Error(`BENCH_PYTHON=${python} cannot import torch`)
  console.error("bench: installing python3-torch and libopenblas0-pthread with apt (one time)…")
  execFileSync("apt-get", ["update"], { stdio: "inherit" })
  execFileSync("apt-get", ["install", "-y", "python3-torch", "libopenblas0-pthread"], {
    stdio: "inherit",
    env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" }
  })
}

/** The high-water mark of a process's resident memory, MB, from /proc (undefined once it is gone). */
const highWaterMb = (pid: number): number | undefined => {
  try {
    const kb = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]
    return kb === undefined ? undefined : Number(kb) / 1024
  } catch {
    return undefined
  }
}

/**
 * Run bench/torch/<script>.py with up to `threads` threads (it picks its faster setting); its last stdout line, or a
 * TorchFailure when the kernel killed it. Any other failure throws. `extra`: the workload (checkpoint, batch, lengths,
 * device, LoRA, checkpointing), passed on as flags. Its stderr goes to ours.
 */
export const runTorch = async (
  script: string,
  threads: number,
  iters: number,
  extra: ReadonlyArray<string> = []
): Promise<TorchResult | TorchFailure> => {
  ensureTorch()
  const child = spawn(
    python,
    [path.join(import.meta.dirname, "torch", script), String(threads), String(iters), ...extra],
    {
      cwd: path.join(import.meta.dirname, "torch"),
      env: { ...process.env, OMP_NUM_THREADS: String(threads), OPENBLAS_NUM_THREADS: String(threads) },
      stdio: ["ignore", "pipe", "inherit"]
    }
  )
  let stdout = ""
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk))
  let highWater = 0
  const sample = () => (highWater = Math.max(highWater, highWaterMb(child.pid ?? -1) ?? 0))
  const timer = setInterval(sample, 100)
  const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
    child.on("error", reject)
    child.on("exit", (code, signal) => resolve({ code, signal }))
  }).finally(() => clearInterval(timer))
  if (exit.signal === "SIGKILL") {
    const error = `killed (out of memory?) at ${highWater.toFixed(0)} MB`
    console.error(`bench: torch ${script} was ${error}`)
    return { error }
  }
  if (exit.code !== 0) {
    throw new Error(`torch ${script} failed (${exit.signal ?? `exit code ${exit.code}`}); its stderr is above`)
  }
  const result = JSON.parse(stdout.trim().split("\n").at(-1)!) as TorchResult
  if (result.matmulGflops < 100) {
    console.error(
      `bench: torch's 1024² matmul reached only ${result.matmulGflops.toFixed(1)} GFLOP/s (< 100): ` +
        `the machine is loaded (load average ${os.loadavg()[0]!.toFixed(2)}) or torch's BLAS is slow; ratios still compare like with like`
    )
  }
  return result
}

/** The peer's flags for this run's workload: the `--model` checkpoint directory, sizes, device, and `extra`. */
export const torchWorkload = (
  batch: number,
  tokens: number,
  device: string,
  extra: ReadonlyArray<string> = []
): Array<string> => {
  const dir = arg("model", "")
  return [
    ...(dir === "" ? [] : ["--model", path.resolve(dir)]),
    "--batch",
    String(batch),
    "--tokens",
    String(tokens),
    "--device",
    device,
    ...extra
  ]
}

/** The record's torch fields: its throughput and peak memory, or its failure; the ratios, null without both sides. */
export const comparison = (effectRl: Throughput, torch: TorchResult | TorchFailure | undefined) => {
  const ok = torch !== undefined && !failed(torch) ? torch : undefined
  return {
    torch:
      torch === undefined
        ? null
        : ok === undefined
          ? torch
          : {
              msPerStep: ok.msPerStep,
              tokensPerSec: ok.tokensPerSec,
              cpuMsPerStep: ok.cpuMsPerStep,
              peakRssMb: Math.round(ok.peakRssMb)
            },
    ratio: ok === undefined ? null : effectRl.tokensPerSec / ok.tokensPerSec,
    cpuRatio: ok === undefined ? null : ok.cpuMsPerStep / effectRl.cpuMsPerStep, // torch CPU ms / ours
    torchThreads: ok?.threads ?? null,
    torchMatmulGflops: ok?.matmulGflops ?? null
  }
}

/**
 * Print the result as the last stdout line and write it to bench/out/<bench>.json, or with `--out FILE` to
 * bench/results/FILE (args.ts). Only full runs are written: a `--no-torch` run (`torch: null`) is no comparison;
 * benches without a torch peer always write.
 */
export const report = (
  result: { readonly bench: string; readonly torch?: unknown } & Record<string, unknown>
): void => {
  if (result.torch !== null) writeResult(`${result.bench}.json`, result)
  console.log(JSON.stringify(result))
}

const memoryAvailableMb = (): number | null => {
  try {
    const kb = /MemAvailable:\s+(\d+) kB/.exec(fs.readFileSync("/proc/meminfo", "utf8"))?.[1]
    return kb === undefined ? null : Math.round(Number(kb) / 1024)
  } catch {
    return null
  }
}

const round2 = (x: number): number => Number(x.toFixed(2))

// taken when the bench starts (this module loads first): what else the machine was doing before we added our load
const atStart = { loadAvg: os.loadavg().map(round2), memoryAvailableMb: memoryAvailableMb() }

/** The machine and its load, the command line and the date, for the record. */
export const environment = () => ({
  command: ["node", path.relative(process.cwd(), process.argv[1] ?? ""), ...process.argv.slice(2)].join(" "),
  cpu: os.cpus()[0]?.model ?? "unknown",
  cores: os.availableParallelism(),
  memoryTotalMb: Math.round(os.totalmem() / 2 ** 20),
  loadAvg1m: round2(os.loadavg()[0]!), // other processes on the cores make both sides slower
  loadAvg: os.loadavg().map(round2), // 1, 5, 15 minutes, at the end (the bench's own load included)
  atStart, // load average and available memory before the bench did anything
  native: NativeKernels.status(),
  tfjsBackend: tf.getBackend(),
  node: process.version,
  date: new Date().toISOString()
})
