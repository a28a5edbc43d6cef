/**
 * Training from a recorded stream: the groups of an episode log, batched `train_batch_size` at a time into
 * `Trainer.step` — no sampling, no environments, no tool servers. The trainer is deterministic on a given backend,
 * so the same log and config give bit-identical weights. A torn last line of the log is skipped with a warning.
 *
 * Which groups, in which order (`recorded`): the episode log holds every group a run generated, in completion
 * order, including attempts that a crash lost before they were trained (a resumed run generates those prompts
 * again, so their later attempt is the one trained). The run's own record of what it trained is `consumed.jsonl`
 * beside the log (cursor and step of every prompt trained on, truncated on resume to the checkpoint's step): when it
 * is there, replay trains exactly its steps, each on the last attempt of each of its cursors, so it reproduces the
 * run's steps and weights. Without it (a log copied on its own or written by hand) the last attempt of each cursor
 * is trained in cursor order, which is the order both pipelines train in.
 */
import * as nodePath from "node:path"
import { Clock, Effect, type FileSystem, Stream } from "effect"
import type { RunConfig } from "../config/RunConfig.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import { Metrics } from "../metrics/Metrics.ts"
import { Checkpointer } from "../store/Checkpointer.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"
import { PolicyModel } from "../trainer/PolicyModel.ts"
import { Trainer } from "../trainer/Trainer.ts"
import * as ConsumedLog from "./ConsumedLog.ts"

/**
 * The groups a recorded run trained on, in the order it trained them (see the module comment): `consumed.jsonl`
 * beside the log selects and orders them when present. Fails naming both files when the consumed log names a cursor
 * the episode log does not hold.
 */
export const recorded = (
  file: string
): Effect.Effect<ReadonlyArray<TrajectoryGroup>, EpisodeLog.EpisodeLogError, FileSystem.FileSystem> =>
  Effect.gen(function* () {
    const latest = new Map<number, TrajectoryGroup>() // cursor → its last attempt
    yield* EpisodeLog.read(file).pipe(Stream.runForEach((g) => Effect.sync(() => latest.set(g.cursor, g))))
    const runDir = nodePath.dirname(file)
    const consumed = yield* ConsumedLog.read(runDir)
    if (consumed.length === 0) return [...latest.values()].sort((a, b) => a.cursor - b.cursor)
    const trained = [...consumed].sort((a, b) => a.step - b.step || a.cursor - b.cursor)
    const groups: Array<TrajectoryGroup> = []
    for (const line of trained) {
      const group = latest.get(line.cursor)
      if (group === undefined) {
        return yield* new EpisodeLog.EpisodeLogError({
          file,
          message:
            `${ConsumedLog.file(runDir)} says step ${line.step} trained prompt ${line.uid} (cursor ${line.cursor}), ` +
            "which this log does not hold: the log is not this run's (or was recorded with logging.record_episodes off)"
        })
      }
      groups.push(group)
    }
    return groups
  })

export interface Summary {
  readonly event: "summary"
  readonly steps: number
  readonly groups: number
  readonly seconds: number
  readonly runDir: string
  readonly checkpoint?: string
}

export const run = Effect.fn("ReplayPipeline.run")(function* <E, R>(
  config: RunConfig,
  runDir: string,
  groups: Stream.Stream<TrajectoryGroup, E, R>
) {
  const trainer = yield* Trainer
  const metrics = yield* Metrics
  const checkpointer = yield* Checkpointer
  const { model } = yield* PolicyModel
  const started = yield* Clock.currentTimeMillis
  const B = config.trainer.train_batch_size
  let steps = 0
  let seen = 0
  yield* groups.pipe(
    Stream.grouped(B),
    config.trainer.max_steps === undefined ? (s) => s : Stream.take(config.trainer.max_steps),
    Stream.runForEach((batch) =>
      Effect.gen(function* () {
        const result = yield* trainer.step(batch)
        steps = result.step
        seen += batch.length
        yield* metrics.record("train", result.step, { ...result.metrics, "trainer/policy_version": result.version })
        yield* metrics.progress({ step: result.step, totalSteps: result.step, values: result.metrics })
      })
    )
  )
  const saved =
    steps === 0 ? undefined : yield* checkpointer.save(steps, model, yield* trainer.state, { replayedGroups: seen })
  const summary: Summary = {
    event: "summary",
    steps,
    groups: seen,
    seconds: Math.round((((yield* Clock.currentTimeMillis) - started) / 1000) * 10) / 10,
    runDir,
    ...(saved === undefined ? {} : { checkpoint: saved.dir })
  }
  return summary
})
