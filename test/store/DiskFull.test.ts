/**
 * Every writer of a run on a full disk (a tmpfs mounted for the test and filled to the last byte; skipped where this
 * process may not mount one): each fails with a DiskFullError naming its own file, as a typed failure or as the defect
 * that stops a run (the CLI prints it in one line, src/main.ts), and leaves nothing half-written behind. And the
 * recognition itself: Node's ENOSPC/EDQUOT under Effect's PlatformError, found with the file the chain names.
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Exit, PlatformError } from "effect"
import * as DiskFull from "../../src/domain/DiskFull.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import type { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Metrics from "../../src/metrics/Metrics.ts"
import * as Report from "../../src/metrics/Report.ts"
import * as ConsumedLog from "../../src/store/ConsumedLog.ts"
import * as EpisodeLog from "../../src/store/EpisodeLog.ts"
import * as FileWeightSync from "../../src/sync/FileWeightSync.ts"
import * as Tmpfs from "../fixtures/Tmpfs.ts"
import * as TrajectoryFixtures from "../fixtures/Trajectories.ts"

/** The DiskFullError an exit failed or died with. */
const diskFullOf = (exit: Exit.Exit<unknown, unknown>): DiskFull.DiskFullError | undefined => {
  if (!Exit.isFailure(exit)) return undefined
  for (const reason of exit.cause.reasons) {
    const error = Cause.isFailReason(reason) ? reason.error : Cause.isDieReason(reason) ? reason.defect : undefined
    if (error instanceof DiskFull.DiskFullError) return error
  }
  return undefined
}

const writers = (dir: string) =>
  Effect.gen(function* () {
    const runDir = join(dir, "run")
    mkdirSync(runDir)
    const trajectory = TrajectoryFixtures.oneTurn({
      uid: "p0",
      sample: 0,
      prompt: [1, 2, 3],
      response: [4, 5],
      reward: 1,
      rolloutLogprob: -0.5
    })
    const group: TrajectoryGroup = {
      promptUid: "p0",
      cursor: 0,
      dataSource: "toolbox",
      envClass: "mcp_tool",
      trajectories: [trajectory]
    }
    // files that exist before the disk fills (a run's metrics.jsonl, before its report)
    // one whole page (tmpfs allocates by the page: an append into a part-filled last page would still find room)
    const line = JSON.stringify({ event: "train", step: 1, time: 1 })
    writeFileSync(join(runDir, Metrics.fileName), `${line}${" ".repeat(4096 - line.length - 1)}\n`)
    const episodes = yield* EpisodeLog.make(runDir)
    const metrics = yield* Metrics.make(runDir, { progress: false })
    Tmpfs.fill(join(dir, "filler"))

    const episode = diskFullOf(yield* Effect.exit(episodes.append(group)))
    assert.strictEqual(episode?.file, join(runDir, EpisodeLog.fileName))

    const consumed = diskFullOf(yield* Effect.exit(ConsumedLog.append(runDir, 1, [group])))
    assert.strictEqual(consumed?.file, ConsumedLog.file(runDir))

    const metric = diskFullOf(yield* Effect.exit(metrics.record("train", 2, { "reward/avg_raw_reward": 0.5 })))
    assert.strictEqual(metric?.file, join(runDir, Metrics.fileName))

    const report = diskFullOf(yield* Effect.exit(Report.refresh(runDir)))
    assert.strictEqual(report?.file, join(runDir, Report.fileName))

    const weights = join(dir, "weights")
    const sync = FileWeightSync.make({ dir: weights })
    const version = PolicyVersion.make(1)
    const snapshot = { version, names: ["w"], shapes: [[256, 256]], data: [new Float32Array(256 * 256)] }
    const published = diskFullOf(yield* Effect.exit(sync.publish({ version, snapshot: Effect.succeed(snapshot) })))
    assert.strictEqual(published?.file, weights)
    // nothing half-written: no temporary files anywhere
    const names = (d: string): Array<string> =>
      readdirSync(d, { withFileTypes: true }).flatMap((e) =>
        e.isDirectory() ? [e.name, ...names(join(d, e.name))] : [e.name]
      )
    assert.deepStrictEqual(
      names(dir).filter((n) => n.includes(".tmp") || n.startsWith(".LATEST")),
      []
    )
    assert.isFalse(existsSync(join(runDir, `${Report.fileName}.${process.pid}.tmp`)))
  })

describe("DiskFull", () => {
  it("finds ENOSPC and EDQUOT under Effect's PlatformError, naming the file the chain names", () => {
    const enospc = Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" })
    const wrapped = PlatformError.systemError({
      _tag: "Unknown",
      module: "FileSystem",
      method: "writeFile",
      pathOrDescriptor: "/runs/x/metrics.jsonl",
      cause: enospc
    })
    assert.isTrue(DiskFull.is(wrapped))
    assert.strictEqual(DiskFull.find(wrapped)?.file, "/runs/x/metrics.jsonl")
    assert.strictEqual(
      DiskFull.find(wrapped)?.message,
      "no space left on the device writing /runs/x/metrics.jsonl: free space, then train --resume latest"
    )
    assert.isTrue(DiskFull.is(Object.assign(new Error("quota"), { code: "EDQUOT" })))
    assert.isFalse(DiskFull.is(Object.assign(new Error("denied"), { code: "EACCES" })))
    assert.isUndefined(DiskFull.find(new Error("something else")))
    const mapped = DiskFull.orElse("/runs/x/consumed.jsonl", () => "other")
    assert.strictEqual((mapped(enospc) as DiskFull.DiskFullError).file, "/runs/x/consumed.jsonl")
    assert.strictEqual(mapped(new Error("x")), "other")
  })

  describe.skipIf(!Tmpfs.canMount)("every writer of a run on a full tmpfs", () => {
    it.effect(
      "episode log, consumed log, metrics, report and weight-sync files: a DiskFullError naming each file",
      () =>
        Effect.suspend(() => {
          const dir = mkdtempSync(join(tmpdir(), "effect-rl-writers-full-"))
          assert.isTrue(Tmpfs.mount(dir, 4 << 20))
          return writers(dir).pipe(
            Effect.scoped, // the episode log's handle closes before the unmount
            Effect.ensuring(
              Effect.sync(() => {
                Tmpfs.unmount(dir)
                rmSync(dir, { recursive: true, force: true })
              })
            ),
            Effect.provide(NodeServices.layer)
          )
        })
    )
  })
})
