import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"
import { readJsonl } from "../fixtures/Jsonl.ts"

describe("train (configs/tiny.yaml, end to end)", () => {
  it("trains 2 steps, resumes from the latest checkpoint for a 3rd, and writes metrics, checkpoints and episodes", () => {
    const runDir = mkdtempSync(join(tmpdir(), "effect-rl-train-"))
    const first = Cli.run(["train", "--config", "configs/tiny.yaml", "--run-dir", runDir, "trainer.max_steps=2"], {
      timeoutMs: 600_000
    })
    assert.strictEqual(first.code, 0, first.stderr.slice(-3000))
    const summary = JSON.parse(first.lastLine)
    assert.strictEqual(summary.event, "summary")
    assert.strictEqual(summary.steps, 2)
    assert.strictEqual(summary.runDir, runDir)
    for (const key of ["evalBefore", "evalAfter"]) {
      assert.isTrue(Number.isFinite(summary[key].all.avg_score), key)
      assert.isTrue(Number.isFinite(summary[key].toolbox.pass_at_n), key)
    }
    assert.include(first.stderr, "step 2/2")

    const second = Cli.run(
      ["train", "--config", "configs/tiny.yaml", "--run-dir", runDir, "--resume", "latest", "trainer.max_steps=3"],
      { timeoutMs: 600_000 }
    )
    assert.strictEqual(second.code, 0, second.stderr.slice(-3000))
    assert.include(second.stderr, "resumed from")
    assert.strictEqual(JSON.parse(second.lastLine).steps, 3)

    const trainMetrics = (dir: string) => readJsonl(join(dir, "metrics.jsonl")).filter((m) => m["event"] === "train")
    const steps = (dir: string) => trainMetrics(dir).map((m) => m["step"])
    const train = trainMetrics(runDir)
    assert.deepStrictEqual(steps(runDir), [1, 2, 3])
    for (const m of train) {
      for (const key of ["reward/avg_raw_reward", "generate/avg_num_tokens", "timing/train_step"]) {
        assert.isTrue(Number.isFinite(m[key]), `${key} at step ${m["step"]}`)
      }
    }
    // 3 steps × 2 prompts × 4 samples, each group a line; every prompt consumed once
    const groups = readJsonl(join(runDir, "episodes.jsonl"))
    assert.strictEqual(groups.length, 6)
    for (const g of groups) assert.strictEqual((g["trajectories"] as Array<unknown>).length, 4)
    const consumed = readJsonl(join(runDir, "consumed.jsonl")).map((c) => c["uid"])
    assert.strictEqual(consumed.length, 6)
    assert.strictEqual(new Set(consumed).size, 6)

    const latest = readFileSync(join(runDir, "checkpoints", "latest"), "utf8").trim()
    assert.strictEqual(latest, "step-3")
    for (const file of [
      "config.json",
      "model.safetensors",
      "tokenizer.json",
      "optimizer.safetensors",
      "trainer_state.json"
    ]) {
      assert.isTrue(existsSync(join(runDir, "checkpoints", latest, file)), file)
    }
    // the checkpoint is a model directory the CLI can load
    const info = Cli.run(["model", "info", "--model", join(runDir, "checkpoints", latest)])
    assert.strictEqual(info.code, 0, info.stderr)
    // and `model export` turns the run's latest checkpoint into a plain HF directory (BF16 here)
    const out = join(runDir, "export")
    const exported = Cli.run(["model", "export", "--model", runDir, "--out", out, "--dtype", "bf16"])
    assert.strictEqual(exported.code, 0, exported.stderr)
    assert.strictEqual(JSON.parse(exported.lastLine).source, join(runDir, "checkpoints", "step-3"))
    for (const file of ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]) {
      assert.isTrue(existsSync(join(out, file)), file)
    }
    assert.strictEqual(JSON.parse(Cli.run(["model", "info", "--model", out]).lastLine).dtype, "BF16")

    // a fresh run into the same directory starts clean; the earlier run moves to earlier/<its start>/, whole
    const fresh = Cli.run(["train", "--config", "configs/tiny.yaml", "--run-dir", runDir, "trainer.max_steps=1"], {
      timeoutMs: 600_000
    })
    assert.strictEqual(fresh.code, 0, fresh.stderr.slice(-3000))
    assert.include(fresh.stderr, "held an earlier run")
    assert.deepStrictEqual(steps(runDir), [1])
    assert.strictEqual(readJsonl(join(runDir, "episodes.jsonl")).length, 2)
    assert.strictEqual(readFileSync(join(runDir, "checkpoints", "latest"), "utf8").trim(), "step-1")
    const earlier = readdirSync(join(runDir, "earlier"))
    assert.strictEqual(earlier.length, 1)
    const archived = join(runDir, "earlier", earlier[0]!)
    assert.deepStrictEqual(steps(archived), [1, 2, 3])
    assert.strictEqual(readJsonl(join(archived, "episodes.jsonl")).length, 6)
    assert.strictEqual(readFileSync(join(archived, "checkpoints", "latest"), "utf8").trim(), "step-3")
    assert.isTrue(existsSync(join(runDir, "export", "model.safetensors")), "files that are not the run's stay")
  }, 900_000)
})

describe("eval --episodes-dir", () => {
  it("scores the held-out rows and writes each eval group, whose rewards give the printed avg_score", () => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-eval-"))
    const result = Cli.run(["eval", "--config", "configs/tiny.yaml", "--episodes-dir", dir], { timeoutMs: 300_000 })
    assert.strictEqual(result.code, 0, result.stderr.slice(-3000))
    const report = JSON.parse(result.lastLine).report
    const groups = readJsonl(join(dir, "episodes.jsonl"))
    assert.strictEqual(groups.length, report.all.prompts)
    const rewards = groups.map((g) => {
      const ts = g["trajectories"] as Array<{ reward: number }>
      return ts.reduce((a, t) => a + t.reward, 0) / ts.length
    })
    const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length
    assert.closeTo(mean, report.all.avg_score, 1e-9)
  }, 300_000)
})
