import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as EffectRl from "../../src/index.ts"

describe("effect-rl library API", () => {
  it("exposes SkyRL-shaped maths on plain arrays, returning numbers synchronously", () => {
    // one group of two: rewards [1, 0] on the last token → Â = ±1/√2 (SkyRL's unbiased std)
    const { advantages } = EffectRl.Advantages.compute("grpo", {
      tokenLevelRewards: [
        [0, 1],
        [0, 0]
      ],
      responseMask: [
        [1, 1],
        [1, 1]
      ],
      index: ["a", "a"]
    })
    assert.closeTo(advantages[0]![0]!, Math.SQRT1_2, 1e-5)
    assert.closeTo(advantages[1]![1]!, -Math.SQRT1_2, 1e-5)
    const kl = EffectRl.Kl.estimate("k1", [[-1]], [[-1.5]])
    assert.closeTo(kl[0]![0]!, 0.5, 1e-6)
    const loss = EffectRl.PolicyLoss.compute(
      "regular",
      { logProbs: [[-1]], oldLogProbs: [[-1]], advantages: [[2]], lossMask: [[1]] },
      { epsClipLow: 0.2, epsClipHigh: 0.2, lossReduction: "token_mean" }
    )
    assert.closeTo(loss.loss, -2, 1e-6) // ρ = 1: L = −Â
  })

  it.effect("loads a run config from an object with overrides", () =>
    Effect.gen(function* () {
      const config = yield* EffectRl.RunConfigLoader.fromObject({ model: { init: {} }, tokenizer: { kind: "byte" } }, [
        "generator.n_samples_per_prompt=8"
      ])
      assert.strictEqual(config.generator.n_samples_per_prompt, 8)
      assert.strictEqual(EffectRl.RunConfig.derive(config).sequencesPerStep, 8 * config.trainer.train_batch_size)
    })
  )

  it("builds a tiny model and scores token ids with it", async () => {
    const config = EffectRl.ModelConfig.fromInit({
      architecture: "qwen3",
      vocab_size: 32,
      hidden_size: 16,
      intermediate_size: 32,
      num_hidden_layers: 1,
      num_attention_heads: 2,
      num_key_value_heads: 1,
      rope_theta: 10000,
      rms_norm_eps: 1e-6,
      max_position_embeddings: 64,
      tie_word_embeddings: true
    })
    const model = EffectRl.Transformer.init(config, 1)
    const logprobs = await EffectRl.LogProbs.ofIds(model, [1, 5, 9])
    EffectRl.Transformer.dispose(model)
    assert.strictEqual(logprobs.length, 2)
    for (const lp of logprobs) assert.isBelow(lp, 0)
  })
})
