import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Checkpointer from "../../src/store/Checkpointer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as ExperienceReplay from "../../src/trainer/ExperienceReplay.ts"
import * as PolicyModel from "../../src/trainer/PolicyModel.ts"
import { Trainer } from "../../src/trainer/Trainer.ts"
import * as TinyPolicy from "../fixtures/TinyPolicy.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

/** A one-turn trajectory of prompt `prompt`; its behaviour log-probs are far from any policy's (a replay must not be
 * weighed by them). */
const trajectory = (
  uid: string,
  sample: number,
  prompt: ReadonlyArray<number>,
  response: ReadonlyArray<number>,
  reward: number
): Trajectory => Trajectories.oneTurn({ uid, sample, prompt, response, reward, rolloutLogprob: -9 })

const good = [5, 6, 7]
const bad = [9, 9, 9]
/** A group of prompt `prompt` (uid `uid`) whose samples earn `rewards` (1: the good answer, else the bad one). */
const group = (uid: string, prompt: ReadonlyArray<number>, rewards: ReadonlyArray<number>): TrajectoryGroup => ({
  promptUid: uid,
  cursor: 0,
  dataSource: "test",
  envClass: "test",
  trajectories: rewards.map((r, i) => trajectory(uid, i, prompt, r === 1 ? good : bad, r))
})

const config: ExperienceReplay.Config = { successThreshold: 1, maxPrompts: 2 }

describe("ExperienceReplay.apply", () => {
  it("keeps a partly solved prompt's last success and adds it to a later all-failed group of the same prompt", () => {
    const buffer: ExperienceReplay.Buffer = new Map()
    const first = ExperienceReplay.apply(buffer, [group("a1", [1, 2], [0, 1, 0.2, 1])], config)
    assert.strictEqual(first.injected, 0)
    assert.strictEqual(first.groups[0]!.trajectories.length, 4)
    assert.strictEqual(buffer.size, 1)
    // the same prompt under another uid (the toolbox's record tasks repeat so), every sample failing
    const second = ExperienceReplay.apply(buffer, [group("a2", [1, 2], [0, 0.2, 0, 0])], config)
    assert.strictEqual(second.injected, 1)
    const g = second.groups[0]!
    assert.strictEqual(g.trajectories.length, 5)
    const replayed = g.trajectories[4]!
    assert.deepStrictEqual(
      { id: replayed.id, promptUid: replayed.promptUid, sample: replayed.sample, replay: replayed.replay },
      { id: "a1/3@replay", promptUid: "a2", sample: 4, replay: true }
    )
    assert.deepStrictEqual(replayed.responseIds, good)
    assert.strictEqual(replayed.reward, 1)
    // the kept success stays for the next all-failed visit
    assert.strictEqual(buffer.size, 1)
  })

  it("adds nothing to a group with a success, or to another prompt's group, and never within the same step", () => {
    const buffer: ExperienceReplay.Buffer = new Map()
    // one step: a partly solved group and an all-failed one of the same prompt; the kept success is for later steps
    const same = ExperienceReplay.apply(buffer, [group("a1", [1, 2], [1, 0]), group("a2", [1, 2], [0, 0])], config)
    assert.strictEqual(same.injected, 0)
    assert.strictEqual(buffer.size, 1)
    const later = ExperienceReplay.apply(buffer, [group("a3", [1, 2], [1, 0]), group("b1", [3, 4], [0, 0])], config)
    assert.strictEqual(later.injected, 0)
    assert.deepStrictEqual(
      later.groups.map((g) => g.trajectories.length),
      [2, 2]
    )
  })

  it("drops a prompt once every sample succeeds, and evicts the oldest entry past maxPrompts", () => {
    const buffer: ExperienceReplay.Buffer = new Map()
    ExperienceReplay.apply(buffer, [group("a1", [1], [1, 0]), group("b1", [2], [1, 0])], config)
    assert.deepStrictEqual([...buffer.keys()], ["1", "2"])
    ExperienceReplay.apply(buffer, [group("a2", [1], [1, 1])], config)
    assert.deepStrictEqual([...buffer.keys()], ["2"])
    ExperienceReplay.apply(buffer, [group("c1", [3], [0, 1]), group("d1", [4], [1, 0])], config)
    assert.deepStrictEqual([...buffer.keys()], ["3", "4"]) // "2" was the oldest
    // refreshing an entry makes it the newest
    ExperienceReplay.apply(buffer, [group("c2", [3], [1, 0]), group("e1", [5], [1, 0])], config)
    assert.deepStrictEqual([...buffer.keys()], ["3", "5"])
    assert.strictEqual(buffer.get("3")!.promptUid, "c2")
  })

  it("round-trips its entries as plain data", () => {
    const buffer: ExperienceReplay.Buffer = new Map()
    ExperienceReplay.apply(buffer, [group("a1", [1, 2], [1, 0]), group("b1", [3], [0, 1])], config)
    const copy = ExperienceReplay.fromEntries(JSON.parse(JSON.stringify(ExperienceReplay.entries(buffer))))
    assert.deepStrictEqual([...copy], [...buffer])
  })
})

const setup = (replay: boolean) =>
  TinyPolicy.trainer([
    "trainer.train_batch_size=1",
    "trainer.policy_mini_batch_size=1",
    "trainer.micro_train_batch_size=8",
    "trainer.optimizer.lr=0.01",
    "trainer.optimizer.weight_decay=0",
    "trainer.algorithm.advantage_estimator=maxrl",
    "trainer.algorithm.off_policy_correction=token",
    `trainer.experience_replay.enabled=${replay}`,
    "trainer.algorithm.zero_variance_filter=true"
  ])

