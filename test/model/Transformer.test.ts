import * as tf from "@tensorflow/tfjs"
import { Effect } from "effect"
import { assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Transformer from "../../src/model/Transformer.ts"

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
      const reference = tf.tidy(() => Transformer.forward(model, { ids, attentionMask }).dataSync())
      const view = Transformer.inferenceView(model)
      const fused = tf.tidy(() => Transformer.forward(model, { ids, attentionMask }, view).dataSync())
      Transformer.disposeView(view)
      const leanView = Transformer.inferenceView(model, { lean: true })
      assert.strictEqual(leanView.owned.length, 0, "a lean view copies no weights")
      const lean = tf.tidy(() => Transformer.forward(model, { ids, attentionMask }, leanView).dataSync())
      Transformer.disposeView(leanView)
      Transformer.setAttentionMatmul("split")
      const split = tf.tidy(() =>
        Transformer.forward(model, {
          ids: [...ids, ...ids],
          attentionMask: [...attentionMask, ...attentionMask]
        }).dataSync()
      )
      Transformer.setAttentionMatmul("batched")
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
