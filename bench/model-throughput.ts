/**
 * Throughput of the tfjs transformer on the perf model (vocab 512, d_model 256, 4 layers, 4 heads, SwiGLU 4×,
 * RMSNorm, tied embeddings, fp32) on the wasm backend:
 * - forward: logits for a batch of 8 × 128 tokens;
 * - train step: forward + backward + Adam on −mean token log-prob, 8 × 128 tokens;
 * - sampling: KV-cache generation, batch 8, prompt 32, 96 new tokens, temperature 1;
 * - engine: the same 8 requests as 4 concurrent LocalEngine.generate calls of 2 (continuous batching).
 * Prints one JSON line and writes bench/out/model-throughput.json (`--out FILE`: bench/results/FILE).
 *
 * Run: npx node bench/model-throughput.ts [--backend wasm|cpu] [--iters N] [--out FILE]
 */
import * as os from "node:os"
import * as tf from "../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import { InferenceEngine } from "../src/inference/InferenceEngine.ts"
import * as LocalEngine from "../src/inference/LocalEngine.ts"
import * as Decoder from "../src/model/Decoder.ts"
import * as LogProbs from "../src/model/LogProbs.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Prng from "../src/model/Prng.ts"
import * as Sampling from "../src/model/Sampling.ts"
import * as Transformer from "../src/model/Transformer.ts"
import { arg, writeResult } from "./args.ts"
import * as Harness from "./harness.ts"

const backend = arg("backend", "wasm") as "wasm" | "cpu"
const iters = Number(arg("iters", "5"))

await Effect.runPromise(TensorBackend.initialise({ name: backend, threads: 0, kernels: "stock" }))

const config = Harness.perfConfig // the perf model every bench shares
const model = Transformer.init(config, 0)
const B = 8
const T = 128
const prng = Prng.make(1)
const ids = Array.from({ length: B }, () => Array.from({ length: T }, () => Math.floor(prng.next() * 512)))

/** CPU seconds (user + system) of each timed section, keyed by section: robust to other processes sharing the cores. */
const cpuSeconds: Record<string, number> = {}

/** Median wall seconds per call over `iters` runs after one warm-up; records the median CPU seconds under `name`. */
const time = async (name: string, run: () => void | Promise<void>): Promise<number> => {
  const ms = await Harness.medianMs(run, iters)
  cpuSeconds[name] = ms.cpu / 1000
  return ms.wall / 1000
}

const forwardS = await time("forward", () => {
  tf.tidy(() => {
    Decoder.forward(model, { ids }).dataSync()
  })
})

const optimizer = tf.train.adam(1e-4)
const vars = Transformer.trainableVariables(model)
const trainS = await time("train_step", () => {
  const loss = optimizer.minimize(
    () => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar,
    true,
    vars
  )
  loss!.dataSync()
  loss!.dispose()
})

const prompts = ids.map((row) => row.slice(0, 32))
let generated = 0
const sampleS = await time("sampling", async () => {
  const out = await Sampling.generate(
    model,
    prompts.map((promptIds, i) => ({
      promptIds,
      sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: 96, seed: i }
    }))
  )
  generated = out.reduce((n, c) => n + c.tokens.length, 0)
})

const requests = prompts.map((promptIds, i) => ({
  promptIds,
  sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: 96, seed: i }
}))
const engineS = await Effect.runPromise(
  Effect.gen(function* () {
    const engine = yield* InferenceEngine
    const calls = [0, 2, 4, 6].map((i) => engine.generate(requests.slice(i, i + 2)))
    return yield* Effect.promise(() =>
      time("engine_concurrent", () => Effect.runPromise(Effect.asVoid(Effect.all(calls, { concurrency: "unbounded" }))))
    )
  }).pipe(Effect.provide(LocalEngine.layer({ model })))
)

const result = {
  bench: "model-throughput",
  backend: tf.getBackend(),
  model: {
    vocab: 512,
    d_model: 256,
    layers: 4,
    heads: 4,
    mlp: 1024,
    tied: true,
    parameters: ModelConfig.parameterCount(config)
  },
  forward: { batch: B, tokens: T, seconds: forwardS, tokens_per_s: (B * T) / forwardS },
  train_step: { batch: B, tokens: T, seconds: trainS, tokens_per_s: (B * T) / trainS, optimizer: "adam" },
  sampling: { batch: B, prompt: 32, new_tokens: 96, generated, seconds: sampleS, tokens_per_s: generated / sampleS },
  engine_concurrent: { calls: 4, rows_per_call: 2, seconds: engineS, tokens_per_s: (8 * 96) / engineS },
  cpu_seconds: cpuSeconds, // the same sections in CPU time (wasm is single-threaded: ≈ wall time on an idle core)
  iters,
  cpu: os.cpus()[0]?.model ?? "unknown",
  cores: os.cpus().length,
  loadavg_1m: os.loadavg()[0], // other processes competing for the cores make these numbers pessimistic
  node: process.version,
  date: new Date().toISOString()
}
console.log(JSON.stringify(result))
writeResult("model-throughput.json", result)
optimizer.dispose()
Transformer.dispose(model)
