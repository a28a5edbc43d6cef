/**
 * KV-cache sampling, temperature 1 (Sampling.generate), effect-rl against PyTorch in the same run: batch 8, prompt 32,
 * 96 new tokens on the perf model (bench/harness.ts), as the committed results did; batch 8, prompt 128, 128 new
 * tokens on a HF checkpoint (`--model DIR`, loaded by both sides from the same safetensors, BF16 on disk → float32).
 *
 * Last stdout line: {"bench":"sample","threads",…,"effectRl":{msPerStep,tokensPerSec,cpuMsPerStep,peakRssMb},
 * "torch":{…, peakRssMb} or {"error"},"ratio",…} (msPerStep = one decode step = one token per row; ratio =
 * effect-rl tokens/s / torch tokens/s; peakRssMb: each process's own peak resident memory, loading included); also
 * written to bench/out/sample.json (`--out FILE`: bench/results/FILE), with the command line, date and machine load.
 *
 * `--weights bf16` (native backend): every projection weight stored as bfloat16 and read in place (Transformer.storeFrozen).
 *
 * `--engine llamacpp`: llama.cpp against our LocalEngine instead of PyTorch (bench/sample-llamacpp.ts has its flags).
 *
 * Run: npm run bench -- sample [--model DIR] [--batch B] [--prompt P] [--new N] [--weights f32|bf16]
 *        [--backend wasm|native|cpu|webgpu|tensorflow|tensorflow-gpu] [--kernels native|stock] [--threads N]
 *        [--iters N] [--min-iters N] [--warmup N] [--torch-device cpu|cuda] [--no-torch] [--out FILE]
 * (defaults: --iters 5, --warmup 1; on the perf model at least --min-iters 5 timed runs.)
 */
import * as NativeBackend from "../src/backend/NativeBackend.ts"
import * as Prng from "../src/model/Prng.ts"
import * as Sampling from "../src/model/Sampling.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as Harness from "./harness.ts"

export const run = async (): Promise<void> => {
  const engine = Harness.arg("engine", "")
  if (engine === "llamacpp") return (await import("./sample-llamacpp.ts")).run()
  if (engine !== "") throw new Error(`--engine ${engine}: llamacpp (or none: PyTorch's peer)`)
  const real = Harness.hasModel()
  // at least 5 timed steps on the perf model, as its committed results had; a checkpoint's steps are long enough
  const iters = Math.max(Number(Harness.arg("min-iters", real ? "1" : "5")), Number(Harness.arg("iters", "5")))
  const backend = await Harness.setUpBackend()
  const B = Number(Harness.arg("batch", "8"))
  const prompt = Number(Harness.arg("prompt", real ? "128" : "32"))
  const newTokens = Number(Harness.arg("new", real ? "128" : "96"))
  const torchDevice = Harness.arg("torch-device", "cpu")
  // the peer runs first, so that the two processes never hold their memory at once
  const torch = Harness.has("no-torch")
    ? undefined
    : await Harness.runTorch(
        "sample.py",
        backend.threads,
        iters,
        Harness.torchWorkload(B, prompt, torchDevice, ["--new", String(newTokens)])
      )
  // `--weights bf16` (native backend): every projection weight stored as bfloat16 as it loads, read in place (a lean
  // view)
  const weights = backend.backend === "native" ? Harness.arg("weights", "f32") : "f32"
  const { model, name, loadSeconds } = await Harness.benchModel(
    "inference",
    weights === "bf16" ? (weight, v) => weight.endsWith("_proj.weight") && NativeBackend.storeBf16(v) : undefined
  )
  if (weights === "bf16") Transformer.storeFrozen(model, NativeBackend.storeBf16, true)
  const V = model.config.vocabSize
  const prng = Prng.make(1)
  const prompts = Array.from({ length: B }, () => Array.from({ length: prompt }, () => Math.floor(prng.next() * V)))
  let generated = 0
  const ms = await Harness.medianMs(
    async () => {
      const out = await Sampling.generate(
        model,
        prompts.map((promptIds, i) => ({
          promptIds,
          sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: newTokens, seed: i }
        }))
      )
      generated = out.reduce((n, c) => n + c.tokens.length, 0)
    },
    iters,
    Number(Harness.arg("warmup", "1"))
  )
  Transformer.dispose(model)
  const effectRl = {
    msPerStep: ms.wall / newTokens,
    tokensPerSec: (generated * 1000) / ms.wall,
    cpuMsPerStep: ms.cpu / newTokens,
    peakRssMb: Math.round(Harness.peakRssMb())
  }
  console.error(`effect-rl: ${JSON.stringify(effectRl)}`)
  const compared = Harness.comparison(effectRl, torch)
  Harness.report({
    bench: "sample",
    threads: backend.threads,
    effectRl,
    torch: compared.torch,
    ratio: compared.ratio,
    cpuRatio: compared.cpuRatio,
    backend: backend.backend,
    adapter: backend.adapter,
    kernels: backend.kernels,
    torchThreads: compared.torchThreads,
    torchDevice: torch === undefined ? null : torchDevice,
    torchMatmulGflops: compared.torchMatmulGflops,
    workload: { model: name, loadSeconds, weights, batch: B, prompt, newTokens, generated, temperature: 1, iters },
    ...Harness.environment()
  })
}

if (import.meta.main) await run()
