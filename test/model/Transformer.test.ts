import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import { assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as Decoder from "../../src/model/Decoder.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as WeightView from "../../src/model/WeightView.ts"

beforeAll(() => Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })))

const init = {
  architecture: "qwen3" as const,
  vocab_size: 50,
  hidden_size: 32,
  intermediate_size: 40,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: true
}

// meta-llama/Llama-3.2-1B's config.json, as published
const llama32Scaling = {
  factor: 32.0,
  high_freq_factor: 4.0,
  low_freq_factor: 1.0,
  original_max_position_embeddings: 8192,
  rope_type: "llama3"
}
const llama32 = {
  architectures: ["LlamaForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 128000,
  eos_token_id: 128001,
  head_dim: 64,
  hidden_act: "silu",
  hidden_size: 2048,
  initializer_range: 0.02,
  intermediate_size: 8192,
  max_position_embeddings: 131072,
  mlp_bias: false,
  model_type: "llama",
  num_attention_heads: 32,
  num_hidden_layers: 16,
  num_key_value_heads: 8,
  pretraining_tp: 1,
  rms_norm_eps: 1e-5,
  rope_scaling: llama32Scaling,
  rope_theta: 500000.0,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.45.0.dev0",
  use_cache: true,
  vocab_size: 128256
}
const llama3Scaling = {
  type: "llama3",
  factor: 32,
  lowFreqFactor: 1,
  highFreqFactor: 4,
  originalMaxPositionEmbeddings: 8192
} as const

describe("ModelConfig.fromHf", () => {
  it("reads Qwen3 config.json keys, rope_parameters.rope_theta, and derives head_dim when absent", () => {
    const c = ModelConfig.fromHf({
      model_type: "qwen3",
      vocab_size: 151936,
      hidden_size: 1024,
      intermediate_size: 3072,
      num_hidden_layers: 28,
      num_attention_heads: 16,
      num_key_value_heads: 8,
      head_dim: 128,
      rope_parameters: { rope_type: "default", rope_theta: 1000000 },
      rms_norm_eps: 1e-6,
      tie_word_embeddings: true,
      eos_token_id: 151645
    })
    assert.deepStrictEqual(
      [c.headDim, c.ropeTheta, c.qkNorm, c.attentionBias, c.eosTokenId],
      [128, 1000000, true, false, 151645]
    )
    // Qwen3-0.6B: 596,049,920 parameters (tied) — the published count
    assert.strictEqual(ModelConfig.parameterCount(c), 596049920)
    const llama = ModelConfig.fromHf({
      ...ModelConfig.toHf(ModelConfig.fromInit({ ...init, architecture: "llama" })),
      head_dim: undefined
    })
    assert.strictEqual(llama.headDim, 8)
    assert.throws(() => ModelConfig.fromHf({ model_type: "gpt2" }), /unsupported model_type/)
    assert.throws(() => ModelConfig.fromInit({ ...init, num_key_value_heads: 3 }), /multiple of num_key_value_heads/)
  })

  it("reads Llama-3.2-1B's config.json (llama3 RoPE scaling) and writes it back", () => {
    const c = ModelConfig.fromHf(llama32)
    assert.deepStrictEqual(c, {
      architecture: "llama",
      vocabSize: 128256,
      hiddenSize: 2048,
      intermediateSize: 8192,
      numLayers: 16,
      numHeads: 32,
      numKvHeads: 8,
      headDim: 64,
      ropeTheta: 500000,
      ropeScaling: llama3Scaling,
      rmsNormEps: 1e-5,
      maxPositionEmbeddings: 131072,
      tieWordEmbeddings: true,
      attentionBias: false,
      qkNorm: false,
      bosTokenId: 128000,
      eosTokenId: 128001
    })
    // Llama-3.2-1B: 1,235,814,400 parameters (tied), the published count
    assert.strictEqual(ModelConfig.parameterCount(c), 1235814400)
    const hf = ModelConfig.toHf(c, "bfloat16")
    assert.deepStrictEqual(hf["rope_scaling"], llama32Scaling)
    assert.deepStrictEqual(ModelConfig.fromHf(hf), c)
    // newer transformers write `rope_parameters` (θ inside) instead of rope_theta + rope_scaling
    const { rope_scaling: _, rope_theta: __, ...rest } = llama32
    const v5 = ModelConfig.fromHf({ ...rest, rope_parameters: { ...llama32Scaling, rope_theta: 500000 } })
    assert.deepStrictEqual(v5, c)
    // default RoPE writes null, and null reads as default
    const plain = ModelConfig.fromHf({ ...llama32, rope_scaling: null })
    assert.strictEqual(plain.ropeScaling, undefined)
    assert.strictEqual(ModelConfig.toHf(plain)["rope_scaling"], null)
    assert.strictEqual(
      ModelConfig.fromHf({ ...llama32, rope_scaling: { rope_type: "default" } }).ropeScaling,
      undefined
    )
  })

  it("rejects other RoPE scaling types naming them, and llama3 scaling without its parameters", () => {
    for (const type of ["linear", "dynamic", "yarn", "longrope"]) {
      const rx = new RegExp(`rope scaling "${type}" is not supported`)
      assert.throws(() => ModelConfig.fromHf({ ...llama32, rope_scaling: { rope_type: type, factor: 4 } }), rx)
      assert.throws(() => ModelConfig.fromHf({ ...llama32, rope_scaling: { type, factor: 4 } }), rx) // legacy key
      assert.throws(
        () => ModelConfig.fromHf({ ...llama32, rope_scaling: null, rope_parameters: { rope_type: type, factor: 4 } }),
        rx
      )
    }
    const { low_freq_factor: _, ...missing } = llama32Scaling
    assert.throws(() => ModelConfig.fromHf({ ...llama32, rope_scaling: missing }), /needs a number "low_freq_factor"/)
    assert.throws(
      () => ModelConfig.fromHf({ ...llama32, rope_scaling: { ...llama32Scaling, high_freq_factor: 1 } }),
      /high_freq_factor \(1\) must exceed low_freq_factor \(1\)/
    )
  })
})

describe("Decoder.ropeInvFreq", () => {
  it("llama3 scaling keeps Llama-3.2-1B's 15 high frequencies, divides the 14 low ones by 32, interpolates 3", () => {
    const plain = Decoder.ropeInvFreq(64, 500000)
    const scaled = Decoder.ropeInvFreq(64, 500000, llama3Scaling)
    // bands by wavelength 2π/f against 8192/4 = 2048 and 8192/1 = 8192
    const wavelen = (i: number) => (2 * Math.PI) / plain[i]!
    const kept = [...plain.keys()].filter((i) => wavelen(i) < 2048)
    const slowed = [...plain.keys()].filter((i) => wavelen(i) > 8192)
    const between = [...plain.keys()].filter((i) => wavelen(i) >= 2048 && wavelen(i) <= 8192)
    assert.deepStrictEqual([kept.length, between.length, slowed.length], [15, 3, 14])
    for (const i of kept) assert.strictEqual(scaled[i], plain[i])
    for (const i of slowed) assert.strictEqual(scaled[i], Math.fround(plain[i]! / 32))
    for (const i of between) {
      // s = (8192/λ − 1)/3 ∈ [0, 1]: f·((1 − s)/32 + s)
      const s = (8192 / wavelen(i) - 1) / 3
      assert.approximately(scaled[i]! / plain[i]!, (1 - s) / 32 + s, 1e-6)
      assert.isTrue(scaled[i]! < plain[i]! && scaled[i]! > plain[i]! / 32)
    }
    // the tables the forward uses follow: position 1's angle is the frequency itself
    const { sin } = Decoder.ropeTables([1], 64, 500000, llama3Scaling)
    assert.approximately(sin[31]!, Math.sin(scaled[31]!), 1e-7)
    assert.notStrictEqual(sin[31], Decoder.ropeTables([1], 64, 500000).sin[31])
  })
})

describe("Transformer", () => {
  for (const architecture of ["qwen3", "qwen2", "llama"] as const) {
    it(`${architecture}: the fused inference view (norms and 1/√hd folded), the lean one and the split attention path compute the training view's logits`, () => {
      const model = Transformer.init(ModelConfig.fromInit({ ...init, architecture }), 3, 0.3)
      // non-trivial norm weights and biases, so folding them is tested
      for (const [name, v] of model.params) {
        if (name.endsWith("norm.weight") || name.endsWith(".bias"))
          tf.tidy(() =>
            v.assign(tf.add(tf.randomUniform(v.shape, 0.5, 1.5, "float32", 1), name.endsWith(".bias") ? -1 : 0))
          )
      }
      const ids = [
        [0, 0, 4, 5, 6, 7, 8, 9],
        [1, 2, 3, 4, 5, 6, 7, 8]
      ]
      const attentionMask = [
        [0, 0, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1]
      ]
      const reference = tf.tidy(() => Decoder.forward(model, { ids, attentionMask }).dataSync())
      const view = WeightView.inference(model)
      const fused = tf.tidy(() => Decoder.forward(model, { ids, attentionMask }, view).dataSync())
      WeightView.dispose(view)
      const leanView = WeightView.inference(model, { lean: true })
      assert.strictEqual(leanView.owned.length, 0, "a lean view copies no weights")
      const lean = tf.tidy(() => Decoder.forward(model, { ids, attentionMask }, leanView).dataSync())
      WeightView.dispose(leanView)
      Decoder.setAttentionMatmul("split")
      const split = tf.tidy(() =>
        Decoder.forward(model, {
          ids: [...ids, ...ids],
          attentionMask: [...attentionMask, ...attentionMask]
        }).dataSync()
      )
      Decoder.setAttentionMatmul("batched")
      reference.forEach((v, i) => {
        assert.approximately(fused[i]!, v, 1e-5)
        assert.approximately(lean[i]!, v, 1e-5)
        assert.approximately(split[i]!, v, 1e-5)
      })
      Transformer.dispose(model)
      assert.strictEqual(tf.memory().numTensors, 0)
    })
  }

  it("init is deterministic in the seed", async () => {
    const config = ModelConfig.fromInit(init)
    const [a, b, c] = [Transformer.init(config, 1), Transformer.init(config, 1), Transformer.init(config, 2)]
    assert.deepStrictEqual(await Transformer.toHfArrays(a), await Transformer.toHfArrays(b))
    assert.notDeepEqual((await Transformer.toHfArrays(a))[0]!.data, (await Transformer.toHfArrays(c))[0]!.data)
    ;[a, b, c].forEach(Transformer.dispose)
  })
})
