/**
 * The distillation teacher: its log-probs are the model's own (batched with padding or not), it scores a group's
 * loss tokens once per distinct sequence, a teacher that fails ends the affected trajectories `error` while the group
 * goes on, and a teacher with another tokenizer is refused.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import type { Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Teacher from "../../src/inference/Teacher.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as TinyPolicy from "../fixtures/TinyPolicy.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

let model: Transformer.Transformer
beforeAll(async () => {
  await Effect.runPromise(TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" }))
  model = TinyPolicy.model(5)
})
afterAll(() => Transformer.dispose(model))

/** prompt [1, 2, 3]; response [4, 5, 6, 7] of which 6 is a tool-output token (loss mask 0) */
const trajectory = (sample: number, response = [4, 5, 6, 7]): Trajectory => ({
  ...Trajectories.oneTurn({ uid: "p", sample, prompt: [1, 2, 3], response, reward: 1, rolloutLogprob: -1 }),
  lossMask: [1, 1, 0, 1]
})
const group = (trajectories: Array<Trajectory>): TrajectoryGroup => ({
  promptUid: "p",
  cursor: 0,
  dataSource: "t",
  envClass: "t",
  trajectories
})

describe("Teacher.local", () => {
  it("gives each sequence's log-probs as LogProbs.ofIds does, sequences of different lengths in one batch", async () => {
    const sequences = [
      [1, 2, 3, 4, 5],
      [9, 8, 7],
      [3, 3, 3, 3, 3, 3, 3]
    ]
    const scored = await Effect.runPromise(Teacher.local(model, { source: "tiny", temperature: 1 }).score(sequences))
    for (const [b, s] of sequences.entries()) {
      const alone = await LogProbs.ofIds(model, s)
      assert.strictEqual(scored[b]!.length, s.length - 1)
      for (const [i, v] of alone.entries()) assert.closeTo(scored[b]![i]!, v, 1e-5)
    }
  })

  it("divides the logits by the temperature", async () => {
    const [hot] = await Effect.runPromise(Teacher.local(model, { source: "tiny", temperature: 2 }).score([[1, 2, 3]]))
    const [cold] = await Effect.runPromise(Teacher.local(model, { source: "tiny", temperature: 1 }).score([[1, 2, 3]]))
    // a random model's distribution flattens at τ 2: each log-prob moves toward −log 16
    for (const [i, v] of hot!.entries()) assert.isBelow(Math.abs(v + Math.log(16)), Math.abs(cold![i]! + Math.log(16)))
  })
})

describe("Teacher.scorer", () => {
  it("puts the teacher's log-prob of each loss token on the trajectory, scoring identical samples once", async () => {
    const calls: Array<number> = []
    const inner = Teacher.local(model, { source: "tiny", temperature: 1 })
    const counting: Teacher.Teacher = {
      source: "tiny",
      score: (sequences) => {
        calls.push(sequences.length)
        return inner.score(sequences)
      }
    }
    const score = Teacher.scorer(counting, { cacheSize: 16, pricePerToken: 0.5 })
    const scored = await Effect.runPromise(score(group([trajectory(0), trajectory(1), trajectory(2, [4, 5, 6, 9])])))
    assert.deepStrictEqual(calls, [2])
    const full = await LogProbs.ofIds(model, [1, 2, 3, 4, 5, 6, 7]) // token t's log-prob at index t − 1
    const t0 = scored.trajectories[0]!.teacherLogprobs!
    assert.strictEqual(t0.length, 4)
    assert.closeTo(t0[0]!, full[2]!, 1e-5) // response token 0 is sequence token 3
    assert.closeTo(t0[1]!, full[3]!, 1e-5)
    assert.strictEqual(t0[2], 0) // tool output: off the loss mask
    assert.closeTo(t0[3]!, full[5]!, 1e-5)
    assert.deepStrictEqual(scored.trajectories[1]!.teacherLogprobs, t0)
    assert.deepInclude(scored.teacher!, { calls: 2, tokens: 14, cost: 7, cached: 1, failed: 0 })
    // a later group of the same sequence comes from the cache
    const again = await Effect.runPromise(score(group([trajectory(3)])))
    assert.deepStrictEqual(calls, [2, 0])
    assert.deepInclude(again.teacher!, { calls: 0, cached: 1 })
    assert.deepStrictEqual(again.trajectories[0]!.teacherLogprobs, t0)
  })

  it("ends the trajectories a failing teacher could not score `error`, and leaves error trajectories unscored", async () => {
    const down: Teacher.Teacher = {
      source: "http://teacher",
      score: () => Effect.fail(new Teacher.TeacherError({ teacher: "http://teacher", message: "connection refused" }))
    }
    const broken: Trajectory = { ...trajectory(1), stopReason: "error", error: "tool server died" }
    const scored = await Effect.runPromise(
      Teacher.scorer(down, { cacheSize: 16, pricePerToken: 0 })(group([trajectory(0), broken]))
    )
    assert.strictEqual(scored.trajectories[0]!.stopReason, "error")
    assert.strictEqual(scored.trajectories[0]!.error, "teacher http://teacher: connection refused")
    assert.isUndefined(scored.trajectories[0]!.teacherLogprobs)
    assert.strictEqual(scored.trajectories[1]!.error, "tool server died")
    assert.deepInclude(scored.teacher!, { calls: 1, cached: 0, failed: 1 })
    assert.deepInclude(Teacher.stepMetrics([scored]), { "distill/teacher_failed": 1, "distill/teacher_kl": 0 })
  })
})

