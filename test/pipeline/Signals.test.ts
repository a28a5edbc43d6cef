/**
 * Stopping a training run from outside, through the CLI as process managers do: SIGTERM finishes the step in
 * progress, checkpoints it and exits 143, and `--resume latest` trains the rest; Ctrl-C (SIGINT) does the same, prints
 * the resume command and exits 130, and a second one stops at once. And a trainer
 * fault (here: a diverged update) is one typed line on stderr.
 */
import { spawn } from "node:child_process"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import type * as ConsumedLog from "../../src/store/ConsumedLog.ts"
import * as Cli from "../fixtures/Cli.ts"

const tmp = mkdtempSync(join(tmpdir(), "effect-rl-signals-"))
const config = "configs/tiny-async.yaml"

const consumed = (runDir: string): Array<ConsumedLog.Line> => {
  try {
    return readFileSync(join(runDir, "consumed.jsonl"), "utf8")
      .split("\n")
      .filter((l) => l !== "")
      .map((l) => JSON.parse(l) as ConsumedLog.Line)
  } catch {
    return []
  }
}

/** Start a training run, send `signal` once `ready(runDir)` holds, and return its exit code, stdout and stderr. */
const trainAndSignal = async (
  runDir: string,
  signal: NodeJS.Signals,
  ready: (runDir: string) => boolean,
  overrides: ReadonlyArray<string>
) => {
  const child = spawn(
    process.execPath,
    ["src/main.ts", "train", "--config", config, "--run-dir", runDir, "logging.progress=false", ...overrides],
    { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NO_COLOR: "1" } }
  )
  let stdout = ""
  let stderr = ""
  child.stdout.on("data", (chunk) => {
    stdout += String(chunk)
  })
  child.stderr.on("data", (chunk) => {
    stderr += String(chunk)
  })
  let finished = false
  const exited = new Promise<number | null>((resolve) =>
    child.on("exit", (code) => {
      finished = true
      resolve(code)
    })
  )
  while (!ready(runDir) && !finished) await new Promise((r) => setTimeout(r, 50))
  assert.isFalse(finished, `the run ended before the signal:\n${stderr}`)
  const sentAt = Date.now()
  child.kill(signal)
  const code = await exited
  return { code, stdout, stderr, seconds: (Date.now() - sentAt) / 1000 }
}

const overrides = ["data.max_prompts=16", "checkpoint.interval=0", "pipeline.num_generation_workers=2"]

/**
 * `train` with a learning rate that makes the first step's second mini-batch diverge after the first one's update (8
 * prompts, no checkpoints, no gradient clipping), plus `overrides`.
 */
const diverge = (runDir: string, overrides: ReadonlyArray<string>) =>
  Cli.run(
    [
      "train",
      "--config",
      config,
      "--run-dir",
      runDir,
      "logging.progress=false",
      "data.max_prompts=8",
      "checkpoint.interval=0",
      "trainer.optimizer.lr=1e30",
      "trainer.optimizer.max_grad_norm=0",
      "trainer.policy_mini_batch_size=1",
      ...overrides
    ],
    { timeoutMs: 240_000 }
  )

