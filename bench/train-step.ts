/**
 * Train step: forward + backward + Adam on −mean token log-prob, batch 8 × 128 tokens, on the perf model
 * (bench/harness.ts) or a HF checkpoint (`--model DIR`), effect-rl against PyTorch in the same run.
 * Last stdout line: {"bench":"train-step","threads",…,"effectRl":{msPerStep,tokensPerSec},"torch":{…},"ratio"}
 * (ratio = effect-rl throughput / torch throughput); also written to bench/results/train-step.json (or `--out FILE`).
 *
 * Run: npm run bench -- train-step [--backend wasm|webgpu|cpu] [--kernels native|stock] [--threads N] [--iters N]
 *        [--model DIR] [--batch B] [--tokens T] [--warmup N] [--torch-device cpu|cuda] [--no-torch] [--out FILE]
 */
import * as tf from "@tensorflow/tfjs"
import * as NativeKernels from "../src/native/NativeKernels.ts"
import * as LogProbs from "../src/model/LogProbs.ts"
import * as Prng from "../src/model/Prng.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as Harness from "./harness.ts"

export const run = async (): Promise<void> => {
  const iters = Math.max(Number(Harness.arg("min-iters", "5")), Number(Harness.arg("iters", "5")))
  const backend = await Harness.setUpBackend()
  const B = Number(Harness.arg("batch", "8"))
  const T = Number(Harness.arg("tokens", "128"))
  const { model, name, loadSeconds } = await Harness.benchModel()
  const V = model.config.vocabSize
  const prng = Prng.make(1)
  const ids = Array.from({ length: B }, () => Array.from({ length: T }, () => Math.floor(prng.next() * V)))
  const optimizer = backend.kernels === "native" ? NativeKernels.adam(1e-4) : tf.train.adam(1e-4)
  const variables = Transformer.trainableVariables(model)
  const step = async () => {
    const loss = optimizer.minimize(
      () => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar,
      true,
      variables
    )!
    await loss.data() // waits for the step (the GPU's queue too)
    loss.dispose()
  }
  const ms = await Harness.medianMs(step, iters, Number(Harness.arg("warmup", "2")))
  const tensorsLeft = tf.memory().numTensors
  optimizer.dispose()
  Transformer.dispose(model)
  const effectRl: Harness.Throughput = {
    msPerStep: ms.wall,
    tokensPerSec: (B * T * 1000) / ms.wall,
    cpuMsPerStep: ms.cpu
  }
  console.error(`effect-rl: ${JSON.stringify(effectRl)}`) // before the peer runs: kept if it fails
  const torchDevice = Harness.arg("torch-device", "cpu")
  const torch = process.argv.includes("--no-torch")
    ? undefined
    : Harness.runTorch("train_step.py", backend.threads, iters, Harness.torchWorkload(B, T, torchDevice))
  Harness.report({
    bench: "train-step",
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
    workload: {
      model: name,
      loadSeconds,
      batch: B,
      tokens: T,
      optimizer: "adam",
      iters,
      tensorsAfterSteps: tensorsLeft
    },
    ...Harness.environment()
  })
}

if (import.meta.main) await run()
