/**
 * Picks the quickstart policy size: for a few ByteTokenizer qwen3 sizes, times (a) an SFT/RL train step on
 * 8 sequences of 480 tokens (a whole toolbox demo with `tool_prompt: none` is ≈ 480 bytes) and (b) KV-cache
 * sampling of 32 rows (8 prompts × 4 samples), prompt 48, 64 new tokens (one assistant turn is ≈ 60–90 bytes).
 * Reports wall and CPU seconds (CPU time is robust to other processes on the cores) and the load average; writes
 * bench/out/quickstart-sizes-<kernels>.json (`--out FILE`: bench/results/FILE).
 *
 * Run: npx node bench/quickstart-sizes.ts [--kernels native|stock] [--iters N] [--out FILE]
 */
import * as os from "node:os"
import * as tf from "../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import * as LogProbs from "../src/model/LogProbs.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Prng from "../src/model/Prng.ts"
import * as Sampling from "../src/model/Sampling.ts"
import * as Transformer from "../src/model/Transformer.ts"
import { arg, writeResult } from "./args.ts"
import * as Harness from "./harness.ts"

const kernels = arg("kernels", "native") as "native" | "stock"
const iters = Number(arg("iters", "2"))
await Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels }))

const sizes = [
  { hidden: 64, layers: 2, heads: 4, kv: 2, headDim: 16, mlp: 192 },
  { hidden: 96, layers: 3, heads: 4, kv: 2, headDim: 24, mlp: 288 },
  { hidden: 128, layers: 4, heads: 4, kv: 2, headDim: 32, mlp: 384 }
]

/** Median wall and CPU seconds per call over `iters` runs after one warm-up. */
const time = async (run: () => void | Promise<void>) => {
  const ms = await Harness.medianMs(run, iters)
  return { wall: ms.wall / 1000, cpu: ms.cpu / 1000 }
}

const rows: Array<unknown> = []
for (const s of sizes) {
  const config = ModelConfig.fromInit({
    architecture: "qwen3",
    vocab_size: 320,
    hidden_size: s.hidden,
    intermediate_size: s.mlp,
    num_hidden_layers: s.layers,
    num_attention_heads: s.heads,
    num_key_value_heads: s.kv,
    head_dim: s.headDim,
    max_position_embeddings: 1024,
    tie_word_embeddings: true,
    rope_theta: 10000,
    rms_norm_eps: 1e-6
  })
  const model = Transformer.init(config, 0)
  const prng = Prng.make(1)
  const B = 8
  const T = 480
  const ids = Array.from({ length: B }, () => Array.from({ length: T }, () => Math.floor(prng.next() * 256)))
  const optimizer = tf.train.adam(1e-4)
  const vars = Transformer.trainableVariables(model)
  const train = await time(() => {
    const loss = optimizer.minimize(
      () => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar,
      true,
      vars
    )
    loss!.dataSync()
    loss!.dispose()
  })
  const prompts = Array.from({ length: 32 }, (_, i) => ids[i % B]!.slice(0, 48))
  let generated = 0
  const sample = await time(async () => {
    const out = await Sampling.generate(
      model,
      prompts.map((promptIds, i) => ({
        promptIds,
        sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: 64, seed: i }
      }))
    )
    generated = out.reduce((n, c) => n + c.tokens.length, 0)
  })
  const row = {
    ...s,
    parameters: ModelConfig.parameterCount(config),
    train: { batch: B, tokens: T, ...train, tokens_per_s: (B * T) / train.wall, tokens_per_cpu_s: (B * T) / train.cpu },
    sample: {
      rows: 32,
      prompt: 48,
      generated,
      ...sample,
      tokens_per_s: generated / sample.wall,
      tokens_per_cpu_s: generated / sample.cpu
    },
    loadavg_1m: os.loadavg()[0]
  }
  console.log(JSON.stringify(row))
  rows.push(row)
  optimizer.dispose()
  Transformer.dispose(model)
}
const result = {
  bench: "quickstart-sizes",
  backend: tf.getBackend(),
  kernels,
  sizes: rows,
  cpu: os.cpus()[0]?.model ?? "unknown",
  cores: os.cpus().length,
  node: process.version,
  date: new Date().toISOString()
}
writeResult(`quickstart-sizes-${kernels}.json`, result)
