import * as tf from "../../src/tensor/Tf.ts"
import { Effect, Schema } from "effect"
import { assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import { SftConfig } from "../../src/config/SftConfig.ts"
import { TrainerConfig } from "../../src/config/TrainerConfig.ts"
import * as Decoder from "../../src/model/Decoder.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as Recompute from "../../src/model/Recompute.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as WeightView from "../../src/model/WeightView.ts"

const configOf = (architecture: "qwen3" | "qwen2" | "llama", tie: boolean) =>
  ModelConfig.fromInit({
    architecture,
    vocab_size: 40,
    hidden_size: 32,
    intermediate_size: 48,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    rope_theta: 10000,
    rms_norm_eps: 1e-6,
    max_position_embeddings: 64,
    tie_word_embeddings: tie
  })

// two rows, the first left-padded
const T = 16
const ids = [
  Array.from({ length: T }, (_, t) => (t < 3 ? 0 : (t * 7) % 40)),
  Array.from({ length: T }, (_, t) => (t * 11 + 5) % 40)
]
const attentionMask = [Array.from({ length: T }, (_, t) => (t < 3 ? 0 : 1)), new Array<number>(T).fill(1)]

interface Run {
  readonly loss: number
  readonly grads: ReadonlyArray<Float32Array> // in trainableVariables order
  readonly peakBytes: number
}

/** ∇ −mean(log p) w.r.t. every trainable variable, with or without activation recompute; and the peak memory. */
const gradients = async (model: Transformer.Transformer, checkpoint: boolean, dropoutSeed = "seed"): Promise<Run> => {
  const variables = Transformer.trainableVariables(model)
  const before = tf.memory().numTensors
  let out: { value: tf.Scalar; grads: tf.NamedTensorMap } | undefined
  const profile = await tf.profile(() => {
    out = tf.variableGrads(() => {
      const { logprobs } = LogProbs.ofSequences(model, { ids, attentionMask, training: true, checkpoint, dropoutSeed })
      return tf.neg(tf.mean(logprobs)) as tf.Scalar
    }, variables)
  })
  const { value, grads } = out!
  const run: Run = {
    loss: value.dataSync()[0]!,
    grads: variables.map((v) => grads[v.name]!.dataSync() as Float32Array),
    peakBytes: profile.peakBytes
  }
  tf.dispose([value, grads])
  assert.strictEqual(tf.memory().numTensors, before, "tensors left behind")
  return run
}

const maxAbsDiff = (a: ReadonlyArray<Float32Array>, b: ReadonlyArray<Float32Array>): number => {
  let max = 0
  a.forEach((x, i) => x.forEach((v, j) => (max = Math.max(max, Math.abs(v - b[i]![j]!)))))
  return max
}

const maxAbs = (x: Float32Array): number => x.reduce((m, v) => Math.max(m, Math.abs(v)), 0)

/** LoRA's B starts at 0 (so A's gradient is 0): give every B random values, so both get a gradient. */
const randomiseB = (model: Transformer.Transformer, seed: number): void => {
  const prng = Prng.make(seed)
  for (const adapter of model.adapters.values()) {
    const values = Float32Array.from({ length: adapter.b.size }, () => prng.normal() * 0.3)
    tf.tidy(() => adapter.b.assign(tf.tensor(values, adapter.b.shape)))
  }
}

const allModules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

beforeAll(() => Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })))

describe("Recompute.checkpointed", () => {
  it("gives gradients to its inputs only: a variable read inside but not passed in silently gets none", () => {
    const w = tf.variable(tf.tensor2d([1, 2, 3, 4], [2, 2]))
    const u = tf.variable(tf.tensor2d([0.5, -1, 2, 1], [2, 2]))
    const x = tf.tensor2d([[1, 1]])
    const before = tf.memory().numTensors
    const gradsOf = (passW: boolean) =>
      tf.variableGrads(() => {
        const y = Recompute.checkpointed(
          ([xIn, uIn, wIn], [c]) => tf.mul(tf.matMul(tf.matMul(xIn!, wIn ?? w), uIn!), c!),
          passW ? [x, u, w] : [x, u],
          [tf.scalar(2)] // freed by the forward's tidy: read back from what was saved
        )
        return tf.sum(y) as tf.Scalar
      }, [w, u])
    const passed = gradsOf(true)
    assert.deepStrictEqual(passed.grads[w.name]!.arraySync(), [
      [-1, 6],
      [-1, 6]
    ]) // 2 · xᵀ (1 uᵀ)
    assert.deepStrictEqual(passed.grads[u.name]!.arraySync(), [
      [8, 8],
      [12, 12]
    ]) // 2 · (x w)ᵀ 1
    const closedOver = gradsOf(false)
    assert.isUndefined(closedOver.grads[w.name])
    tf.dispose([passed.value, passed.grads, closedOver.value, closedOver.grads])
    assert.strictEqual(tf.memory().numTensors, before)
    tf.dispose([w, u, x])
  })
})

