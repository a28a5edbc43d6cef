/**
 * The recorded group source: the groups of an episode log, `train_batch_size` at a time — no sampling, no
 * environments, no tool servers. The trainer is deterministic on a given backend, so the same log and config give
 * bit-identical weights. A torn last line of the log is skipped with a warning.
 *
 * Which groups, in which order (`recorded`): the episode log holds every group a run generated, in completion
 * order, including attempts that a crash lost before they were trained (a resumed run generates those prompts
 * again, so their later attempt is the one trained). The run's own record of what it trained is `consumed.jsonl`
 * beside the log (cursor and step of every prompt trained on, truncated on resume to the checkpoint's step): when it
 * is there, replay trains exactly its steps, each on the last attempt of each of its cursors, so it reproduces the
 * run's steps and weights. Without it (a log copied on its own or written by hand) the last attempt of each cursor
 * is trained in cursor order, which is the order both rollout sources train in.
 */
import * as nodePath from "node:path"
import { Clock, Effect, type FileSystem, Stream } from "effect"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import * as ConsumedLog from "../store/ConsumedLog.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"
import type * as TrainingLoop from "./TrainingLoop.ts"

/**
 * The groups a recorded run trained on, in the order it trained them (see the module comment): `consumed.jsonl`
 * beside the log selects and orders them when present. Fails naming both files when the consumed log names a cursor
 * the episode log does not hold.
 */
export const recorded = (
  file: string
): Effect.Effect<
  ReadonlyArray<TrajectoryGroup>,
  EpisodeLog.EpisodeLogError | ConsumedLog.ConsumedLogError,
  FileSystem.FileSystem
> =>
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

/** Steps a replay of `groups` groups trains: every batch (a partial last one too), at most `max_steps`. */
export const totalSteps = (trainer: TrainingLoop.StepCount, groups: number): number => {
  const byData = Math.ceil(groups / trainer.train_batch_size)
  return trainer.max_steps === undefined ? byData : Math.min(trainer.max_steps, byData)
}

export const make = (
  trainer: TrainingLoop.StepCount,
  groups: ReadonlyArray<TrajectoryGroup>
): Effect.Effect<TrainingLoop.Source> =>
  Effect.sync(() => {
    const B = trainer.train_batch_size
    let replayed = 0
    const source: TrainingLoop.Source = {
      totalSteps: totalSteps(trainer, groups.length),
      batches: Stream.unfold(1, (step) =>
        (step - 1) * B >= groups.length
          ? Effect.succeed(undefined)
          : Clock.currentTimeMillis.pipe(
              Effect.map((startedAt) => {
                const batch: TrainingLoop.Batch = {
                  step,
                  groups: groups.slice((step - 1) * B, step * B),
                  metrics: {},
                  startedAt
                }
                return [batch, step + 1] as const
              })
            )
      ),
      guard: (train) => train,
      trained: (step) =>
        Effect.sync(() => {
          replayed = Math.min(groups.length, step * B)
          return {}
        }),
      close: Effect.void,
      checkpoint: () => Effect.sync(() => ({ data: { replayedGroups: replayed }, inflight: 0 }))
    }
    return source
  })