const goodLogProb = (model: PolicyModel.PolicyModel["Service"]["model"]) =>
  Effect.map(
    Effect.promise(() => LogProbs.ofIds(model, [1, 2, ...good])),
    (values) => values.slice(1).reduce((a, b) => a + b, 0)
  )

describe("PolicyTrainer with experience_replay", () => {
  it.effect("trains all-failed groups against a kept success, which off-replay drops as zero-variance", () =>
    Effect.gen(function* () {
      const run = (replay: boolean) =>
        Effect.gen(function* () {
          const { layer } = yield* setup(replay)
          return yield* Effect.gen(function* () {
            const trainer = yield* Trainer
            const { model } = yield* PolicyModel.PolicyModel
            const first = yield* trainer.step([group("a1", [1, 2], [1, 0, 0, 0])])
            const before = yield* goodLogProb(model)
            const later: Array<Record<string, number>> = []
            for (let i = 0; i < 4; i++) {
              later.push((yield* trainer.step([group(`a${i + 2}`, [1, 2], [0, 0, 0, 0])])).metrics)
            }
            return {
              first: first.metrics,
              later,
              gain: (yield* goodLogProb(model)) - before,
              state: yield* trainer.state
            }
          }).pipe(Effect.provide(layer))
        })
      const on = yield* run(true)
      const off = yield* run(false)
      assert.strictEqual(on.first["replay/injected_groups"], 0)
      assert.strictEqual(on.first["replay/buffer_prompts"], 1)
      for (const m of on.later) {
        assert.strictEqual(m["replay/injected_groups"], 1)
        assert.strictEqual(m["trainer/rows"], 5) // the 4 samples and the replayed success
        assert.strictEqual(m["trainer/dropped_groups"], 0)
        assert.strictEqual(m["reward/avg_raw_reward"], 0) // the sampled group's, without the replay
      }
      for (const m of off.later) {
        assert.strictEqual(m["trainer/rows"], 0)
        assert.strictEqual(m["trainer/dropped_groups"], 1)
        assert.isUndefined(m["replay/injected_groups"])
      }
      assert.isAbove(on.gain, 1, "the replayed success is learned again")
      assert.strictEqual(off.gain, 0, "nothing trained")
      assert.strictEqual(on.state.replay?.length, 1)
      assert.isUndefined(off.state.replay)
    })
  )

  it.effect("a replayed success is weighed as if sampled now: its old sampler's log-probs do not enter the loss", () =>
    Effect.gen(function* () {
      const losses = (rollout: number) =>
        Effect.gen(function* () {
          const { layer } = yield* setup(true)
          return yield* Effect.gen(function* () {
            const trainer = yield* Trainer
            const kept = group("a1", [1, 2], [1, 0, 0, 0])
            yield* trainer.step([kept])
            // the same success kept with other behaviour log-probs: the next (replayed) step must not change
            const state = yield* trainer.state
            const entries = state.replay!.map((e) => ({
              ...e,
              trajectory: { ...e.trajectory, rolloutLogprobs: e.trajectory.rolloutLogprobs.map(() => rollout) }
            }))
            yield* trainer.restore({ ...state, replay: entries })
            return (yield* trainer.step([group("a2", [1, 2], [0, 0, 0, 0])])).metrics["loss/policy"]!
          }).pipe(Effect.provide(layer))
        })
      const a = yield* losses(-9)
      const b = yield* losses(-0.01)
      assert.isTrue(Number.isFinite(a) && a !== 0)
      assert.approximately(a, b, 1e-7)
    })
  )

  it.effect("the kept successes survive a checkpoint: saved in trainer_state.json, restored into a new trainer", () =>
    Effect.gen(function* () {
      const dir = yield* Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "replay-ckpt-")))
      const { layer } = yield* setup(true)
      const saved = yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        const { model } = yield* PolicyModel.PolicyModel
        yield* trainer.step([group("a1", [1, 2], [1, 0, 0, 0])])
        yield* trainer.step([group("b1", [3, 4], [0, 1, 1, 0])])
        const checkpointer = Checkpointer.make({ runDir: dir, keepN: 1, tokenizer: ByteTokenizer.make() })
        const out = yield* checkpointer.save(2, model, yield* trainer.state, {})
        return { dir: out.dir, state: yield* trainer.state }
      }).pipe(Effect.provide(layer))
      const checkpointer = Checkpointer.make({ runDir: dir, keepN: 1, tokenizer: ByteTokenizer.make() })
      const restored = yield* checkpointer.read(saved.dir)
      assert.deepStrictEqual(restored.trainer.replay, saved.state.replay)
      assert.strictEqual(restored.trainer.replay?.length, 2)
      const fresh = yield* setup(true)
      const injected = yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        // a new model's parameters have other tensor names than the saved optimizer's: keep this trainer's own
        yield* trainer.restore({ ...(yield* trainer.state), replay: restored.trainer.replay! })
        return (yield* trainer.step([group("a2", [1, 2], [0, 0, 0, 0])])).metrics["replay/injected_groups"]
      }).pipe(Effect.provide(fresh.layer))
      assert.strictEqual(injected, 1)
      yield* Effect.promise(() => fs.rm(dir, { recursive: true, force: true }))
    })
  )
})
