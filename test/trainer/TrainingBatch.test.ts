import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import type { StopReason, Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as TrainingBatch from "../../src/trainer/TrainingBatch.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

const turn = Trajectories.turn

// prompt [1, 2]; response: 2 sampled, 1 tool-output, 1 sampled → mask [1, 1, 0, 1]
const trajectory = (uid: string, sample: number, reward: number, stopReason: StopReason = "stop"): Trajectory => ({
  id: `${uid}/${sample}`,
  promptUid: uid,
  sample,
  promptIds: [1, 2],
  responseIds: [3, 4, 5, 6],
  lossMask: [1, 1, 0, 1],
  rolloutLogprobs: [-0.5, -0.25, 0, -0.125],
  turns: [turn(0, 2, 0), turn(3, 4, reward)],
  reward,
  stopReason,
  envMetrics: {}
})

const group = (uid: string, trajectories: Array<Trajectory>): TrajectoryGroup => ({
  promptUid: uid,
  cursor: 0,
  dataSource: "t",
  envClass: "t",
  trajectories
})

const options: TrainingBatch.Options = {
  estimator: "grpo",
  normByStd: true,
  gamma: 1,
  lambd: 1,
  advantageBatchNormalize: false,
  zeroRewardOnNonStop: false,
  overlongFiltering: true,
  zeroVarianceFilter: false
}

describe("TrainingBatch.build", () => {
  it("lays rows out as prompt ++ response with the loss mask, advantages and log-probs on response tokens only", () => {
    // group rewards [1, 0] → mean 0.5, SkyRL's unbiased std 1/√2 → Â = ±0.7071 (up to ε)
    const batch = TrainingBatch.build([group("a", [trajectory("a", 0, 1), trajectory("a", 1, 0)])], options)
    assert.deepStrictEqual(batch.ids[0], [1, 2, 3, 4, 5, 6])
    assert.deepStrictEqual(batch.lossMask[0], [0, 0, 1, 1, 0, 1])
    assert.deepStrictEqual(batch.rolloutLogProbs[0], [0, 0, -0.5, -0.25, 0, -0.125])
    const adv = batch.advantages.map((r) => r.map((x) => Math.round(x * 1e4) / 1e4))
    assert.deepStrictEqual(adv, [
      [0, 0, 0.7071, 0.7071, 0, 0.7071],
      [0, 0, -0.7071, -0.7071, 0, -0.7071]
    ])
  })

  it("zeroes the loss mask of overlong, length and error trajectories but keeps their reward in the group", () => {
    const batch = TrainingBatch.build(
      [group("a", [trajectory("a", 0, 1), trajectory("a", 1, 1, "overlong"), trajectory("a", 2, 0, "error")])],
      options
    )
    assert.deepStrictEqual(batch.lossMask[1], [0, 0, 0, 0, 0, 0])
    assert.deepStrictEqual(batch.lossMask[2], [0, 0, 0, 0, 0, 0])
    assert.deepStrictEqual(batch.rewards, [1, 1, 0])
    assert.isAbove(batch.advantages[0]![2]!, 0)
  })

  it("cuts a row over maxSequenceLength to it, masks it and names its trajectory (the last-line guard)", () => {
    // a/1 ended `stop` with 10 response tokens: 2 + 10 = 12 > 8 → cut to [1, 2, 3, 4, 5, 6, 7, 8], no loss tokens;
    // a/2's prompt alone is 10 tokens → cut to its first 8, nothing of its response left
    const long: Trajectory = {
      ...trajectory("a", 1, 0),
      responseIds: [3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
      lossMask: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
      rolloutLogprobs: new Array<number>(10).fill(-0.5),
      turns: [turn(0, 10, 0)]
    }
    const prompt = { ...trajectory("a", 2, 0), promptIds: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] }
    const batch = TrainingBatch.build([group("a", [trajectory("a", 0, 1), long, prompt])], {
      ...options,
      maxSequenceLength: 8
    })
    assert.strictEqual(batch.length, 8)
    assert.deepStrictEqual(batch.ids[0], [1, 2, 3, 4, 5, 6, 0, 0]) // within the limit: unchanged
    assert.deepStrictEqual(batch.lossMask[0], [0, 0, 1, 1, 0, 1, 0, 0])
    assert.deepStrictEqual(batch.ids[1], [1, 2, 3, 4, 5, 6, 7, 8])
    assert.deepStrictEqual(batch.ids[2], [1, 2, 3, 4, 5, 6, 7, 8])
    for (const row of [1, 2]) {
      assert.deepStrictEqual(batch.lossMask[row], [0, 0, 0, 0, 0, 0, 0, 0])
      assert.deepStrictEqual(batch.advantages[row], [0, 0, 0, 0, 0, 0, 0, 0])
      assert.deepStrictEqual(batch.rolloutLogProbs[row], [0, 0, 0, 0, 0, 0, 0, 0])
    }
    assert.deepStrictEqual(batch.truncated, ["a/1", "a/2"])
    assert.deepStrictEqual(batch.rewards, [1, 0, 0]) // the cut rows keep their reward in the group
  })

  it("zero_reward_on_non_stop zeroes the reward of trajectories that did not end `stop`", () => {
    const batch = TrainingBatch.build([group("a", [trajectory("a", 0, 1), trajectory("a", 1, 1, "max_turns")])], {
      ...options,
      zeroRewardOnNonStop: true
    })
    assert.deepStrictEqual(batch.rewards, [1, 0])
  })

  it("the zero-variance filter drops groups whose rewards are all equal", () => {
    const flat = group("flat", [trajectory("flat", 0, 1), trajectory("flat", 1, 1)])
    const mixed = group("mixed", [trajectory("mixed", 0, 1), trajectory("mixed", 1, 0)])
    const batch = TrainingBatch.build([flat, mixed], { ...options, zeroVarianceFilter: true })
    assert.strictEqual(batch.droppedGroups, 1)
    assert.deepStrictEqual(batch.promptUids, ["mixed", "mixed"])
  })

  it.effect(
    "advantage_estimator: maxrl (read from the config) scales by the group mean: a rare success weighs n − 1",
    () =>
      Effect.gen(function* () {
        const config = yield* RunConfigLoader.fromObject({ model: { path: "unused" } }, [
          "trainer.algorithm.advantage_estimator=maxrl"
        ])
        const rare = group(
          "rare",
          [1, 0, 0, 0].map((r, i) => trajectory("rare", i, r))
        )
        const easy = group(
          "easy",
          [1, 1, 1, 0].map((r, i) => trajectory("easy", i, r))
        )
        const batch = TrainingBatch.build([rare, easy], {
          ...options,
          estimator: config.trainer.algorithm.advantage_estimator
        })
        // rare: mean 1/4 → (1 − 1/4)/(1/4) = 3, (0 − 1/4)/(1/4) = −1; easy: mean 3/4 → 1/3 and −1 (GRPO: ±0.75 / 0.25)
        const last = batch.advantages.map((row) => Math.round(row[5]! * 1e4) / 1e4)
        assert.deepStrictEqual(last, [3, -1, -1, -1, 0.3333, 0.3333, 0.3333, -1])
      })
  )

  it("KL in the reward subtracts coef · kl on loss tokens before the advantages", () => {
    // one sample per group with rloo would be 0; use reinforce++-free check: grpo with Dr.GRPO (no std) and 2 samples
    const g = group("a", [trajectory("a", 0, 1), trajectory("a", 1, 1)])
    const kl = [
      [9, 9, 1, 1, 9, 1],
      [9, 9, 0, 0, 9, 0]
    ]
    const batch = TrainingBatch.build([g], { ...options, normByStd: false, klPenalty: { kl, coef: 0.5 } })
    // scores: s0 = 1 − 0.5·3 = −0.5, s1 = 1 → mean 0.25 → Â = [−0.75, +0.75]
    assert.closeTo(batch.advantages[0]![2]!, -0.75, 1e-9)
    assert.closeTo(batch.advantages[1]![2]!, 0.75, 1e-9)
  })

  it("expands a step-wise trajectory into one row per turn carrying the trajectory's advantage", () => {
    const stepWise = (uid: string, sample: number, reward: number): Trajectory => ({
      ...trajectory(uid, sample, reward),
      responseIds: [3, 4, 6],
      lossMask: [1, 1, 1],
      rolloutLogprobs: [-0.5, -0.25, -0.125],
      turns: [turn(0, 2, 0), turn(2, 3, reward)],
      steps: [
        { promptIds: [1, 2], responseIds: [3, 4], rolloutLogprobs: [-0.5, -0.25] },
        { promptIds: [1, 2, 3, 4, 9, 9], responseIds: [6], rolloutLogprobs: [-0.125] }
      ]
    })
    const batch = TrainingBatch.build([group("a", [stepWise("a", 0, 1), stepWise("a", 1, 0)])], options)
    assert.strictEqual(batch.ids.length, 4) // 2 trajectories × 2 turns
    assert.deepStrictEqual(batch.ids[1], [1, 2, 3, 4, 9, 9, 6])
    assert.deepStrictEqual(batch.lossMask[1], [0, 0, 0, 0, 0, 0, 1])
    assert.deepStrictEqual(batch.rolloutLogProbs[1], [0, 0, 0, 0, 0, 0, -0.125])
    // GRPO over the two trajectories: Â = ±1/√2, the same on every turn's tokens
    assert.closeTo(batch.advantages[0]![2]!, Math.SQRT1_2, 1e-4)
    assert.closeTo(batch.advantages[1]![6]!, Math.SQRT1_2, 1e-4)
    assert.closeTo(batch.advantages[3]![6]!, -Math.SQRT1_2, 1e-4)
    assert.deepStrictEqual(batch.promptUids, ["a", "a", "a", "a"])
  })
})

describe("TrainingBatch.build with distillation", () => {
  // rollout log-probs [-0.5, -0.25, 0, -0.125]; the teacher's on the loss tokens [-0.25, -1, ·, -0.125]
  // → log π_rollout − log π_teacher = [-0.25, 0.75, ·, 0]: the teacher likes token 3 more, token 4 less
  const taught = (uid: string, sample: number, reward: number): Trajectory => ({
    ...trajectory(uid, sample, reward),
    teacherLogprobs: [-0.25, -1, 0, -0.125]
  })

  it("makes each loss token's advantage −coef · (log π_rollout − log π_teacher), with no reward used", () => {
    const batch = TrainingBatch.build([group("a", [taught("a", 0, 1), taught("a", 1, 0)])], {
      ...options,
      distillation: { coef: 2, rewards: false }
    })
    // −2 · [-0.25, 0.75, ·, 0] = [0.5, -1.5, 0, 0] on both rows: the rewards (1 and 0) play no part
    assert.deepStrictEqual(batch.advantages, [
      [0, 0, 0.5, -1.5, 0, 0],
      [0, 0, 0.5, -1.5, 0, 0]
    ])
  })

  it("adds the KL term to the RL advantage when mixed", () => {
    const batch = TrainingBatch.build([group("a", [taught("a", 0, 1), taught("a", 1, 0)])], {
      ...options,
      distillation: { coef: 1, rewards: true }
    })
    // GRPO's ±1/√2 (up to ε) plus −1 · [-0.25, 0.75, ·, 0] = [0.25, -0.75, 0, 0]
    const expected = [1, -1].map((sign) => [
      0,
      0,
      sign * Math.SQRT1_2 + 0.25,
      sign * Math.SQRT1_2 - 0.75,
      0,
      sign * Math.SQRT1_2
    ])
    for (const [b, row] of expected.entries()) {
      for (const [t, v] of row.entries()) assert.closeTo(batch.advantages[b]![t]!, v, 1e-4)
    }
  })

  it("keeps a group whose rewards are all equal (the zero-variance filter does not apply), and trains no error row", () => {
    const failed: Trajectory = { ...taught("a", 1, 0), stopReason: "error", error: "teacher x: down" }
    const batch = TrainingBatch.build([group("a", [taught("a", 0, 0), failed])], {
      ...options,
      zeroVarianceFilter: true,
      distillation: { coef: 1, rewards: false }
    })
    assert.strictEqual(batch.droppedGroups, 0)
    assert.deepStrictEqual(batch.lossMask, [
      [0, 0, 1, 1, 0, 1],
      [0, 0, 0, 0, 0, 0]
    ])
    assert.deepStrictEqual(batch.advantages[1], [0, 0, 0, 0, 0, 0])
  })
})
