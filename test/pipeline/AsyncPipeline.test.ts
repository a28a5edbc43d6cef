/**
 * The async pipeline end to end, through the CLI as users run it (configs/tiny-async.yaml: a tiny random policy, the
 * toolbox MCP server, an entropy bonus so every step moves the weights).
 */
import { spawn } from "node:child_process"
import { appendFileSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import * as AsyncSource from "../../src/pipeline/AsyncSource.ts"
import * as Rollouts from "../../src/pipeline/Rollouts.ts"
import * as ConsumedLog from "../../src/store/ConsumedLog.ts"
import * as EpisodeLog from "../../src/store/EpisodeLog.ts"
import * as Cli from "../fixtures/Cli.ts"

const tmp = mkdtempSync(join(tmpdir(), "effect-rl-async-"))
const config = "configs/tiny-async.yaml"

const consumedLines = (runDir: string) =>
  readFileSync(join(runDir, "consumed.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l) as ConsumedLog.Line)

const trainMetrics = (runDir: string) =>
  readFileSync(join(runDir, "metrics.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l) as Record<string, number | string>)
    .filter((m) => m["event"] === "train")

const train = (runDir: string, ...overrides: Array<string>) =>
  Cli.run(["train", "--config", config, "--run-dir", runDir, "logging.progress=false", ...overrides], {
    timeoutMs: 240_000
  })

describe("AsyncSource helpers", () => {
  it("stepOfVersion finds the step whose published weights a version is", () => {
    // step 0 published v0, step 1 → v2 (two mini-batches), step 2 → v2 (no update), step 3 → v5
    const published = [0, 2, 2, 5]
    assert.strictEqual(AsyncSource.stepOfVersion(published, 0), 0)
    assert.strictEqual(AsyncSource.stepOfVersion(published, 1), 0) // mid-step 1: still older than its end
    assert.strictEqual(AsyncSource.stepOfVersion(published, 2), 2) // v2 is the weights of steps 1 and 2
    assert.strictEqual(AsyncSource.stepOfVersion(published, 7), 3)
  })

  it.effect("ConsumedLog.truncateTo keeps the lines of steps up to the checkpoint and drops a torn line", () =>
    Effect.gen(function* () {
      const dir = mkdtempSync(join(tmp, "consumed-"))
      const group = (uid: string, cursor: number) => ({
        promptUid: uid,
        cursor,
        dataSource: "toolbox",
        envClass: "mcp_tool",
        trajectories: []
      })
      yield* ConsumedLog.append(dir, 1, [group("a", 0), group("b", 1)])
      yield* ConsumedLog.append(dir, 2, [group("c", 2), group("d", 3)])
      appendFileSync(ConsumedLog.file(dir), '{"uid":"e","cur')
      const dropped = yield* ConsumedLog.truncateTo(dir, 1)
      assert.strictEqual(dropped, 3) // two lines of step 2 and the torn one
      assert.deepStrictEqual(
        (yield* ConsumedLog.read(dir)).map((l) => l.uid),
        ["a", "b"]
      )
    })
  )

  it.effect("ConsumedLog refuses a torn line in the middle of the file, naming it, instead of dropping a record", () =>
    Effect.gen(function* () {
      const dir = mkdtempSync(join(tmp, "consumed-mid-"))
      writeFileSync(
        ConsumedLog.file(dir),
        '{"uid":"a","cursor":0,"step":1}\n{"uid":"b","cur\n{"uid":"c","cursor":2,"step":2}\n'
      )
      const error = yield* Effect.flip(ConsumedLog.truncateTo(dir, 1))
      assert.strictEqual(error._tag, "ConsumedLogError")
      assert.strictEqual(error.line, 2)
      assert.strictEqual(readFileSync(ConsumedLog.file(dir), "utf8").split("\n").length, 4, "the file is untouched")
    })
  )

  it.effect("ConsumedLog.dropTornTail cuts a JSONL file back to its last whole line", () =>
    Effect.gen(function* () {
      const file = join(mkdtempSync(join(tmp, "torn-")), "episodes.jsonl")
      appendFileSync(file, '{"a":1}\n{"b":2}\n{"c":')
      assert.strictEqual(yield* ConsumedLog.dropTornTail(file), 5)
      assert.strictEqual(readFileSync(file, "utf8"), '{"a":1}\n{"b":2}\n')
      assert.strictEqual(yield* ConsumedLog.dropTornTail(file), 0)
    })
  )
})

describe("train with pipeline.mode async", () => {
  it("with max_staleness_steps 0 produces bit-identical weights to the sync pipeline", () => {
    const runs = ["sync", "async"].map((mode) => {
      const runDir = join(tmp, `equal-${mode}`)
      const result = train(
        runDir,
        `pipeline.mode=${mode}`,
        "pipeline.max_staleness_steps=0",
        "data.max_prompts=4",
        "checkpoint.interval=1"
      )
      assert.strictEqual(result.code, 0, result.stderr)
      assert.strictEqual(JSON.parse(result.lastLine).steps, 2)
      return runDir
    })
    const weights = (runDir: string, step: number) =>
      readFileSync(join(runDir, "checkpoints", `step-${step}`, "model.safetensors"))
    const [sync, async] = runs as [string, string]
    assert.isFalse(weights(sync, 1).equals(weights(sync, 2)), "the weights must move, or equality proves nothing")
    assert.isTrue(weights(sync, 2).equals(weights(async, 2)), "final weights differ between sync and async (S = 0)")
    assert.deepStrictEqual(consumedLines(async), consumedLines(sync))
    for (const m of trainMetrics(async)) assert.strictEqual(m["async/staleness_max"], 0)
  })

  it("trainer.max_train_seconds stops after the step that passes it and checkpoints it (sync and async)", () => {
    for (const mode of ["sync", "async"]) {
      const runDir = join(tmp, `budget-${mode}`)
      const result = train(
        runDir,
        `pipeline.mode=${mode}`,
        "data.max_prompts=8", // 4 steps of 2 groups
        "trainer.max_train_seconds=0.001",
        "checkpoint.interval=0"
      )
      assert.strictEqual(result.code, 0, result.stderr)
      assert.strictEqual(JSON.parse(result.lastLine).steps, 1, `${mode}: ${result.lastLine}`)
      assert.strictEqual(trainMetrics(runDir).length, 1)
      assert.strictEqual(readFileSync(join(runDir, "checkpoints", "latest"), "utf8").trim(), "step-1")
      assert.include(result.stderr + result.stdout, "max_train_seconds")
    }
  })

  it("resumes after kill -9 without losing or repeating a prompt", async () => {
    const runDir = join(tmp, "killed")
    const overrides = [
      "logging.progress=false",
      "data.max_prompts=16", // 8 steps of 2 groups
      "pipeline.max_staleness_steps=2",
      "pipeline.num_generation_workers=4",
      "checkpoint.interval=1"
    ]
    const child = spawn(
      process.execPath,
      ["src/main.ts", "train", "--config", config, "--run-dir", runDir, ...overrides],
      {
        stdio: ["ignore", "ignore", "pipe"],
        env: { ...process.env, NO_COLOR: "1" }
      }
    )
    let stderr = ""
    child.stderr.on("data", (chunk) => {
      stderr += String(chunk)
    })
    const exited = new Promise<NodeJS.Signals | number | null>((resolve) =>
      child.on("exit", (code, signal) => resolve(signal ?? code))
    )
    // kill once a checkpoint holding in-flight groups exists and some steps are consumed
    const ready = () => {
      try {
        const latest = readFileSync(join(runDir, "checkpoints", "latest"), "utf8").trim()
        const inflight = readFileSync(join(runDir, "checkpoints", latest, Rollouts.inflightFile), "utf8")
        return inflight.length > 0 && consumedLines(runDir).length >= 4
      } catch {
        return false // not written yet, or pruned between the two reads
      }
    }
    let finished = false
    void exited.then(() => {
      finished = true
    })
    while (!ready() && !finished) await new Promise((r) => setTimeout(r, 100))
    assert.isFalse(finished, `the run ended before it could be killed:\n${stderr}`)
    child.kill("SIGKILL")
    assert.strictEqual(await exited, "SIGKILL")
    const before = consumedLines(runDir).length
    assert.isBelow(before, 16)
    // a crash mid-write: the episode log ends in a torn line
    appendFileSync(join(runDir, EpisodeLog.fileName), '{"promptUid":"toolbox-train-0')

    const resumed = train(runDir, ...overrides.slice(1), "--resume", "latest")
    assert.strictEqual(resumed.code, 0, resumed.stderr)
    assert.match(resumed.stderr, /resumed at step \d+: [1-9]\d* in-flight groups restored/)
    assert.match(resumed.stderr, /episodes\.jsonl: skipping torn last line/)

    const lines = consumedLines(runDir)
    const uids = lines.map((l) => l.uid)
    assert.strictEqual(new Set(uids).size, 16, "every prompt once")
    assert.strictEqual(uids.length, 16, "no prompt twice")
    assert.deepStrictEqual(
      lines.map((l) => l.cursor),
      Array.from({ length: 16 }, (_, i) => i)
    )
    const staleness = trainMetrics(runDir).map((m) => m["async/staleness_max"] as number)
    assert.isAtMost(Math.max(...staleness), 2) // never over max_staleness_steps
    // and the pipeline did run ahead: 4 fibers start 4 groups on the initial weights, 2 of them train at step 2
    assert.isAtLeast(Math.max(...staleness), 1)
    // the episode log reads back whole
    const groups = await Effect.runPromise(
      EpisodeLog.read(join(runDir, EpisodeLog.fileName)).pipe(Stream.runCollect, Effect.provide(NodeServices.layer))
    )
    assert.isAtLeast(groups.length, 16)
    assert.isTrue(existsSync(join(runDir, "checkpoints", "step-8")))

    // replay = run: the recorded stream (attempts lost with the crash included) trains the run's 8 steps on its 16
    // groups, batched as the run batched them, to the run's weights
    const replayed = Cli.run(
      [
        "replay",
        "--episodes",
        join(runDir, EpisodeLog.fileName),
        "--config",
        config,
        "--run-dir",
        join(tmp, "killed-replay"),
        ...overrides
      ],
      { timeoutMs: 240_000 }
    )
    assert.strictEqual(replayed.code, 0, replayed.stderr)
    const summary = JSON.parse(replayed.lastLine) as { steps: number; groups: number; checkpoint: string }
    assert.strictEqual(summary.steps, 8)
    assert.strictEqual(summary.groups, 16)
    assert.isTrue(
      readFileSync(join(summary.checkpoint, "model.safetensors")).equals(
        readFileSync(join(runDir, "checkpoints", "step-8", "model.safetensors"))
      ),
      "replay after kill -9 and resume reproduces the run's weights"
    )
    // step by step (a step the crash lost is logged twice in the run; its retrained line is the later one)
    const gradNorms = (dir: string) => {
      const byStep = new Map<unknown, unknown>()
      for (const m of trainMetrics(dir)) byStep.set(m["step"], m["policy/grad_norm"])
      return [...byStep.entries()].sort((a, b) => Number(a[0]) - Number(b[0]))
    }
    assert.strictEqual(gradNorms(runDir).length, 8)
    assert.deepStrictEqual(gradNorms(join(tmp, "killed-replay")), gradNorms(runDir))
  })
})
