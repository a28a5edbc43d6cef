/**
 * The webgpu backend against the cpu backend on the same model and inputs: logits of a padded batch, KV-cache decode
 * logits, log-probs and entropy through the plain and the fused (chunked) LM head, every parameter's gradient, one
 * AdamW step (trainer/Optimizer.ts, clipping on) — and a leak check: tensors and GPU buffers after `--steps` training
 * steps. The cpu backend runs first (webgpu tensors cannot be read synchronously, so nothing moves across); the same
 * seed gives the same weights on both (our own PRNG).
 *
 * Run: npm run bench -- webgpu-parity [--steps 100] [--layers 2] [--hidden 64] [--vocab 320]
 * Last stdout line: {"bench":"webgpu-parity","adapter",…,"maxAbsDiff":{logits,decode,logprobs,…},"leak":{…}}.
 * test/e2e/WebGpu.test.ts runs `compare` on lavapipe; on a GPU machine the same program runs on the GPU.
 */
import * as tf from "../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import * as WebGpu from "../src/backend/WebGpu.ts"
import type { OptimizerConfig } from "../src/config/TrainerConfig.ts"
import * as Decoder from "../src/model/Decoder.ts"
import * as KvCache from "../src/model/KvCache.ts"
import * as LogProbs from "../src/model/LogProbs.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as WeightView from "../src/model/WeightView.ts"
import * as Optimizer from "../src/trainer/Optimizer.ts"

export interface Shape {
  readonly layers: number
  readonly hidden: number
  readonly vocab: number
}

export const defaultShape: Shape = { layers: 2, hidden: 64, vocab: 320 }

const configOf = (s: Shape) =>
  ModelConfig.fromInit({
    architecture: "qwen3",
    vocab_size: s.vocab,
    hidden_size: s.hidden,
    intermediate_size: s.hidden * 3,
    num_hidden_layers: s.layers,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: s.hidden / 4,
    rope_theta: 10000,
    rms_norm_eps: 1e-6,
    max_position_embeddings: 256,
    tie_word_embeddings: true
  })

