import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect, Logger } from "effect"
import * as PolicyLoss from "../../src/algo/PolicyLoss.ts"
import * as RunConfig from "../../src/config/RunConfig.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import type { Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as PolicyModel from "../../src/trainer/PolicyModel.ts"
import * as PolicyTrainer from "../../src/trainer/PolicyTrainer.ts"
import { Trainer } from "../../src/trainer/Trainer.ts"
import * as TrainingBatch from "../../src/trainer/TrainingBatch.ts"
import * as TinyPolicy from "../fixtures/TinyPolicy.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

const tinyInit = TinyPolicy.tinyInit

/** A one-turn trajectory: prompt [1, 2], response `response`, behaviour log-prob −log 16 per token. */
const trajectory = (uid: string, sample: number, response: ReadonlyArray<number>, reward: number): Trajectory =>
  Trajectories.oneTurn({ uid, sample, prompt: [1, 2], response, reward, rolloutLogprob: -Math.log(16) })

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

/** The groups with behaviour log-probs that differ from token to token (so that TIS weights are not all equal). */
const offPolicy = (gs: Array<TrajectoryGroup>): Array<TrajectoryGroup> =>
  gs.map((g) => ({
    ...g,
    trajectories: g.trajectories.map((x, i) => ({
      ...x,
      rolloutLogprobs: x.rolloutLogprobs.map((_, j) => -2.2 - 0.3 * ((i + j) % 3))
    }))
  }))

const setup = (overrides: ReadonlyArray<string> = [], options: { readonly maxSequenceLength?: number } = {}) =>
  Effect.map(
    TinyPolicy.trainer(
      [
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=1",
        "trainer.micro_train_batch_size=3",
        "trainer.optimizer.lr=0.01",
        "trainer.optimizer.weight_decay=0",
        ...overrides
      ],
      options
    ),
    (x) => x.layer
  )

const sequenceLogProb = (model: PolicyModel.PolicyModel["Service"]["model"], response: ReadonlyArray<number>) =>
  Effect.map(
    Effect.promise(() => LogProbs.ofIds(model, [1, 2, ...response])),
    (values) => values.slice(1).reduce((a, b) => a + b, 0)
  )