describe("signals", () => {
  it("SIGTERM finishes the step, checkpoints it and exits 143; --resume latest trains the rest exactly once", async () => {
    const runDir = join(tmp, "term")
    const run = await trainAndSignal(runDir, "SIGTERM", (dir) => consumed(dir).length >= 2, overrides)
    assert.strictEqual(run.code, 143, run.stderr.slice(-3000))
    assert.include(run.stderr, "SIGTERM: stopping after the current step")
    const summary = JSON.parse(run.stdout.trim().split("\n").at(-1)!) as { steps: number; stopped: string }
    assert.strictEqual(summary.stopped, "signal")
    const stoppedAt = Math.max(...consumed(runDir).map((l) => l.step))
    assert.strictEqual(summary.steps, stoppedAt)
    assert.isBelow(stoppedAt, 8, "the run stopped early")
    // checkpoint.interval 0 writes no checkpoint but the last: this one is the stop's
    assert.strictEqual(readFileSync(join(runDir, "checkpoints", "latest"), "utf8").trim(), `step-${stoppedAt}`)
    assert.notMatch(run.stderr, /^\s+at /m, "no stack trace")

    const resumed = Cli.run(["train", "--config", config, "--run-dir", runDir, ...overrides, "--resume", "latest"], {
      timeoutMs: 240_000
    })
    assert.strictEqual(resumed.code, 0, resumed.stderr.slice(-3000))
    assert.strictEqual(JSON.parse(resumed.lastLine).steps, 8)
    const cursors = consumed(runDir).map((l) => l.cursor)
    assert.deepStrictEqual(
      cursors,
      Array.from({ length: 16 }, (_, i) => i)
    )
  }, 300_000)

  it("Ctrl-C (SIGINT) checkpoints the step, prints the resume command and exits 130; that command trains the rest exactly once", async () => {
    const runDir = join(tmp, "int")
    const run = await trainAndSignal(runDir, "SIGINT", (dir) => consumed(dir).length >= 2, overrides)
    assert.strictEqual(run.code, 130, run.stderr.slice(-3000))
    assert.include(run.stderr, "Ctrl-C: stopping after the current step")
    const summary = JSON.parse(run.stdout.trim().split("\n").at(-1)!) as { steps: number; stopped: string }
    assert.strictEqual(summary.stopped, "signal")
    assert.strictEqual(readFileSync(join(runDir, "checkpoints", "latest"), "utf8").trim(), `step-${summary.steps}`)
    assert.notMatch(run.stderr, /^\s+at /m, "no stack trace")
    // the printed command, run as printed (node src/main.ts for dist/main.js: the tests run the sources)
    const printed = /continue with:\n\s+node dist\/main\.js (.*)\n/.exec(run.stderr)?.[1]
    assert.isDefined(printed, run.stderr.slice(-2000))
    const args = printed!.split(" ").map((a) => a.replace(/^'(.*)'$/, "$1"))
    assert.includeMembers(args, ["--resume", "latest", "--run-dir", runDir])
    const resumed = Cli.run(args, { timeoutMs: 240_000 })
    assert.strictEqual(resumed.code, 0, resumed.stderr.slice(-3000))
    assert.strictEqual(JSON.parse(resumed.lastLine).steps, 8)
    assert.deepStrictEqual(
      consumed(runDir).map((l) => l.cursor),
      Array.from({ length: 16 }, (_, i) => i)
    )
  }, 300_000)

  it("a second Ctrl-C interrupts at once and exits 130", async () => {
    const runDir = join(tmp, "int2")
    const child = spawn(
      process.execPath,
      ["src/main.ts", "train", "--config", config, "--run-dir", runDir, "logging.progress=false", ...overrides],
      { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NO_COLOR: "1" } }
    )
    let stderr = ""
    child.stderr.on("data", (chunk) => {
      stderr += String(chunk)
    })
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
    while (consumed(runDir).length < 2 && child.exitCode === null) await new Promise((r) => setTimeout(r, 50))
    child.kill("SIGINT")
    while (!stderr.includes("Ctrl-C: stopping") && child.exitCode === null) await new Promise((r) => setTimeout(r, 20))
    const sentAt = Date.now()
    child.kill("SIGINT")
    assert.strictEqual(await exited, 130, stderr.slice(-3000))
    assert.isBelow((Date.now() - sentAt) / 1000, 10)
    assert.notMatch(stderr, /^\s+at /m, "no stack trace")
  }, 300_000)

  it("a trainer fault is one typed line naming the step and what --resume will do, with no stack", () => {
    const runDir = join(tmp, "fault")
    const result = diverge(runDir, [
      "pipeline.mode=sync",
      // stock kernels: with the native ones (the fused LM head) the diverged step's loss stays finite and the
      // divergence shows in the sampler instead (next test)
      "backend.name=wasm",
      "backend.kernels=stock"
    ])
    assert.notStrictEqual(result.code, 0)
    assert.match(
      result.stderr,
      /TrainerFault: .*non-finite.*\(step: 1, prompts: toolbox-train-\d+@0, toolbox-train-\d+@1\)/
    )
    assert.include(result.stderr, "An update was applied mid-step")
    assert.notMatch(result.stderr, /^\s+at /m, "no stack trace")
  }, 300_000)

  it("diverged weights that still give a finite loss stop the run at the first non-finite sampled log-prob, typed", () => {
    // on the native kernels the fused LM head keeps the loss finite while the sampler's norm-folded weights overflow
    for (const mode of ["sync", "async"]) {
      const runDir = join(tmp, `diverged-${mode}`)
      const result = diverge(runDir, [`pipeline.mode=${mode}`])
      assert.notStrictEqual(result.code, 0)
      // whichever sees it first, the trainer (a non-finite loss) or the sampler, the run ends typed and names the step
      assert.match(
        result.stderr,
        /PolicyDivergedError: policy version \d+ sampled a token with log-prob (NaN|-?Infinity) \(prompt toolbox-train-\d+\)|TrainerFault: .*non-finite/,
        result.stderr.slice(-2000)
      )
      assert.notMatch(result.stderr, /^\s+at /m, "no stack trace")
      assert.notInclude(result.stderr, "a bug")
    }
  }, 300_000)
})
