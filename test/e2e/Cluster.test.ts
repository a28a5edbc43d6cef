/**
 * Rollouts on the cluster across processes: a local Postgres (scripts/local-postgres.sh), three `runner` processes and
 * a `train` with `pipeline.rollouts: cluster` (configs/tiny-cluster.yaml). One runner is SIGKILLed the moment it starts
 * a group mid-run; its shards move to the survivors, which roll that group out again. The run finishes with every
 * prompt in consumed.jsonl exactly once, every group in episodes.jsonl whole, the lost group recorded as retried, and
 * the killed runner's MCP servers gone. A trainer SIGKILLed mid-run and resumed while the same runners keep running
 * takes the groups its killed process had asked for instead of rolling them out again (every cursor rolled out once).
 * And a run whose Postgres restarts mid-run waits and finishes.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import * as fs from "node:fs"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { Schema } from "effect"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Cli from "../fixtures/Cli.ts"

const config = "configs/tiny-cluster.yaml"
const children: Array<ChildProcess> = []
let pgDir = ""
let databaseUrl = ""

beforeAll(() => {
  const out = execFileSync("bash", ["scripts/local-postgres.sh", "start"], { encoding: "utf8" })
  pgDir = /PG_DIR=(.*)/.exec(out)![1]!
  databaseUrl = /DATABASE_URL=(.*)/.exec(out)![1]!
})

afterAll(() => {
  for (const child of children) if (child.exitCode === null) child.kill("SIGKILL")
  if (pgDir !== "") execFileSync("bash", ["scripts/local-postgres.sh", "stop", pgDir])
})

const env = () => ({ ...process.env, NO_COLOR: "1", DATABASE_URL: databaseUrl })

/** A runner process; resolves once it has registered (its `{"event":"runner"}` line). */
const startRunner = (port: number, weights: string, onStderr: (text: string, child: ChildProcess) => void) =>
  new Promise<ChildProcess>((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [
        "src/main.ts",
        "runner",
        "--config",
        config,
        "--host",
        "127.0.0.1",
        "--port",
        String(port),
        "--weights",
        weights
      ],
      { stdio: ["ignore", "pipe", "pipe"], env: env() }
    )
    children.push(child)
    let stdout = ""
    let stderr = ""
    child.stdout!.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
      if (stdout.includes('"event":"runner"')) resolve(child)
    })
    child.stderr!.on("data", (chunk: Buffer) => {
      stderr += chunk.toString()
      onStderr(chunk.toString(), child)
    })
    child.on("exit", (code) => reject(new Error(`runner on ${port} exited (${code}) before registering:\n${stderr}`)))
  })

const freePort = () =>
  Number(
    execFileSync(process.execPath, [
      "-e",
      'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
    ]).toString()
  )

const lines = (file: string) =>
  fs.existsSync(file)
    ? fs
        .readFileSync(file, "utf8")
        .split("\n")
        .filter((l) => l.trim() !== "")
    : []

/** The pids of a process's children (its MCP servers). */
const childPids = (pid: number): Array<number> => {
  try {
    return execFileSync("ps", ["-o", "pid=", "--ppid", String(pid)], { encoding: "utf8" })
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map(Number)
  } catch {
    return []
  }
}
const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

