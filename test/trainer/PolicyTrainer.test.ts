import { assert, describe, it } from "@effect/vitest"
import * as tf from "@tensorflow/tfjs"
import { Effect, Layer } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import type { Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as PolicyModel from "../../src/trainer/PolicyModel.ts"
import * as PolicyTrainer from "../../src/trainer/PolicyTrainer.ts"
import { Trainer } from "../../src/trainer/Trainer.ts"

const tinyInit = {
  architecture: "qwen3",
  vocab_size: 16,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
  seed: 3
}

/** A one-turn trajectory: prompt [1, 2], response `response` (+ a masked observation token when `obs`). */
const trajectory = (uid: string, sample: number, response: ReadonlyArray<number>, reward: number): Trajectory => ({
  id: `${uid}/${sample}`,
  promptUid: uid,
  sample,
  promptIds: [1, 2],
  responseIds: [...response],
  lossMask: response.map(() => 1 as const),
  rolloutLogprobs: response.map(() => -Math.log(16)),
  turns: [
    {
      start: 0,
      end: response.length,
      reward,
      finishReason: "stop",
      policyVersionFirst: PolicyVersion.initial,
      policyVersionLast: PolicyVersion.initial,
      toolCalls: [],
      observationTokens: 0,
      llmMs: 0,
      envMs: 0
    }
  ],
  reward,
  stopReason: "stop",
  envMetrics: {}
})

// Each prompt: the "good" answer [5, 6, 7] earns 1, the "bad" answer [9, 9, 9] earns 0.
const groups = (n: number): Array<TrajectoryGroup> =>
  Array.from({ length: n }, (_, g) => ({
    promptUid: `p${g}`,
    cursor: g,
    dataSource: "test",
    envClass: "test",
    trajectories: [
      trajectory(`p${g}`, 0, [5, 6, 7], 1),
      trajectory(`p${g}`, 1, [9, 9, 9], 0),
      trajectory(`p${g}`, 2, [5, 6, 7], 1),
      trajectory(`p${g}`, 3, [9, 9, 9], 0)
    ]
  }))

const setup = (overrides: ReadonlyArray<string> = []) =>
  Effect.gen(function* () {
    yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
    const config = yield* RunConfigLoader.fromObject({ model: { init: tinyInit }, tokenizer: { kind: "byte" } }, [
      "trainer.train_batch_size=2",
      "trainer.policy_mini_batch_size=1",
      "trainer.micro_train_batch_size=3",
      "trainer.optimizer.lr=0.01",
      "trainer.optimizer.weight_decay=0",
      ...overrides
    ])
    const options: PolicyTrainer.Options = {
      trainer: config.trainer,
      samplesPerPrompt: 4,
      temperature: 1,
      totalSteps: 10,
      zeroRewardOnNonStop: false,
      overlongFiltering: true,
      zeroVarianceFilter: false
    }
    return PolicyTrainer.layer(options).pipe(Layer.provideMerge(PolicyModel.layer(config.model)))
  })

const sequenceLogProb = (model: PolicyModel.PolicyModel["Service"]["model"], response: ReadonlyArray<number>) =>
  LogProbs.ofIds(model, [1, 2, ...response])
    .slice(1)
    .reduce((a, b) => a + b, 0)

describe("PolicyTrainer", () => {
  it.effect("raises the log-probability of rewarded responses and lowers the others (GRPO)", () =>
    Effect.gen(function* () {
      const layer = yield* setup()
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        const { model } = yield* PolicyModel.PolicyModel
        const goodBefore = sequenceLogProb(model, [5, 6, 7])
        const badBefore = sequenceLogProb(model, [9, 9, 9])
        for (let i = 0; i < 5; i++) yield* trainer.step(groups(2))
        assert.isAbove(sequenceLogProb(model, [5, 6, 7]), goodBefore + 1)
        assert.isBelow(sequenceLogProb(model, [9, 9, 9]), badBefore - 1)
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("applies one optimizer update per mini-batch and PPO epoch, and reports SkyRL's metrics", () =>
    Effect.gen(function* () {
      const layer = yield* setup(["trainer.update_epochs_per_batch=2"])
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        const result = yield* trainer.step(groups(2))
        // 2 prompts, 1 prompt per mini-batch, 2 epochs → 4 optimizer steps
        assert.strictEqual(result.version, 4)
        assert.strictEqual(result.step, 1)
        assert.strictEqual(result.metrics["reward/avg_raw_reward"], 0.5)
        assert.strictEqual(result.metrics["reward/avg_pass_at_n"], 1)
        assert.strictEqual(result.metrics["trainer/loss_tokens"], 24)
        for (const key of [
          "loss/policy",
          "policy/clip_frac",
          "policy/approx_kl",
          "policy_entropy",
          "policy/grad_norm"
        ]) {
          assert.isTrue(Number.isFinite(result.metrics[key]), key)
        }
        // the first epoch is on-policy: ρ = 1, nothing clipped, approx KL 0 on the first mini-batch
        assert.isAtLeast(result.metrics["policy_entropy"]!, 0)
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("trains with a KL loss against a frozen reference and leaks no tensors across steps", () =>
    Effect.gen(function* () {
      const layer = yield* setup(["trainer.algorithm.use_kl_loss=true", "trainer.ref=frozen"])
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        yield* trainer.step(groups(2)) // creates the optimizer's moment slots
        const before = tf.memory().numTensors
        const result = yield* trainer.step(groups(2))
        assert.strictEqual(tf.memory().numTensors, before)
        assert.isTrue(Number.isFinite(result.metrics["loss/kl"]))
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("GAE trains a critic on the returns: its value loss falls while the policy learns", () =>
    Effect.gen(function* () {
      const layer = yield* setup(["trainer.algorithm.advantage_estimator=gae", "trainer.critic_optimizer.lr=0.01"])
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        const { model } = yield* PolicyModel.PolicyModel
        const goodBefore = sequenceLogProb(model, [5, 6, 7])
        const losses: Array<number> = []
        for (let i = 0; i < 6; i++) {
          const result = yield* trainer.step(groups(2))
          losses.push(result.metrics["critic/value_loss"]!)
          assert.isTrue(Number.isFinite(result.metrics["critic/values_mean"]))
        }
        assert.isBelow(losses[losses.length - 1]!, losses[0]! * 0.5)
        assert.isAbove(sequenceLogProb(model, [5, 6, 7]), goodBefore)
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("rejects use_kl_loss without a reference policy, naming trainer.ref", () =>
    Effect.gen(function* () {
      const layer = yield* setup(["trainer.algorithm.use_kl_loss=true"])
      const error = yield* Effect.flip(Effect.provide(Effect.asVoid(Trainer.use(() => Effect.void)), layer))
      assert.strictEqual(error._tag, "ConfigError")
      if (error._tag === "ConfigError") assert.strictEqual(error.path, "trainer.ref")
    })
  )
})