describe("PolicyTrainer", () => {
  it.effect("raises the log-probability of rewarded responses and lowers the others (GRPO)", () =>
    Effect.gen(function* () {
      const layer = yield* setup()
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        const { model } = yield* PolicyModel.PolicyModel
        const goodBefore = yield* sequenceLogProb(model, [5, 6, 7])
        const badBefore = yield* sequenceLogProb(model, [9, 9, 9])
        for (let i = 0; i < 5; i++) yield* trainer.step(groups(2))
        assert.isAbove(yield* sequenceLogProb(model, [5, 6, 7]), goodBefore + 1)
        assert.isBelow(yield* sequenceLogProb(model, [9, 9, 9]), badBefore - 1)
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
        const goodBefore = yield* sequenceLogProb(model, [5, 6, 7])
        const losses: Array<number> = []
        for (let i = 0; i < 6; i++) {
          const result = yield* trainer.step(groups(2))
          losses.push(result.metrics["critic/value_loss"]!)
          assert.isTrue(Number.isFinite(result.metrics["critic/values_mean"]))
        }
        assert.isBelow(losses[losses.length - 1]!, losses[0]! * 0.5)
        assert.isAbove(yield* sequenceLogProb(model, [5, 6, 7]), goodBefore)
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("trainer.gradient_checkpointing: the same GAE steps (policy and critic) as without it", () =>
    Effect.gen(function* () {
      const run = (checkpointing: boolean) =>
        Effect.gen(function* () {
          const layer = yield* setup([
            "trainer.algorithm.advantage_estimator=gae",
            "trainer.critic_optimizer.lr=0.01",
            `trainer.gradient_checkpointing=${checkpointing}`
          ])
          return yield* Effect.gen(function* () {
            const trainer = yield* Trainer
            const { model } = yield* PolicyModel.PolicyModel
            const metrics: Array<Record<string, number>> = []
            for (let i = 0; i < 2; i++) metrics.push((yield* trainer.step(groups(2))).metrics)
            return { metrics, good: yield* sequenceLogProb(model, [5, 6, 7]) }
          }).pipe(Effect.provide(layer))
        })
      const plain = yield* run(false)
      const recomputed = yield* run(true)
      assert.approximately(recomputed.good, plain.good, 1e-5)
      plain.metrics.forEach((m, i) => {
        for (const key of ["loss/policy", "policy/grad_norm", "critic/value_loss", "critic/grad_norm"]) {
          assert.isTrue(Number.isFinite(m[key]), key)
          assert.approximately(recomputed.metrics[i]![key]!, m[key]!, 1e-5, `step ${i + 1}, ${key}`)
        }
      })
    })
  )

  for (const loss of ["sapo", "dppo"] as const) {
    it.effect(`trains with trainer.algorithm.policy_loss_type ${loss}: finite loss, moving weights`, () =>
      Effect.gen(function* () {
        const layer = yield* setup([`trainer.algorithm.policy_loss_type=${loss}`])
        yield* Effect.gen(function* () {
          const trainer = yield* Trainer
          const { model } = yield* PolicyModel.PolicyModel
          const weights = () => Transformer.trainableVariables(model).map((v) => Array.from(v.dataSync()))
          const before = weights()
          const goodBefore = yield* sequenceLogProb(model, [5, 6, 7])
          for (let i = 0; i < 3; i++) {
            const result = yield* trainer.step(groups(2))
            assert.isTrue(Number.isFinite(result.metrics["loss/policy"]), `step ${i + 1}: loss/policy`)
            assert.isTrue(Number.isFinite(result.metrics["policy/grad_norm"]), `step ${i + 1}: grad_norm`)
          }
          const moved = weights().reduce(
            (max, w, i) => w.reduce((m, x, j) => Math.max(m, Math.abs(x - before[i]![j]!)), max),
            0
          )
          assert.isAbove(moved, 1e-4)
          assert.isAbove(yield* sequenceLogProb(model, [5, 6, 7]), goodBefore) // toward the rewarded answer
        }).pipe(Effect.provide(layer))
      })
    )
  }

  it.effect(
    "records how far the engine's behaviour log-probs are from the trainer's (policy/rollout_logprob_abs_diff)",
    () =>
      Effect.gen(function* () {
        // one mini-batch, one micro-batch: the metric is the mean over all 24 response tokens
        const layer = yield* setup(["trainer.policy_mini_batch_size=2", "trainer.micro_train_batch_size=8"])
        yield* Effect.gen(function* () {
          const trainer = yield* Trainer
          const { model } = yield* PolicyModel.PolicyModel
          // the trainer's log-probs before the step (π_old) against the recorded −log 16 of every response token
          const gap = (response: ReadonlyArray<number>) =>
            Effect.map(
              Effect.promise(() => LogProbs.ofIds(model, [1, 2, ...response])),
              (values) => values.slice(1).reduce((sum, lp) => sum + Math.abs(lp + Math.log(16)), 0)
            )
          const expected = ((yield* gap([5, 6, 7])) + (yield* gap([9, 9, 9]))) / 6
          const result = yield* trainer.step(groups(2))
          const recorded = result.metrics["policy/rollout_logprob_abs_diff"]
          assert.isDefined(recorded)
          assert.approximately(recorded!, expected, 1e-4)
          assert.isAbove(expected, 0.1) // the tiny policy is far from uniform over 16: the check is not of zeros
        }).pipe(Effect.provide(layer))
      })
  )

  it.effect("policyLoss resolves each loss's parameters from trainer.algorithm, sapo.* and dppo.* included", () =>
    Effect.gen(function* () {
      const data = {
        logProbs: [[-1.2, -0.6, -2.0, -1.0]],
        oldLogProbs: [[-1.0, -1.0, -1.5, -1.1]],
        rolloutLogProbs: [[-1.1, -0.9, -1.6, -1.0]],
        advantages: [[1, -2, 0.5, -0.3]],
        lossMask: [[1, 1, 1, 0]]
      }
      const inputs = {
        logProbs: tf.tensor2d(data.logProbs),
        oldLogProbs: tf.tensor2d(data.oldLogProbs),
        rolloutLogProbs: tf.tensor2d(data.rolloutLogProbs),
        advantages: tf.tensor2d(data.advantages),
        lossMask: tf.tensor2d(data.lossMask)
      }
      // every parameter off its default, so a parameter left unread would show
      const reduce = {
        lossReduction: "seq_mean_token_sum_norm",
        maxSeqLen: 12,
        offPolicyCorrection: { tisRatioType: "sequence", sequenceTisRatioClipHigh: 3 }
      } as const
      const clip = { ...reduce, epsClipLow: 0.1, epsClipHigh: 0.3 }
      const expected: { readonly [N in PolicyLoss.Name]: PolicyLoss.Options[N] } = {
        regular: clip,
        dual_clip: { ...clip, clipRatioC: 2.5 },
        gspo: clip,
        cispo: { ...reduce, cispoEpsClipLow: 0.5, cispoEpsClipHigh: 2 },
        rollout_is: clip,
        sapo: { ...reduce, tauPos: 0.8, tauNeg: 1.3 },
        dppo: { ...reduce, dppoType: "binary_kl", deltaLow: 0.01, deltaHigh: 0.02 }
      }
      for (const name of Object.keys(expected) as Array<PolicyLoss.Name>) {
        const config = yield* RunConfigLoader.fromObject({ model: { init: tinyInit }, tokenizer: { kind: "byte" } }, [
          `trainer.algorithm.policy_loss_type=${name}`,
          "trainer.algorithm.loss_reduction=seq_mean_token_sum_norm",
          "trainer.algorithm.max_seq_len=12",
          "trainer.algorithm.off_policy_correction=sequence",
          "trainer.algorithm.tis_imp_ratio_cap=3",
          "trainer.algorithm.eps_clip_low=0.1",
          "trainer.algorithm.eps_clip_high=0.3",
          "trainer.algorithm.clip_ratio_c=2.5",
          "trainer.algorithm.cispo_eps_clip_low=0.5",
          "trainer.algorithm.cispo_eps_clip_high=2",
          "trainer.algorithm.sapo.tau_pos=0.8",
          "trainer.algorithm.sapo.tau_neg=1.3",
          "trainer.algorithm.dppo.dppo_type=binary_kl",
          "trainer.algorithm.dppo.delta_low=0.01",
          "trainer.algorithm.dppo.delta_high=0.02"
        ])
        const resolved = PolicyTrainer.policyLoss(config.trainer.algorithm, RunConfig.derive(config).lossMaxSeqLen)
        const [got, want] = [resolved(inputs), PolicyLoss.loss(name, inputs, expected[name])]
        const [a, b] = [got.loss.dataSync()[0]!, want.loss.dataSync()[0]!]
        assert.isTrue(Number.isFinite(a) && Math.abs(a - b) <= 1e-7, `${name}: ${a} vs ${b}`)
        assert.deepStrictEqual(Object.keys(got.metrics).sort(), Object.keys(want.metrics).sort(), name)
        tf.dispose([got.loss, want.loss, ...Object.values(got.metrics), ...Object.values(want.metrics)])
      }
      tf.dispose(Object.values(inputs))
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

  it.effect("π_old = sg(log π_θ) on the first mini-batch: same loss and gradients as a separate π_old pass", () =>
    Effect.gen(function* () {
      const losses = ["regular", "dual_clip", "gspo", "cispo", "rollout_is", "sapo", "dppo"] as const
      for (const loss of losses) {
        for (const tis of ["token", "sequence"] as const) {
          const layer = yield* setup([
            `trainer.algorithm.policy_loss_type=${loss}`,
            `trainer.algorithm.off_policy_correction=${tis}`,
            "trainer.algorithm.use_kl_loss=true",
            "trainer.algorithm.use_entropy_loss=true",
            "trainer.ref=frozen"
          ])
          yield* Effect.gen(function* () {
            const { model } = yield* PolicyModel.PolicyModel
            const variables = Transformer.trainableVariables(model)
            const config = yield* RunConfigLoader.fromObject(
              { model: { init: tinyInit }, tokenizer: { kind: "byte" } },
              [`trainer.algorithm.policy_loss_type=${loss}`, `trainer.algorithm.off_policy_correction=${tis}`]
            )
            const algorithm = { ...config.trainer.algorithm, use_kl_loss: true, use_entropy_loss: true }
            const options = {
              algorithm,
              policyLoss: PolicyTrainer.policyLoss(algorithm, RunConfig.derive(config).lossMaxSeqLen),
              temperature: 0.7
            }
            const batch = TrainingBatch.build(offPolicy(groups(1)), {
              estimator: "grpo",
              normByStd: true,
              gamma: 1,
              lambd: 1,
              advantageBatchNormalize: false,
              zeroRewardOnNonStop: false,
              overlongFiltering: true,
              zeroVarianceFilter: false
            })
            // π_old by a separate no-gradient pass, as before any update; π_ref: a perturbed copy
            const passed = tf.tidy(() =>
              LogProbs.ofSequences(
                model,
                { ids: batch.ids, attentionMask: batch.attentionMask },
                { temperature: 0.7 }
              ).logprobs.arraySync()
            )
            const ref = passed.map((r) => r.map((v, j) => v - 0.05 * (j % 2)))
            const input = { micro: batch, ref, share: 0.75, klShare: 0.5 }
            const withPass = yield* Effect.promise(() =>
              PolicyTrainer.microBatchGrads(model, variables, options, { ...input, old: passed })
            )
            const skipped = yield* Effect.promise(() =>
              PolicyTrainer.microBatchGrads(model, variables, options, { ...input, old: "current", readOld: true })
            )
            const what = `${loss}, ${tis} TIS`
            const a = withPass.value.dataSync()[0]!
            const b = skipped.value.dataSync()[0]!
            assert.isTrue(
              Number.isFinite(a) && Math.abs(a - b) <= 1e-6 * Math.max(1, Math.abs(a)),
              `${what}: ${a} vs ${b}`
            )
            assert.deepStrictEqual(Object.keys(skipped.metrics).sort(), Object.keys(withPass.metrics).sort())
            for (const key of Object.keys(withPass.metrics)) {
              const x = withPass.metrics[key]!.dataSync()[0]!
              const y = skipped.metrics[key]!.dataSync()[0]!
              assert.isTrue(Math.abs(x - y) <= 1e-6 * Math.max(1, Math.abs(x)), `${what}, ${key}: ${x} vs ${y}`)
            }
            let norm = 0
            for (const [name, g] of Object.entries(withPass.grads)) {
              const x = g.dataSync()
              const y = skipped.grads[name]!.dataSync()
              for (let i = 0; i < x.length; i++) {
                norm += x[i]! ** 2
                assert.isTrue(Math.abs(x[i]! - y[i]!) <= 1e-6, `${what}, ∂/∂${name}[${i}]: ${x[i]} vs ${y[i]}`)
              }
            }
            assert.isAbove(Math.sqrt(norm), 1e-3, `${what}: a gradient to compare`)
            // the detached values are π_old for the later epochs
            skipped.old!.forEach((r, i) => r.forEach((v, j) => assert.approximately(v, passed[i]![j]!, 1e-6)))
            for (const out of [withPass, skipped]) {
              out.value.dispose()
              tf.dispose(out.grads)
              tf.dispose(Object.values(out.metrics))
            }
          }).pipe(Effect.provide(layer))
        }
      }
    })
  )

  it.effect("a second PPO epoch trains against the first epoch's π_old, not against the updated policy", () =>
    Effect.gen(function* () {
      // one prompt, one mini-batch, two epochs: epoch 1 is on-policy (approx KL exactly 0), epoch 2 is not
      const layer = yield* setup([
        "trainer.train_batch_size=1",
        "trainer.policy_mini_batch_size=1",
        "trainer.update_epochs_per_batch=2"
      ])
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        const result = yield* trainer.step(groups(1))
        assert.strictEqual(result.version, 2)
        assert.isAbove(result.metrics["policy/approx_kl"]!, 1e-7) // the mean over both epochs' updates
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("cuts and masks a row longer than max_input_length with a warning, and trains on the other rows", () =>
    Effect.gen(function* () {
      const layer = yield* setup([], { maxSequenceLength: 16 })
      const logs: Array<string> = []
      // p0/0 answered 300 tokens (2 + 300 > 16) yet ended `stop`: the generator should never hand that over
      const [first, ...rest] = groups(2)
      const long = trajectory("p0", 0, new Array<number>(300).fill(5), 1)
      const batch = [{ ...first!, trajectories: [long, ...first!.trajectories.slice(1)] }, ...rest]
      yield* Effect.gen(function* () {
        const result = yield* (yield* Trainer).step(batch)
        assert.strictEqual(result.metrics["trainer/loss_tokens"], 7 * 3) // the other 7 rows' 3 tokens each
        assert.isTrue(Number.isFinite(result.metrics["loss/policy"]))
      }).pipe(
        Effect.provide(layer),
        Effect.provide(Logger.layer([Logger.make((o) => void logs.push(String(o.message)))]))
      )
      assert.isTrue(
        logs.some((l) => l.includes("1 training row(s) longer than 16 tokens were cut to it and masked (p0/0)")),
        logs.join("\n")
      )
    })
  )

  it.effect("lets the event loop run during a step (between forward passes and before the update)", () =>
    Effect.gen(function* () {
      const layer = yield* setup()
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        let ticks = 0
        let running = true
        const tick = (): void => {
          ticks++
          if (running) setImmediate(tick)
        }
        setImmediate(tick)
        yield* Effect.yieldNow // the first tick runs here, before the step
        const before = ticks
        // 8 rows, mini-batches of 4, micro-batches of 3: π_old pass over the second mini-batch (2 micro-batches),
        // 2 updates of 2 micro-batches each, each followed by the optimizer update
        yield* trainer.step(groups(2))
        running = false
        assert.isAtLeast(ticks - before, 2 + 2 * (2 + 1))
      }).pipe(Effect.provide(layer))
    })
  )
})
