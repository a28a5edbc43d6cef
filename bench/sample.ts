/**
 * KV-cache sampling: batch 8, prompt 32, 96 new tokens, temperature 1 (Sampling.generate), on the perf model
 * (bench/harness.ts) or a HF checkpoint (`--model DIR`), effect-rl against PyTorch in the same run.
 * Last stdout line: {"bench":"sample","threads",…,"effectRl":{msPerStep,tokensPerSec},"torch":{…},"ratio"}
 * (msPerStep = one decode step = one token per row; ratio = effect-rl tokens/s / torch tokens/s); also written to
 * bench/results/sample.json (or `--out FILE`).
 *
 * Run: npm run bench -- sample [--backend wasm|webgpu|cpu] [--kernels native|stock] [--threads N] [--iters N]
 *        [--model DIR] [--batch B] [--prompt P] [--new N] [--warmup N] [--torch-device cpu|cuda] [--no-torch] [--out FILE]
 */
import * as Prng from "../src/model/Prng.ts"
import * as Sampling from "../src/model/Sampling.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as Harness from "./harness.ts"

export const run = async (): Promise<void> => {
  const iters = Math.max(Number(Harness.arg("min-iters", "5")), Number(Harness.arg("iters", "5")))
  const backend = await Harness.setUpBackend()
  const B = Number(Harness.arg("batch", "8"))
  const prompt = Number(Harness.arg("prompt", "32"))
  const newTokens = Number(Harness.arg("new", "96"))
  const { model, name, loadSeconds } = await Harness.benchModel()
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
  const effectRl: Harness.Throughput = {
    msPerStep: ms.wall / newTokens,
    tokensPerSec: (generated * 1000) / ms.wall,
    cpuMsPerStep: ms.cpu / newTokens
  }
  console.error(`effect-rl: ${JSON.stringify(effectRl)}`) // before the peer runs: kept if it fails
  const torchDevice = Harness.arg("torch-device", "cpu")
  const torch = process.argv.includes("--no-torch")
    ? undefined
    : Harness.runTorch(
        "sample.py",
        backend.threads,
        iters,
        Harness.torchWorkload(B, prompt, torchDevice, ["--new", String(newTokens)])
      )
  Harness.report({
    bench: "sample",
    threads: backend.threads,
    effectRl,
    torch:
      torch === undefined
        ? null
        : { msPerStep: torch.msPerStep, tokensPerSec: torch.tokensPerSec, cpuMsPerStep: torch.cpuMsPerStep },
    ratio: torch === undefined ? null : effectRl.tokensPerSec / torch.tokensPerSec,
    cpuRatio: torch === undefined ? null : torch.cpuMsPerStep / effectRl.cpuMsPerStep, // torch CPU ms / ours
    backend: backend.backend,
    adapter: backend.adapter,
    kernels: backend.kernels,
    torchThreads: torch?.threads ?? null,
    torchDevice: torch === undefined ? null : torchDevice,
    torchMatmulGflops: torch?.matmulGflops ?? null,
    workload: { model: name, loadSeconds, batch: B, prompt, newTokens, generated, temperature: 1, iters },
    ...Harness.environment()
  })
}

if (import.meta.main) await run()