// a ragged batch: row 1 is left-padded
const ids = [
  [5, 17, 42, 7, 99, 3, 250, 11, 64, 8],
  [0, 0, 0, 12, 13, 14, 15, 16, 17, 18]
]
const attentionMask = [
  [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
  [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
]
const lossMask = [
  [0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
  [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
]

const optimizerConfig: OptimizerConfig = {
  lr: 1e-3,
  weight_decay: 0.01,
  beta1: 0.9,
  beta2: 0.999,
  eps: 1e-8,
  max_grad_norm: 0.5, // clipping on: the grads of this loss are larger
  warmup_steps: 0,
  scheduler: "constant",
  min_lr_ratio: 0.1
}

/** Everything compared, as plain arrays (read asynchronously: the only way on webgpu). */
export interface Values {
  readonly logits: Float32Array
  readonly decode: Float32Array
  readonly logprobs: Float32Array
  readonly entropy: Float32Array
  readonly fusedLogprobs: Float32Array
  readonly fusedEntropy: Float32Array
  readonly loss: number
  readonly grads: Float32Array // every parameter's gradient, concatenated in parameter order
  readonly gradNorm: number
  readonly updated: Float32Array // every parameter after one AdamW step
}

const concatenated = async (tensors: ReadonlyArray<tf.Tensor>): Promise<Float32Array> => {
  const parts = await Promise.all(tensors.map((t) => t.data() as Promise<Float32Array>))
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const p of parts) {
    out.set(p, at)
    at += p.length
  }
  return out
}

const read = async (t: tf.Tensor): Promise<Float32Array> => {
  try {
    return (await t.data()) as Float32Array
  } finally {
    t.dispose()
  }
}

/** The loss both heads are checked through: −mean masked log-prob − 0.01 · mean masked entropy. */
const lossOf = (model: Transformer.Transformer, fusedAbove?: number) => () =>
  tf.tidy(() => {
    const out = LogProbs.ofSequences(
      model,
      { ids, attentionMask },
      {
        entropy: true,
        ...(fusedAbove !== undefined ? { fusedAbove, chunkRows: 4 } : {})
      }
    )
    const mask = tf.tensor2d(lossMask)
    const n = tf.sum(mask)
    const logp = tf.div(tf.sum(tf.mul(out.logprobs, mask)), n)
    const entropy = tf.div(tf.sum(tf.mul(out.entropy!, mask)), n)
    return tf.sub(tf.neg(logp), tf.mul(0.01, entropy)) as tf.Scalar
  })

/** Run every check on the active backend. */
export const valuesOn = async (shape: Shape = defaultShape): Promise<Values> => {
  const model = Transformer.init(configOf(shape), 7, 0.2)
  try {
    const logits = await read(tf.tidy(() => Decoder.forward(model, { ids, attentionMask })))
    const view = WeightView.inference(model)
    let stepped = await KvCache.prefill(model, view, [ids[0]!.slice(0, 6), ids[1]!.slice(3, 6)])
    const decodeParts = [stepped.logits]
    for (const next of [
      [4, 9],
      [31, 2]
    ]) {
      stepped = await KvCache.extend(model, view, stepped.cache, next)
      decodeParts.push(stepped.logits)
    }
    KvCache.dispose(stepped.cache)
    WeightView.dispose(view)
    const decode = new Float32Array(decodeParts.flatMap((p) => Array.from(p)))

    const plain = LogProbs.ofSequences(model, { ids, attentionMask }, { entropy: true }) // tidied inside
    const fused = LogProbs.ofSequences(model, { ids, attentionMask }, { entropy: true, fusedAbove: 0, chunkRows: 4 })
    const variables = Transformer.trainableVariables(model)
    const { value, grads } = tf.variableGrads(lossOf(model, 0), variables)
    const gradList = variables.map((v) => grads[v.name]!)
    const optimizer = Optimizer.make(variables, optimizerConfig)
    const gradNorm = await optimizer.apply(grads, optimizerConfig.lr)
    const values: Values = {
      logits,
      decode,
      logprobs: await read(plain.logprobs),
      entropy: await read(plain.entropy!),
      fusedLogprobs: await read(fused.logprobs),
      fusedEntropy: await read(fused.entropy!),
      loss: (await read(value))[0]!,
      grads: await concatenated(gradList),
      gradNorm,
      updated: await concatenated(variables)
    }
    tf.dispose(gradList)
    optimizer.dispose()
    return values
  } finally {
    Transformer.dispose(model)
  }
}

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  if (a.length !== b.length) return Number.POSITIVE_INFINITY
  let d = 0
  for (let i = 0; i < a.length; i++) {
    const x = Math.abs(a[i]! - b[i]!)
    if (!(x <= d)) d = Number.isNaN(x) ? Number.POSITIVE_INFINITY : x
  }
  return d
}

/** Max |webgpu − cpu| per quantity. */
export const diff = (gpu: Values, cpu: Values): Record<keyof Values, number> => ({
  logits: maxAbsDiff(gpu.logits, cpu.logits),
  decode: maxAbsDiff(gpu.decode, cpu.decode),
  logprobs: maxAbsDiff(gpu.logprobs, cpu.logprobs),
  entropy: maxAbsDiff(gpu.entropy, cpu.entropy),
  fusedLogprobs: maxAbsDiff(gpu.fusedLogprobs, cpu.fusedLogprobs),
  fusedEntropy: maxAbsDiff(gpu.fusedEntropy, cpu.fusedEntropy),
  loss: Math.abs(gpu.loss - cpu.loss),
  grads: maxAbsDiff(gpu.grads, cpu.grads),
  gradNorm: Math.abs(gpu.gradNorm - cpu.gradNorm),
  updated: maxAbsDiff(gpu.updated, cpu.updated)
})

interface BufferCounts {
  readonly numUsedBuffers: number
  readonly numFreeBuffers: number
  readonly numBytesUsed: number
}

const buffers = (): BufferCounts | null => {
  const manager = (tf.backend() as unknown as { bufferManager?: BufferCounts }).bufferManager
  return manager === undefined
    ? null
    : {
        numUsedBuffers: manager.numUsedBuffers,
        numFreeBuffers: manager.numFreeBuffers,
        numBytesUsed: manager.numBytesUsed
      }
}

/**
 * `steps` AdamW training steps on the active backend; tensors and GPU buffers in use after the first step and after
 * the last (equal when nothing leaks).
 */
export const leakCheck = async (steps: number, shape: Shape = defaultShape) => {
  const model = Transformer.init(configOf(shape), 7, 0.2)
  const variables = Transformer.trainableVariables(model)
  const optimizer = Optimizer.make(variables, optimizerConfig)
  const step = async () => {
    const { value, grads } = tf.variableGrads(lossOf(model, 0), variables)
    await optimizer.apply(grads, optimizerConfig.lr)
    tf.dispose(Object.values(grads))
    return (await read(value))[0]!
  }
  const firstLoss = await step()
  const after1 = { tensors: tf.memory().numTensors, buffers: buffers() }
  const start = performance.now()
  let lastLoss = firstLoss
  for (let i = 1; i < steps; i++) lastLoss = await step()
  const msPerStep = (performance.now() - start) / Math.max(1, steps - 1)
  const afterN = { tensors: tf.memory().numTensors, buffers: buffers() }
  optimizer.dispose()
  Transformer.dispose(model)
  return { steps, firstLoss, lastLoss, msPerStep, after1, afterN }
}

/** The cpu backend's values, then the webgpu backend's (switching the process's backend), and their differences. */
export const compare = async (shape: Shape = defaultShape) => {
  await Effect.runPromise(TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" }))
  const cpu = await valuesOn(shape)
  const info = await Effect.runPromise(TensorBackend.initialise({ name: "webgpu", threads: 0, kernels: "stock" }))
  const gpu = await valuesOn(shape)
  return { adapter: info.adapter ?? null, diff: diff(gpu, cpu), cpu, gpu }
}

const arg = (name: string, fallback: number): number => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 && process.argv[i + 1] !== undefined ? Number(process.argv[i + 1]) : fallback
}

export const run = async (): Promise<void> => {
  const shape: Shape = {
    layers: arg("layers", defaultShape.layers),
    hidden: arg("hidden", defaultShape.hidden),
    vocab: arg("vocab", defaultShape.vocab)
  }
  const { adapter, diff: maxAbs } = await compare(shape)
  const leak = await leakCheck(arg("steps", 100), shape)
  const worst = Math.max(...Object.values(maxAbs))
  console.log(
    JSON.stringify({
      bench: "webgpu-parity",
      adapter: adapter === null ? null : WebGpu.describe(adapter),
      shape,
      maxAbsDiff: maxAbs,
      worst,
      within1e4: worst <= 1e-4,
      leak,
      leakFree: leak.after1.tensors === leak.afterN.tensors,
      date: new Date().toISOString()
    })
  )
}

if (import.meta.main) await run()
