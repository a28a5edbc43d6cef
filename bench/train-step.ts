/**
 * Train step: forward + backward + Adam on −mean token log-prob, effect-rl against PyTorch in the same run. The perf
 * model (bench/harness.ts) trains 8 sequences × 128 tokens, as the committed results did; a HF checkpoint
 * (`--model DIR`, loaded by both sides from the same safetensors, BF16 on disk → float32) trains 2 × 512.
 *
 * `--lora-rank R`: LoRA adapters of rank R (α = 2R, no dropout) on q,k,v,o,gate,up,down of every layer, the base
 * frozen, Adam over the adapters alone (src/model/Lora.ts; the peer adds the same A/B matrices by hand).
 * `--base-dtype bf16|f32` (LoRA on the native backend; default bf16): the frozen base stored as bfloat16
 * (Transformer.storeFrozen + NativeBackend.storeBf16; exact for a BF16 checkpoint), as the peer's float32 base is not.
 * `--gradient-checkpointing`: the peer wraps each decoder layer in torch.utils.checkpoint; effect-rl's forward input
 * gets `checkpoint: true` (Decoder.ForwardInput: each decoder layer recomputed in the backward pass).
 *
 * Last stdout line: {"bench":"train-step","threads",…,"effectRl":{msPerStep,tokensPerSec,cpuMsPerStep,peakRssMb},
 * "torch":{…, peakRssMb} or {"error"},"ratio",…} (ratio = effect-rl throughput / torch throughput; peakRssMb: each
 * process's own peak resident memory, loading included); also written to bench/out/train-step.json (`--out FILE`:
 * bench/results/FILE), with the command line, date and machine load.
 *
 * Run: npm run bench -- train-step [--model DIR] [--seqs N] [--tokens T] [--lora-rank R] [--base-dtype bf16|f32]
 *        [--gradient-checkpointing]
 *        [--backend wasm|native|cpu|webgpu|tensorflow|tensorflow-gpu] [--kernels native|stock] [--threads N]
 *        [--iters N] [--min-iters N] [--warmup N] [--torch-device cpu|cuda] [--no-torch] [--out FILE]
 * (`--batch B` is `--seqs`; defaults: --iters 5, --warmup 2; on the perf model at least --min-iters 5 timed steps.)
 */
import * as tf from "../src/tensor/Tf.ts"
import * as NativeBackend from "../src/backend/NativeBackend.ts"
import type * as Decoder from "../src/model/Decoder.ts"
import * as LogProbs from "../src/model/LogProbs.ts"
import * as Lora from "../src/model/Lora.ts"
import * as Prng from "../src/model/Prng.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as NativeKernels from "../src/native/NativeKernels.ts"
import * as Harness from "./harness.ts"

const loraTargets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

export const run = async (): Promise<void> => {
  const real = Harness.hasModel()
  // at least 5 timed steps on the perf model, as its committed results had; a checkpoint's steps are long enough
  const iters = Math.max(Number(Harness.arg("min-iters", real ? "1" : "5")), Number(Harness.arg("iters", "5")))
  const backend = await Harness.setUpBackend()
  const B = Number(Harness.arg("seqs", Harness.arg("batch", real ? "2" : "8")))
  const T = Number(Harness.arg("tokens", real ? "512" : "128"))
  const loraRank = Number(Harness.arg("lora-rank", "0"))
  const checkpointing = Harness.has("gradient-checkpointing")
  const torchDevice = Harness.arg("torch-device", "cpu")
  // the peer runs first, so that the two processes never hold their memory at once
  const torch = Harness.has("no-torch")
    ? undefined
    : await Harness.runTorch(
        "train_step.py",
        backend.threads,
        iters,
        Harness.torchWorkload(B, T, torchDevice, [
          ...(loraRank > 0 ? ["--lora-rank", String(loraRank)] : []),
          ...(checkpointing ? ["--gradient-checkpointing"] : [])
        ])
      )
  // the frozen base as bfloat16 (native backend; exact for a BF16 checkpoint): `--base-dtype f32` keeps float32.
  // Stored as each weight loads, so the whole base never exists in float32.
  const baseDtype = loraRank > 0 && backend.backend === "native" ? Harness.arg("base-dtype", "bf16") : "f32"
  const frozen = (name: string) => loraTargets.some((m) => name.endsWith(`.${m}.weight`))
  const { model, name, loadSeconds } = await Harness.benchModel(
    loraRank > 0 ? "lora-training" : "training",
    baseDtype === "bf16" ? (weight, v) => frozen(weight) && NativeBackend.storeBf16(v) : undefined
  )
  if (loraRank > 0) Lora.attach(model, { rank: loraRank, alpha: 2 * loraRank, dropout: 0, targetModules: loraTargets })
  if (baseDtype === "bf16") Transformer.storeFrozen(model, NativeBackend.storeBf16)
  const V = model.config.vocabSize
  const prng = Prng.make(1)
  const ids = Array.from({ length: B }, () => Array.from({ length: T }, () => Math.floor(prng.next() * V)))
  const optimizer = backend.kernels === "native" ? NativeKernels.adam(1e-4) : tf.train.adam(1e-4)
  const variables = Transformer.trainableVariables(model)
  const trainable = variables.reduce((n, v) => n + v.size, 0)
  const input: Decoder.ForwardInput = { ids, checkpoint: checkpointing }
  const step = async () => {
    const loss = optimizer.minimize(
      () => tf.neg(tf.mean(LogProbs.ofSequences(model, input).logprobs)) as tf.Scalar,
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
  const effectRl = {
    msPerStep: ms.wall,
    tokensPerSec: (B * T * 1000) / ms.wall,
    cpuMsPerStep: ms.cpu,
    peakRssMb: Math.round(Harness.peakRssMb())
  }
  console.error(`effect-rl: ${JSON.stringify(effectRl)}`)
  const compared = Harness.comparison(effectRl, torch)
  Harness.report({
    bench: "train-step",
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
    workload: {
      model: name,
      loadSeconds,
      batch: B,
      tokens: T,
      optimizer: "adam",
      loraRank: loraRank > 0 ? loraRank : null,
      baseDtype: loraRank > 0 ? baseDtype : null,
      gradientCheckpointing: checkpointing,
      trainableParameters: trainable,
      torchTrainableParameters: torch !== undefined && !Harness.failed(torch) ? (torch.trainable ?? null) : null,
      iters,
      tensorsAfterSteps: tensorsLeft
    },
    ...Harness.environment()
  })
}

if (import.meta.main) await run()
