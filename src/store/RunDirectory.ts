/**
 * The run directory: the one owner of which files a run writes there, how a fresh run moves an earlier run out of
 * the way, and which checkpoint `--resume` continues from.
 *
 *   config.yaml        the resolved config (secrets redacted)
 *   metrics.jsonl      Metrics: one line per step and per eval
 *   episodes.jsonl     EpisodeLog: every trajectory group, fsync'd per group
 *   consumed.jsonl     ConsumedLog: every prompt trained on, with its step
 *   checkpoints/       Checkpointer: step-N/ directories and `latest`
 *   report.html        Report
 *   rollout-requests.jsonl  RolloutRequests: the cluster requests the trainer sent (Postgres storage only)
 *   earlier/<start>/   the files of earlier runs into the same directory
 *
 * A fresh run (no resume) into a directory that holds an earlier run first moves that run's files to
 * `earlier/<its start time>/`: appending to them would mix two runs' steps in metrics, episodes and report.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect } from "effect"
import { CheckpointError } from "../domain/Errors.ts"
import * as Checkpointer from "./Checkpointer.ts"
import * as ConsumedLog from "./ConsumedLog.ts"
import * as EpisodeLog from "./EpisodeLog.ts"
import * as RolloutRequests from "./RolloutRequests.ts"

export const configFile = "config.yaml"
export const metricsFile = "metrics.jsonl"
export const reportFile = "report.html"
export const earlierDir = "earlier"

/** What a run writes into its directory (and moves to `earlier/` when a fresh run starts there). */
export const entries: ReadonlyArray<string> = [
  configFile,
  metricsFile,
  EpisodeLog.fileName,
  ConsumedLog.fileName,
  Checkpointer.dirName,
  reportFile,
  RolloutRequests.fileName
]

/**
 * `latest` → the checkpoint of the run directory to continue from (`Checkpointer.resumeLatest`: what
 * `checkpoints/latest` names, else the newest complete step; undefined when there is none); a path → itself.
 */
export const resolveResume = (runDir: string, which: string): Effect.Effect<string | undefined, CheckpointError> =>
  which === "latest"
    ? Checkpointer.resumeLatest(runDir)
    : Effect.tryPromise({
        try: async () => {
          await fs.access(path.join(which, "trainer_state.json"))
          return which
        },
        catch: () => new CheckpointError({ path: which, message: "not a checkpoint directory (no trainer_state.json)" })
      })

const statOf = (file: string) => fs.stat(file).catch(() => undefined)

/**
 * Moves an earlier run's files out of the way of a fresh run: to `<run dir>/earlier/<stamp>/`, the stamp being the
 * earlier run's start (its config.yaml's modification time). Returns that directory, or undefined when the run
 * directory holds no run. Other files in the directory are left where they are.
 */
export const archiveEarlierRun = (runDir: string) =>
  Effect.tryPromise(async () => {
    const present: Array<string> = []
    for (const name of entries) if ((await statOf(path.join(runDir, name))) !== undefined) present.push(name)
    if (present.length === 0) return undefined
    const started = (await statOf(path.join(runDir, configFile)))?.mtime ?? new Date()
    const stamp = started.toISOString().slice(0, 19).replaceAll(":", "-") // 2026-11-22T07-55-03
    let target = path.join(runDir, earlierDir, stamp)
    for (let n = 2; (await statOf(target)) !== undefined; n++) target = path.join(runDir, earlierDir, `${stamp}-${n}`)
    await fs.mkdir(target, { recursive: true })
    for (const name of present) await fs.rename(path.join(runDir, name), path.join(target, name))
    return target
  }).pipe(Effect.orDie)

/** Write the run's resolved config (`config.yaml`, already rendered and redacted by the caller). */
export const writeConfig = (runDir: string, yaml: string) =>
  Effect.tryPromise(async () => {
    await fs.mkdir(runDir, { recursive: true })
    await fs.writeFile(path.join(runDir, configFile), yaml)
  }).pipe(Effect.orDie)

/** `--resume latest` found no checkpoint in `runDir`: one warning line, naming it, that the run starts fresh. */
const warnFresh = (runDir: string) =>
  Effect.flatMap(
    Effect.promise(() => statOf(runDir)),
    (stat) => {
      const why = stat?.isDirectory() === true ? "it holds none yet" : "no such directory"
      return Effect.logWarning(`--resume latest: no checkpoint in ${runDir} (${why}): starting a fresh run there`)
    }
  )

/**
 * Open a run directory for training: the checkpoint to continue from (`resume`: `latest` or a path; undefined =
 * fresh; `latest` with no checkpoint there starts fresh with a warning naming the directory), an earlier run moved to
 * `earlier/` when starting fresh, and the resolved config written.
 */
export const open = Effect.fn("RunDirectory.open")(function* (
  runDir: string,
  resume: string | undefined,
  configYaml: string
) {
  const resumeFrom = resume === undefined ? undefined : yield* resolveResume(runDir, resume)
  // a mistyped --run-dir must not train from scratch unnoticed: one warning names the directory, before anything moves
  if (resume !== undefined && resumeFrom === undefined) yield* warnFresh(runDir)
  if (resumeFrom === undefined) {
    const moved = yield* archiveEarlierRun(runDir)
    if (moved !== undefined) {
      yield* Effect.logInfo(
        `${runDir} held an earlier run: moved it to ${moved} (train --resume latest continues a run instead)`
      )
    }
  }
  yield* writeConfig(runDir, configYaml)
  return { resumeFrom }
})