describe("Teacher.stepMetrics", () => {
  it("averages log π_rollout − log π_teacher over the loss tokens of the step", () => {
    const t = { ...trajectory(0), teacherLogprobs: [-0.5, -2, 0, -1] } // rollout −1 on each loss token
    const g = { ...group([t]), teacher: { calls: 1, tokens: 7, cached: 0, failed: 0, ms: 1500 } }
    // (−1 + 0.5) + (−1 + 2) + (−1 + 1) = 0.5 over 3 loss tokens
    assert.deepStrictEqual(Teacher.stepMetrics([g]), {
      "distill/teacher_kl": 0.5 / 3,
      "distill/teacher_calls": 1,
      "distill/teacher_tokens": 7,
      "distill/teacher_cost": 0,
      "distill/teacher_cached": 0,
      "distill/teacher_failed": 0,
      "distill/teacher_s": 1.5
    })
    assert.deepStrictEqual(Teacher.stepMetrics([group([trajectory(0)])]), {})
  })
})

describe("Teacher.tokenizerMismatch", () => {
  const dirs: Array<string> = []
  const withTokenizer = (vocab: Record<string, number>) => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-teacher-"))
    dirs.push(dir)
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify({ model: { type: "BPE", vocab }, added_tokens: [] }))
    return dir
  }
  afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })))

  it("accepts the same vocabulary however the file is formatted, and refuses another size or vocabulary", () => {
    const a = withTokenizer({ a: 0, b: 1 })
    const same = mkdtempSync(join(tmpdir(), "effect-rl-teacher-"))
    dirs.push(same)
    writeFileSync(
      join(same, "tokenizer.json"),
      JSON.stringify({ model: { type: "BPE", vocab: { a: 0, b: 1 } }, added_tokens: [] }, null, 2)
    )
    assert.isUndefined(Teacher.tokenizerMismatch({ dir: same, vocabSize: 2 }, { dir: a, vocabSize: 2 }))
    assert.isUndefined(Teacher.tokenizerMismatch({ dir: a, vocabSize: 2 }, { dir: undefined, vocabSize: 2 }))
    assert.strictEqual(
      Teacher.tokenizerMismatch({ dir: a, vocabSize: 151_936 }, { dir: a, vocabSize: 2 }),
      "the teacher's vocabulary has 151936 tokens, the policy's 2"
    )
    const other = withTokenizer({ b: 0, a: 1 })
    assert.match(
      Teacher.tokenizerMismatch({ dir: other, vocabSize: 2 }, { dir: a, vocabSize: 2 })!,
      /tokenizer\.json and .*tokenizer\.json hold different vocabularies$/
    )
  })
})
