/**
 * Shared by bench/train-step.ts and bench/sample.ts: the perf model (the one bench/model-throughput.ts uses: Qwen3-style,
 * vocab 512, d_model 256, 4 layers, 4 heads, SwiGLU 1024, tied embeddings, fp32), backend set-up with native or stock
 * kernels, medians, and the PyTorch peer (bench/torch/*.py, run with the system python3 in the same run).
 */
import { execFileSync, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "@tensorflow/tfjs"
import { Effect } from "effect"
import * as NativeKernels from "../src/backend/NativeKernels.ts"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Transformer from "../src/model/Transformer.ts"

export const arg = (name: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback
}

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

/** wasm backend with native kernels (default) or stock ones (`--kernels stock`). Returns the thread count used. */
export const setUpBackend = async (): Promise<{ kernels: "native" | "stock"; threads: number; registered: number }> => {
  const kernels = arg("kernels", "native") === "stock" ? "stock" : "native"
  const threads = Number(arg("threads", String(os.availableParallelism())))
  await Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads, kernels }))
  const registered = kernels === "native" ? NativeKernels.register("wasm", threads).length : 0
  return { kernels: registered > 0 ? "native" : "stock", threads: registered > 0 ? threads : 1, registered }
}

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
}

const python = "/usr/bin/python3"

/** Make sure PyTorch (Debian python3-torch, with pthread OpenBLAS) is installed; installs it with apt when missing. */
const ensureTorch = (): void => {
  const probe = spawnSync(python, ["-c", "import torch"], { stdio: "ignore" })
  if (probe.status === 0) return
  console.error("bench: installing python3-torch and libopenblas0-pthread with apt (one time)…")
  execFileSync("apt-get", ["update"], { stdio: "inherit" })
  execFileSync("apt-get", ["install", "-y", "python3-torch", "libopenblas0-pthread"], {
    stdio: "inherit",
    env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" }
  })
}

/** Run bench/torch/<script>.py with up to `threads` threads (it picks its faster setting); its last stdout line. */
export const runTorch = (script: string, threads: number, iters: number): TorchResult => {
  ensureTorch()
  const out = execFileSync(python, [path.join(import.meta.dirname, "torch", script), String(threads), String(iters)], {
    cwd: path.join(import.meta.dirname, "torch"),
    encoding: "utf8",
    env: { ...process.env, OMP_NUM_THREADS: String(threads), OPENBLAS_NUM_THREADS: String(threads) }
  })
  const result = JSON.parse(out.trim().split("\n").at(-1)!) as TorchResult
  if (result.matmulGflops < 100) {
    console.error(
      `bench: torch's 1024² matmul reached only ${result.matmulGflops.toFixed(1)} GFLOP/s (< 100): ` +
        `the machine is loaded (load average ${os.loadavg()[0]!.toFixed(2)}) or torch's BLAS is slow; ratios still compare like with like`
    )
  }
  return result
}

/**
 * Print the result as the last stdout line and write it to bench/results/<bench>.json (only full runs: a `--no-torch`
 * run, `torch: null`, does not replace the recorded comparison; benches without a torch peer always write).
 */
export const report = (
  result: { readonly bench: string; readonly torch?: unknown } & Record<string, unknown>
): void => {
  if (result.torch !== null) {
    const file = path.join(import.meta.dirname, "results", `${result.bench}.json`)
    fs.mkdirSync(path.dirname(file), { recursive: true })
    fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`)
  }
  console.log(JSON.stringify(result))
}

export const environment = () => ({
  cpu: os.cpus()[0]?.model ?? "unknown",
  cores: os.availableParallelism(),
  loadAvg1m: Number(os.loadavg()[0]!.toFixed(2)), // other processes on the cores make both sides slower
  native: NativeKernels.status(),
  tfjsBackend: tf.getBackend(),
  node: process.version,
  date: new Date().toISOString()
})
