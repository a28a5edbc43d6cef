/**
 * On-policy distillation end to end, across processes, with the shipped quickstart teacher (the same byte vocabulary
 * as the tiny configs' random policy): a sync run records the teacher's log-probs of every loss token and trains on
 * them; `replay` of its episode log, with the teacher pointing nowhere, gives the same weights; an async LoRA run
 * resumed from its checkpoint trains every prompt once and keeps scoring.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"
import { readJsonl } from "../fixtures/Jsonl.ts"

const trainMetrics = (dir: string) =>
  readJsonl(join(dir, "metrics.jsonl")).filter((m) => m["event"] === "train") as Array<Record<string, number>>

interface Recorded {
  readonly stopReason: string
  readonly lossMask: Array<number>
  readonly responseIds: Array<number>
  readonly teacherLogprobs?: Array<number>
}

/** Every trajectory that did not end `error` carries the teacher's log-prob of each loss token (0 elsewhere). */
const assertScored = (dir: string) => {
  const groups = readJsonl(join(dir, "episodes.jsonl"))
  assert.isAbove(groups.length, 0)
  for (const g of groups) {
    const usage = g["teacher"] as { calls: number; cached: number; failed: number }
    const trajectories = g["trajectories"] as Array<Recorded>
    assert.strictEqual(usage.failed, 0)
    assert.strictEqual(usage.calls + usage.cached, trajectories.filter((t) => t.stopReason !== "error").length)
    for (const t of trajectories.filter((x) => x.stopReason !== "error")) {
      assert.strictEqual(t.teacherLogprobs?.length, t.responseIds.length)
      for (const [i, m] of t.lossMask.entries()) {
        if (m === 0) assert.strictEqual(t.teacherLogprobs![i], 0)
        else assert.isBelow(t.teacherLogprobs![i]!, 0)
      }
    }
  }
}

const teacher = "trainer.distillation.teacher=data/quickstart/teacher"

describe("on-policy distillation (configs/tiny*.yaml, teacher data/quickstart/teacher)", () => {
  it("records the teacher's log-probs, trains on them, and replays to the same weights with no teacher", () => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-distill-"))
    try {
      const common = ["trainer.max_steps=3", "trainer.eval_before_train=false", "trainer.eval_interval=0"]
      const run = Cli.run(["train", "--config", "configs/tiny.yaml", "--run-dir", join(dir, "a"), teacher, ...common], {
        timeoutMs: 300_000
      })
      assert.strictEqual(run.code, 0, run.stderr.slice(-3000))
      assertScored(join(dir, "a"))
      const metrics = trainMetrics(join(dir, "a"))
      assert.strictEqual(metrics.length, 3)
      for (const m of metrics) {
        assert.isAbove(m["distill/teacher_kl"]!, 0, "a random policy is far from the teacher")
        assert.isAbove(m["distill/teacher_calls"]!, 0)
        assert.isAbove(m["policy/grad_norm"]!, 0)
      }

      const replay = Cli.run(
        [
          "replay",
          "--episodes",
          join(dir, "a", "episodes.jsonl"),
          "--config",
          "configs/tiny.yaml",
          "--run-dir",
          join(dir, "b"),
          "trainer.distillation.teacher=/nonexistent/teacher",
          ...common
        ],
        { timeoutMs: 300_000 }
      )
      assert.strictEqual(replay.code, 0, replay.stderr.slice(-3000))
      const [a, b] = [run, replay].map((r) => JSON.parse(r.lastLine) as { checkpoint: string })
      assert.isTrue(
        readFileSync(join(a!.checkpoint, "model.safetensors")).equals(
          readFileSync(join(b!.checkpoint, "model.safetensors"))
        ),
        "the replay trained the same weights"
      )
      const replayed = trainMetrics(join(dir, "b"))
      assert.deepStrictEqual(
        replayed.map((m) => m["distill/teacher_kl"]),
        metrics.map((m) => m["distill/teacher_kl"])
      )
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 600_000)

  it("trains a LoRA student in the async pipeline, and resumes it with every prompt trained once", () => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-distill-async-"))
    try {
      const args = (steps: number) => [
        "train",
        "--config",
        "configs/tiny-async.yaml",
        "--run-dir",
        dir,
        teacher,
        "model.lora.rank=4",
        "trainer.eval_before_train=false",
        "trainer.eval_interval=0",
        `trainer.max_steps=${steps}`
      ]
      const first = Cli.run(args(2), { timeoutMs: 300_000 })
      assert.strictEqual(first.code, 0, first.stderr.slice(-3000))
      assert.isTrue(existsSync(join(dir, "checkpoints", "latest")))
      const second = Cli.run([...args(4), "--resume", "latest"], { timeoutMs: 300_000 })
      assert.strictEqual(second.code, 0, second.stderr.slice(-3000))
      assertScored(dir)
      const steps = trainMetrics(dir)
      assert.deepStrictEqual(
        steps.map((m) => m["step"]),
        [1, 2, 3, 4]
      )
      for (const m of steps) assert.isAbove(m["distill/teacher_kl"]!, 0)
      const consumed = readJsonl(join(dir, "consumed.jsonl")).map((r) => r["uid"] as string)
      assert.strictEqual(new Set(consumed).size, consumed.length, "no prompt trained twice")
      assert.strictEqual(consumed.length, 8) // 4 steps × 2 groups
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 600_000)
})
