import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import * as RunDirectory from "../../src/store/RunDirectory.ts"

/** Run `body` with its log lines (level and message) collected. */
const withLogs = <A, E>(body: (logs: Array<string>) => Effect.Effect<A, E>) => {
  const logs: Array<string> = []
  return body(logs).pipe(
    Effect.provide(Logger.layer([Logger.make((o) => void logs.push(`${o.logLevel}: ${String(o.message)}`))]))
  )
}

describe("RunDirectory.open", () => {
  it.effect("--resume latest in a directory that does not exist warns in one line naming it, then starts fresh", () =>
    withLogs((logs) =>
      Effect.gen(function* () {
        // a mistyped --run-dir
        const runDir = join(mkdtempSync(join(tmpdir(), "effect-rl-rundir-")), "runs", "quickstrat")
        const { resumeFrom } = yield* RunDirectory.open(runDir, "latest", "trainer: {}\n")
        assert.isUndefined(resumeFrom)
        const warnings = logs.filter((l) => l.startsWith("Warn: "))
        assert.deepStrictEqual(warnings, [
          `Warn: --resume latest: no checkpoint in ${runDir} (no such directory): starting a fresh run there`
        ])
        assert.isTrue(existsSync(join(runDir, RunDirectory.configFile)))
      })
    )
  )

  it.effect("--resume latest in a run without a checkpoint says so before it moves that run to earlier/", () =>
    withLogs((logs) =>
      Effect.gen(function* () {
        const runDir = mkdtempSync(join(tmpdir(), "effect-rl-rundir-"))
        writeFileSync(join(runDir, RunDirectory.configFile), "trainer: {}\n")
        writeFileSync(join(runDir, RunDirectory.metricsFile), '{"event":"train","step":1}\n')
        mkdirSync(join(runDir, "checkpoints")) // killed before its first checkpoint
        yield* RunDirectory.open(runDir, "latest", "trainer: {}\n")
        const warning = logs.findIndex((l) =>
          l.includes(`--resume latest: no checkpoint in ${runDir} (it holds none yet): starting a fresh run there`)
        )
        const moved = logs.findIndex((l) => l.includes("held an earlier run: moved it to"))
        assert.isAtLeast(warning, 0)
        assert.isAbove(moved, warning)
        assert.isFalse(existsSync(join(runDir, RunDirectory.metricsFile)))
      })
    )
  )

  it.effect("a fresh run (no --resume) gives no such warning", () =>
    withLogs((logs) =>
      Effect.gen(function* () {
        const runDir = join(mkdtempSync(join(tmpdir(), "effect-rl-rundir-")), "new")
        yield* RunDirectory.open(runDir, undefined, "trainer: {}\n")
        assert.isFalse(logs.some((l) => l.includes("no checkpoint")))
      })
    )
  )
})
