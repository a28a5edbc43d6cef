/**
 * Shared by bench/train-step.ts and bench/sample.ts: the perf model (the one bench/model-throughput.ts uses: Qwen3-style,
 * vocab 512, d_model 256, 4 layers, 4 heads, SwiGLU 1024, tied embeddings, fp32) or a HF checkpoint (`--model DIR`,
 * e.g. one made by scripts/make-checkpoint.ts), backend set-up (`--backend wasm|webgpu|cpu`, wasm with native or stock
 * kernels), medians, and the PyTorch peer (bench/torch/*.py, run with the system python3 in the same run; with
 * `--torch-device cuda` on the GPU).
 */
import { execFileSync, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "@tensorflow/tfjs"
import { Effect } from "effect"
import * as NativeKernels from "../src/native/NativeKernels.ts"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import * as WebGpu from "../src/backend/WebGpu.ts"
import * as Checkpoint from "../src/model/Checkpoint.ts"
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

/** The model to bench: `--model DIR` (a HF checkpoint directory), else the perf model. */
export const benchModel = async (): Promise<{ model: Transformer.Transformer; name: string; loadSeconds: number }> => {
  const dir = arg("model", "")
  if (dir === "") return { model: perfModel(), name: "perf", loadSeconds: 0 }
  const start = performance.now()
  const config = await Checkpoint.readConfig(dir)
  WebGpu.checkModelFits(config)
  const { model } = await Checkpoint.load(dir)
  // one tiny forward so the upload of the weights counts as loading, not as the first step
  const probe = tf.tidy(() => Transformer.forward(model, { ids: [[1, 2]] }))
  await probe.data()
  probe.dispose()
  return { model, name: path.basename(path.resolve(dir)), loadSeconds: (performance.now() - start) / 1000 }
}

export type BenchBackend = "wasm" | "webgpu" | "cpu"

/**
 * `--backend wasm` (default) with native kernels (default) or stock ones (`--kernels stock`), `webgpu`, or `cpu`.
 * Returns the thread count used.
 */
export const setUpBackend = async (): Promise<{
  backend: BenchBackend
  kernels: "native" | "stock"
  threads: number
  registered: number
  adapter: WebGpu.Adapter | null
}> => {
  const backend = arg("backend", "wasm") as BenchBackend
  if (!["wasm", "webgpu", "cpu"].includes(backend)) throw new Error(`--backend ${backend}: one of wasm, webgpu, cpu`)
  const kernels = arg("kernels", "native") === "stock" || backend !== "wasm" ? "stock" : "native"
  const threads = Number(arg("threads", String(os.availableParallelism())))
  const info = await Effect.runPromise(TensorBackend.initialise({ name: backend, threads, kernels }))
  const registered = kernels === "native" ? NativeKernels.register("wasm", threads).length : 0
  return {
    backend,
    kernels: registered > 0 ? "native" : "stock",
    threads: registered > 0 ? threads : 1,
    registered,
    adapter: info.adapter ?? null
  }
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

/**
 * Run bench/torch/<script>.py with up to `threads` threads (it picks its faster setting); its last stdout line.
 * `extra`: the workload for a `--model` run (config.json path, batch, lengths, device), passed on as flags.
 */
export const runTorch = (
  script: string,
  threads: number,
  iters: number,
  extra: ReadonlyArray<string> = []
): TorchResult => {
  ensureTorch()
  const out = execFileSync(
    python,
    [path.join(import.meta.dirname, "torch", script), String(threads), String(iters), ...extra],
    {
      cwd: path.join(import.meta.dirname, "torch"),
      encoding: "utf8",
      env: { ...process.env, OMP_NUM_THREADS: String(threads), OPENBLAS_NUM_THREADS: String(threads) }
    }
  )
  const result = JSON.parse(out.trim().split("\n").at(-1)!) as TorchResult
  if (result.matmulGflops < 100) {
    console.error(
      `bench: torch's 1024² matmul reached only ${result.matmulGflops.toFixed(1)} GFLOP/s (< 100): ` +
        `the machine is loaded (load average ${os.loadavg()[0]!.toFixed(2)}) or torch's BLAS is slow; ratios still compare like with like`
    )
  }
  return result
}

/** The torch peer's flags for this run's workload: the `--model` checkpoint's config.json, sizes, device. */
export const torchWorkload = (
  batch: number,
  tokens: number,
  device: string,
  extra: ReadonlyArray<string> = []
): Array<string> => {
  const dir = arg("model", "")
  return [
    ...(dir === "" ? [] : ["--config", path.resolve(dir, "config.json")]),
    "--batch",
    String(batch),
    "--tokens",
    String(tokens),
    "--device",
    device,
    ...extra
  ]
}

/**
 * Print the result as the last stdout line and write it to bench/results/<bench>.json (only full runs: a `--no-torch`
 * run, `torch: null`, does not replace the recorded comparison; benches without a torch peer always write).
 */
export const report = (
  result: { readonly bench: string; readonly torch?: unknown } & Record<string, unknown>,
  fileName = arg("out", `${result.bench}.json`)
): void => {
  if (result.torch !== null) {
    const file = path.isAbsolute(fileName) ? fileName : path.join(import.meta.dirname, "results", fileName)
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
