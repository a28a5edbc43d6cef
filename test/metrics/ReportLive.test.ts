/**
 * `logging.report`: report.html appears while `train` is still training (after the first checkpoint), and is
 * rewritten as the run goes on, each version whole (the rename is atomic: no reader sees half a page).
 */
import { spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"

const trainSteps = (runDir: string) =>
  existsSync(join(runDir, "metrics.jsonl"))
    ? readFileSync(join(runDir, "metrics.jsonl"), "utf8")
        .split("\n")
        .filter((l) => l.includes('"event":"train"')).length
    : 0

describe("report.html during training", () => {
  it("is written after a mid-run checkpoint, before the last step, and rewritten as the run goes on", async () => {
    const runDir = mkdtempSync(join(tmpdir(), "effect-rl-report-live-"))
    const steps = 4
    const child = spawn(
      process.execPath,
      [
        "src/main.ts",
        "train",
        "--config",
        "configs/tiny.yaml",
        "--run-dir",
        runDir,
        `trainer.max_steps=${steps}`,
        "trainer.eval_before_train=false",
        "checkpoint.interval=1",
        "data.max_eval_prompts=1",
        "logging.progress=false"
      ],
      { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, NO_COLOR: "1" } }
    )
    let stderr = ""
    child.stderr.on("data", (c) => {
      stderr += String(c)
    })
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
    const file = join(runDir, "report.html")
    const versions: Array<{ readonly html: string; readonly trainedSteps: number }> = []
    while (child.exitCode === null) {
      // the steps trained before the page is read: the page was written no later than that
      const trainedSteps = trainSteps(runDir)
      if (existsSync(file)) {
        const html = readFileSync(file, "utf8")
        if (versions.at(-1)?.html !== html) versions.push({ html, trainedSteps })
      }
      await new Promise((r) => setTimeout(r, 50))
    }
    assert.strictEqual(await exited, 0, stderr.slice(-3000))
    assert.isAbove(versions.length, 1, "report.html was rewritten while the run went on")
    assert.isBelow(versions[0]!.trainedSteps, steps, "the first report.html came before the last step")
    for (const v of versions) assert.match(v.html.trimEnd(), /<\/html>$/, "every version read is a whole page")
  }, 120_000)
})