describe("rollouts on the cluster (Postgres, 3 runners)", () => {
  it("survives a runner SIGKILLed mid-group: every prompt trained once, every group whole", async () => {
    const runDir = fs.mkdtempSync(path.join(tmpdir(), "effect-rl-cluster-"))
    const weights = path.join(runDir, "weights")
    const consumedFile = path.join(runDir, "consumed.jsonl")
    let killed: { pid: number; key: string; mcp: Array<number> } | undefined
    // kill the first runner that starts a group once two steps are trained, the moment it starts it
    const onStderr = (text: string, child: ChildProcess) => {
      const started = /runner: rolling out (\S+)/.exec(text)
      if (killed !== undefined || started === null || lines(consumedFile).length < 4) return
      killed = { pid: child.pid!, key: started[1]!, mcp: childPids(child.pid!) }
      child.kill("SIGKILL")
    }
    const runners = await Promise.all(
      [freePort(), freePort(), freePort()].map((p) => startRunner(p, weights, onStderr))
    )
    assert.strictEqual(runners.length, 3)

    const trainer = spawn(process.execPath, ["src/main.ts", "train", "--config", config, "--run-dir", runDir], {
      stdio: ["ignore", "pipe", "pipe"],
      env: env()
    })
    children.push(trainer)
    let stdout = ""
    let stderr = ""
    trainer.stdout!.on("data", (c: Buffer) => {
      stdout += c.toString()
    })
    trainer.stderr!.on("data", (c: Buffer) => {
      stderr += c.toString()
    })
    const code = await new Promise<number>((resolve) => trainer.on("close", (c) => resolve(c ?? -1)))
    assert.strictEqual(code, 0, stderr.slice(-3000))
    assert.isDefined(killed, "no runner was killed mid-run")

    // the secret never reaches a log or the run's config
    assert.notInclude(stderr + stdout, databaseUrl)
    assert.notInclude(fs.readFileSync(path.join(runDir, "config.yaml"), "utf8"), databaseUrl)

    const summary = JSON.parse(stdout.trim().split("\n").at(-1)!) as { steps: number; groups: number }
    assert.strictEqual(summary.steps, 8)

    // consumed.jsonl: the 16 prompts, each exactly once, in cursor order
    const consumed = lines(consumedFile).map((l) => JSON.parse(l) as { uid: string; cursor: number; step: number })
    assert.deepStrictEqual(
      consumed.map((c) => c.cursor),
      Array.from({ length: 16 }, (_, i) => i)
    )
    assert.strictEqual(new Set(consumed.map((c) => c.uid)).size, 16)

    // episodes.jsonl: one whole group per cursor, token arrays aligned, the lost group recorded as retried
    const decode = Schema.decodeUnknownSync(Schema.fromJsonString(TrajectoryGroup))
    const groups = lines(path.join(runDir, "episodes.jsonl")).map((l) => decode(l))
    assert.deepStrictEqual(
      groups.map((g) => g.cursor).sort((a, b) => a - b),
      Array.from({ length: 16 }, (_, i) => i)
    )
    for (const g of groups) {
      assert.strictEqual(g.trajectories.length, 2, `group ${g.cursor}`)
      for (const t of g.trajectories) {
        assert.strictEqual(t.lossMask.length, t.responseIds.length)
        assert.strictEqual(t.rolloutLogprobs.length, t.responseIds.length)
        assert.isAbove(t.turns.length, 0)
      }
    }
    const cursor = Number(killed!.key.split("/")[1])
    const retried = groups.find((g) => g.cursor === cursor)!
    assert.isAtLeast(
      retried.retried ?? 0,
      1,
      `group ${killed!.key} was lost with its runner but not recorded as retried`
    )

    // the killed runner left no MCP server behind (the process reaper kills its groups)
    assert.isAbove(killed!.mcp.length, 0, "the killed runner had no MCP server running")
    await new Promise((r) => setTimeout(r, 1500))
    assert.deepStrictEqual(killed!.mcp.filter(alive), [], "MCP servers of the killed runner still alive")
    fs.rmSync(runDir, { recursive: true, force: true })
    await Promise.all(runners.map((r) => stopChild(r)))
  })

  it("resumes a trainer killed with -9 while its runners keep running: every prompt once, no group rolled out twice", async () => {
    const runDir = fs.mkdtempSync(path.join(tmpdir(), "effect-rl-cluster-restart-"))
    const weights = path.join(runDir, "weights")
    const consumedFile = path.join(runDir, "consumed.jsonl")
    // every rollout any runner starts, by cursor (the key is <run>/<cursor>/v<version>)
    const rolledOut: Array<{ cursor: number; again: boolean }> = []
    const onStderr = (text: string) => {
      for (const m of text.matchAll(/runner: rolling out \S+?\/(\d+)\/v\d+( again)?/g)) {
        rolledOut.push({ cursor: Number(m[1]), again: m[2] !== undefined })
      }
    }
    const runners = await Promise.all(
      [freePort(), freePort(), freePort()].map((p) => startRunner(p, weights, (text) => onStderr(text)))
    )
    const train = (resume: boolean) => {
      const run = Cli.start(
        ["train", "--config", config, "--run-dir", runDir, ...(resume ? ["--resume", "latest"] : [])],
        { DATABASE_URL: databaseUrl }
      )
      children.push(run.child)
      return run
    }

    try {
      // killed after three steps: step 2's checkpoint, step 3 trained past it, later groups asked for and in flight
      const first = train(false)
      while (lines(consumedFile).length < 6 && first.child.exitCode === null)
        await new Promise((r) => setTimeout(r, 20))
      first.child.kill("SIGKILL")
      assert.strictEqual(await first.exited, "SIGKILL", first.stderr().slice(-3000))
      const rolledBefore = rolledOut.length

      const resumed = train(true)
      assert.strictEqual(await resumed.exited, 0, resumed.stderr().slice(-3000))
      assert.match(resumed.stderr(), /requests of earlier trainer processes of this run are asked for again/)
      // step 3's version reached the runners before the kill: the restored weights go out above it
      assert.match(resumed.stderr(), /the restored weights go out as version \d+, so every engine takes them/)

      // every prompt trained exactly once, in cursor order
      assert.deepStrictEqual(
        lines(consumedFile).map((l) => (JSON.parse(l) as { cursor: number }).cursor),
        Array.from({ length: 16 }, (_, i) => i)
      )
      // no group rolled out twice: each cursor's rollout started once, on the runners that kept running throughout
      const byCursor = new Map<number, number>()
      for (const r of rolledOut) byCursor.set(r.cursor, (byCursor.get(r.cursor) ?? 0) + 1)
      assert.deepStrictEqual(
        [...byCursor.entries()].filter(([, n]) => n > 1),
        [],
        `rolled out more than once (rollouts: ${JSON.stringify(rolledOut)})`
      )
      assert.isAbove(rolledOut.length, rolledBefore, "the runners rolled out nothing for the resumed trainer")
      for (const r of runners) assert.strictEqual(r.exitCode, null, "a runner stopped with the trainer")
    } finally {
      // stopped whatever happened: a runner left up would take the next test's groups on this test's weights
      await Promise.all(runners.map((r) => stopChild(r)))
    }
    fs.rmSync(runDir, { recursive: true, force: true })
  })

  it("waits through a Postgres restart mid-run and finishes every prompt once", async () => {
    const runDir = fs.mkdtempSync(path.join(tmpdir(), "effect-rl-cluster-pg-"))
    const consumedFile = path.join(runDir, "consumed.jsonl")
    const weights = path.join(runDir, "weights")
    const runners = await Promise.all([freePort(), freePort()].map((p) => startRunner(p, weights, () => {})))
    const trainer = spawn(
      process.execPath,
      ["src/main.ts", "train", "--config", config, "--run-dir", runDir, "data.max_prompts=24"],
      { stdio: ["ignore", "pipe", "pipe"], env: env() }
    )
    children.push(trainer)
    let stderr = ""
    trainer.stderr!.on("data", (c: Buffer) => {
      stderr += c.toString()
    })
    trainer.stdout!.resume()
    const closed = new Promise<number>((resolve) => trainer.on("close", (c) => resolve(c ?? -1)))
    while (lines(consumedFile).length < 4) await new Promise((r) => setTimeout(r, 100))
    const at = lines(consumedFile).length
    execFileSync("bash", ["scripts/local-postgres.sh", "restart", pgDir])
    const code = await closed
    assert.strictEqual(code, 0, stderr.slice(-3000))
    const consumed = lines(consumedFile).map((l) => JSON.parse(l) as { cursor: number })
    assert.isBelow(at, 24, "Postgres restarted after the run had finished")
    assert.deepStrictEqual(
      consumed.map((c) => c.cursor),
      Array.from({ length: 24 }, (_, i) => i)
    )
    fs.rmSync(runDir, { recursive: true, force: true })
    await Promise.all(runners.map((r) => stopChild(r)))
  })
})

const stopChild = (child: ChildProcess) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    child.on("exit", () => resolve())
    child.kill("SIGTERM")
  })
