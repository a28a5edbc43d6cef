/**
 * The chaos suite: a fully-async run (test/chaos/chaos.yaml: the quickstart policy against ChaosMcpServer, whose
 * tool calls crash, hang, answer malformed JSON-RPC, tool errors and huge results) that is killed with SIGKILL five
 * times and stopped with SIGTERM once, resumed after each, and then checked:
 *
 * - every prompt was trained exactly once (consumed.jsonl holds each cursor once, in order) and every step ran;
 * - the faults happened (the server's own log) and every trajectory that ended in an error says why;
 * - no process is left behind: every chaos server and the grandchild each one leaves in its process group are gone;
 * - replay = run: `replay --episodes` reproduces the run's steps (each step's gradient norm) and final weights bit
 *   for bit.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"

const tmp = mkdtempSync(join(tmpdir(), "effect-rl-chaos-"))
// CHAOS_KERNELS=stock|native picks the CPU kernels (.ci/run runs the suite with both); default: the config's
const kernels = process.env["CHAOS_KERNELS"] === undefined ? [] : [`backend.kernels=${process.env["CHAOS_KERNELS"]}`]
const runDir = join(tmp, "run")
const chaosLog = join(tmp, "chaos.log")
const steps = 8
const batch = 2

// the shipped chaos config with this run's server log and size
const config = join(tmp, "chaos.yaml")
writeFileSync(
  config,
  readFileSync("test/chaos/chaos.yaml", "utf8")
    .replace(/CHAOS_LONG: "0.15"/, `CHAOS_LONG: "0.15"\n        CHAOS_LOG: ${JSON.stringify(chaosLog)}`)
    .replace(/max_prompts: \d+/, `max_prompts: ${steps * batch}`)
)

const consumedCursors = (): Array<number> => {
  try {
    return readFileSync(join(runDir, "consumed.jsonl"), "utf8")
      .split("\n")
      .filter((l) => l !== "")
      .map((l) => (JSON.parse(l) as { cursor: number }).cursor)
  } catch {
    return []
  }
}

const start = (
  resume: boolean
): { child: ChildProcess; exited: Promise<number | string | null>; out: () => string } => {
  const child = spawn(
    process.execPath,
    [
      "src/main.ts",
      "train",
      "--config",
      config,
      "--run-dir",
      runDir,
      "logging.progress=false",
      ...kernels,
      ...(resume ? ["--resume", "latest"] : [])
    ],
    { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NO_COLOR: "1" } }
  )
  let out = ""
  child.stdout!.on("data", (c) => {
    out += String(c)
  })
  child.stderr!.on("data", (c) => {
    out += String(c)
  })
  const exited = new Promise<number | string | null>((resolve) =>
    child.on("exit", (code, signal) => resolve(signal ?? code))
  )
  return { child, exited, out: () => out }
}

/** Wait until `lines` prompts are consumed (or the run ended), then send `signal`; returns how the run ended. */
const signalAt = async (resume: boolean, lines: number, signal: NodeJS.Signals) => {
  const run = start(resume)
  let ended = false
  void run.exited.then(() => {
    ended = true
  })
  while (!ended && consumedCursors().length < lines) await new Promise((r) => setTimeout(r, 50))
  if (!ended) run.child.kill(signal)
  return { result: await run.exited, out: run.out() }
}

/** Running (a zombie waiting for its parent to reap it counts as gone). */
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
  } catch {
    return false
  }
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0] !== "Z"
  } catch {
    return true // no /proc: kill(0) is all we know
  }
}