describe("gradient checkpointing (activation recompute per decoder layer)", () => {
  for (const [architecture, tie] of [
    ["qwen3", true],
    ["qwen2", false],
    ["llama", true]
  ] as const) {
    it(`full fine-tune, ${architecture}: the same loss and gradients, a lower peak of memory`, async () => {
      const model = Transformer.init(configOf(architecture, tie), 3, 0.3)
      const plain = await gradients(model, false)
      const recomputed = await gradients(model, true)
      const diff = maxAbsDiff(plain.grads, recomputed.grads)
      console.log(
        `[${architecture} full, ${Transformer.trainableVariables(model).length} variables] max |Δgrad| = ${diff}, ` +
          `peak ${plain.peakBytes} → ${recomputed.peakBytes} bytes`
      )
      assert.approximately(recomputed.loss, plain.loss, 1e-6)
      assert.isBelow(diff, 1e-5)
      plain.grads.forEach((g, i) => assert.isAbove(maxAbs(g), 1e-6, `variable ${i} has no gradient`))
      // the plain tape holds 4 layers' activations; the recompute holds their inputs and one layer's at a time
      assert.isBelow(recomputed.peakBytes, 0.8 * plain.peakBytes)
      Transformer.dispose(model)
    })
  }

  it("LoRA on every linear module (MLP included), dropout 0: the adapters' gradients match", async () => {
    const model = Transformer.init(configOf("qwen3", true), 4, 0.3)
    Lora.attach(model, { rank: 4, alpha: 8, dropout: 0, targetModules: allModules }, 4)
    randomiseB(model, 4)
    assert.strictEqual(Transformer.trainableVariables(model).length, 4 * 7 * 2)
    const plain = await gradients(model, false)
    const recomputed = await gradients(model, true)
    const diff = maxAbsDiff(plain.grads, recomputed.grads)
    console.log(`[qwen3 LoRA] max |Δgrad| = ${diff}, peak ${plain.peakBytes} → ${recomputed.peakBytes} bytes`)
    assert.approximately(recomputed.loss, plain.loss, 1e-6)
    assert.isBelow(diff, 1e-5)
    plain.grads.forEach((g, i) => assert.isAbove(maxAbs(g), 1e-6, `adapter variable ${i} has no gradient`))
    Transformer.dispose(model)
  })

  it("LoRA with dropout: the recompute replays the forward's masks (same seed, same gradients)", async () => {
    const model = Transformer.init(configOf("qwen3", true), 5, 0.3)
    Lora.attach(model, { rank: 4, alpha: 8, dropout: 0.3, targetModules: allModules }, 5)
    randomiseB(model, 5)
    const plain = await gradients(model, false, "s1")
    const recomputed = await gradients(model, true, "s1")
    const other = await gradients(model, true, "s2")
    const diff = maxAbsDiff(plain.grads, recomputed.grads)
    console.log(`[qwen3 LoRA dropout 0.3] max |Δgrad| = ${diff}`)
    assert.approximately(recomputed.loss, plain.loss, 1e-6)
    assert.isBelow(diff, 1e-5)
    assert.isAbove(maxAbsDiff(plain.grads, other.grads), 1e-4) // the dropout is real: another seed, other masks
    Transformer.dispose(model)
  })

  it("changes nothing without a gradient (the π_old pass) and refuses a cached forward", () => {
    const model = Transformer.init(configOf("qwen3", true), 6, 0.3)
    const plain = tf.tidy(() => LogProbs.ofSequences(model, { ids, attentionMask }).logprobs.dataSync())
    const recomputed = tf.tidy(() =>
      LogProbs.ofSequences(model, { ids, attentionMask, checkpoint: true }).logprobs.dataSync()
    )
    recomputed.forEach((v, i) => assert.approximately(v, plain[i]!, 1e-6))
    assert.throws(
      () =>
        tf.tidy(() => {
          const input = Decoder.prepare({ ids: ids.map((r) => r.slice(0, 1)) }) // one new token after 4 cached
          const cached = () => tf.zeros([2, 4, 2, 8]) as tf.Tensor4D // [B, P, Hkv, hd]
          const past = Array.from({ length: 4 }, () => ({ keys: cached(), values: cached() }))
          const keyMask = new Float32Array(2 * 5).fill(1)
          Decoder.step(model, WeightView.training(model), { ...input, keyMask, past, checkpoint: true })
        }),
      /no past/
    )
    Transformer.dispose(model)
  })
})

describe("trainer.gradient_checkpointing", () => {
  it("defaults to false and parses as SkyRL's key (and sft.gradient_checkpointing)", async () => {
    assert.isFalse(Schema.decodeUnknownSync(TrainerConfig)({}).gradient_checkpointing)
    assert.isFalse(Schema.decodeUnknownSync(SftConfig)({}).gradient_checkpointing)
    const base = { model: { init: { hidden_size: 32 } }, tokenizer: { kind: "byte" } }
    const config = await Effect.runPromise(
      RunConfigLoader.fromObject(base, ["trainer.gradient_checkpointing=true", "sft.gradient_checkpointing=true"])
    )
    assert.isTrue(config.trainer.gradient_checkpointing)
    assert.isTrue(config.sft.gradient_checkpointing)
  })
})