describe("chaos", () => {
  it("trains every prompt once through crashes, hangs, garbage and kill -9, leaves nothing behind, and replays exactly", async () => {
    // five kill -9 at growing progress (a resume must train at least one more step before the next), one SIGTERM
    const kills = [2, 4, 6, 8, 10]
    for (const [i, lines] of kills.entries()) {
      const { result, out } = await signalAt(i > 0, lines, "SIGKILL")
      assert.strictEqual(result, "SIGKILL", `kill ${i + 1} came after the run ended (${result}):\n${out.slice(-3000)}`)
    }
    const term = await signalAt(true, 12, "SIGTERM")
    assert.strictEqual(term.result, 143, term.out.slice(-3000))
    assert.include(term.out, "SIGTERM: stopping after the current step")

    const final = start(true)
    const code = await final.exited
    assert.strictEqual(code, 0, final.out().slice(-3000))
    const summary = JSON.parse(
      final
        .out()
        .trim()
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .at(-1)!
    ) as {
      steps: number
    }
    assert.strictEqual(summary.steps, steps, "every step trained to the end")

    // every prompt trained exactly once, in cursor order
    assert.deepStrictEqual(
      consumedCursors(),
      Array.from({ length: steps * batch }, (_, i) => i)
    )

    // the faults happened, and every trajectory that ended in an error records why
    const faults = new Map<string, number>()
    const pids: Array<number> = []
    for (const line of readFileSync(chaosLog, "utf8")
      .split("\n")
      .filter((l) => l !== "")) {
      const [what, a, b] = line.split(" ")
      if (what === "start") pids.push(Number(a), Number(b))
      else faults.set(what!, (faults.get(what!) ?? 0) + 1)
    }
    for (const fault of ["crash", "hang", "malformed", "error", "long"]) {
      assert.isAbove(faults.get(fault) ?? 0, 0, `no ${fault} injected: ${JSON.stringify([...faults])}`)
    }
    const trajectories = readFileSync(join(runDir, "episodes.jsonl"), "utf8")
      .split("\n")
      .filter((l) => l !== "")
      .flatMap((l) => (JSON.parse(l) as { trajectories: Array<{ stopReason: string; error?: string }> }).trajectories)
    for (const t of trajectories) if (t.stopReason === "error") assert.isString(t.error)

    // nothing left behind: the servers and their grandchildren are gone (a killed trainer's too)
    const gone = Date.now() + 5000
    while (pids.some(alive) && Date.now() < gone) await new Promise((r) => setTimeout(r, 100))
    const left = pids.filter(alive)
    assert.deepStrictEqual(left, [], `processes left behind of ${pids.length} started`)

    // replay = run
    const replayed = Cli.run(
      [
        "replay",
        "--episodes",
        join(runDir, "episodes.jsonl"),
        "--config",
        config,
        "--run-dir",
        join(tmp, "replay"),
        ...kernels
      ],
      { timeoutMs: 300_000 }
    )
    assert.strictEqual(replayed.code, 0, replayed.stderr.slice(-3000))
    const replay = JSON.parse(replayed.lastLine) as { steps: number; checkpoint: string }
    assert.strictEqual(replay.steps, steps)
    assert.isTrue(existsSync(join(runDir, "checkpoints", `step-${steps}`, "model.safetensors")))
    assert.isTrue(
      readFileSync(join(replay.checkpoint, "model.safetensors")).equals(
        readFileSync(join(runDir, "checkpoints", `step-${steps}`, "model.safetensors"))
      ),
      "replay reproduces the run's weights"
    )
    // and its steps: each step's gradient norm (a step the crashes made the run train twice counts by its last line)
    const gradNorms = (dir: string) => {
      const byStep = new Map<number, unknown>()
      for (const line of readFileSync(join(dir, "metrics.jsonl"), "utf8").split("\n")) {
        if (line === "") continue
        const m = JSON.parse(line) as Record<string, unknown>
        if (m["event"] === "train") byStep.set(m["step"] as number, m["policy/grad_norm"])
      }
      return [...byStep.entries()].sort((a, b) => a[0] - b[0])
    }
    assert.strictEqual(gradNorms(runDir).length, steps)
    assert.deepStrictEqual(gradNorms(join(tmp, "replay")), gradNorms(runDir))
  }, 900_000)
})
