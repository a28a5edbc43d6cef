/**
 * `train --config FILE [--run-dir DIR] [--resume latest|PATH] [key.path=value ...]`: the GRPO/PPO loop, synchronous
 * (SyncSource) or fully async (AsyncSource, `pipeline.mode: async`), in the one TrainingLoop. Writes the run directory (config.yaml, metrics.jsonl, episodes.jsonl, consumed.jsonl,
 * checkpoints/) and ends with one JSON summary line on stdout:
 * `{"event":"summary","steps":…,"seconds":…,"runDir":…,"evalBefore":{…},"evalAfter":{…}}`.
 * A fresh run (no resume) into a directory that holds an earlier run first moves that run's files to
 * `<run dir>/earlier/<its start time>/`: appending to them would mix two runs' steps in metrics, episodes and report.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Console, Effect, Option, Schema, Stream } from "effect"
import { Command, Flag } from "effect/cli"
import * as RunLayers from "../../layers/RunLayers.ts"
import * as ConfigView from "../config/ConfigView.ts"
import { RunConfig } from "../config/RunConfig.ts"
import * as Dataset from "../data/Dataset.ts"
import { CheckpointError, ConfigError } from "../domain/Errors.ts"
import * as Metrics from "../metrics/Metrics.ts"
import * as Report from "../metrics/Report.ts"
import * as Pipelines from "../pipeline/Pipelines.ts"
import * as Checkpointer from "../store/Checkpointer.ts"
import * as ConsumedLog from "../store/ConsumedLog.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"
import * as RunFlags from "./RunFlags.ts"

/**
 * The rows of `files` that `include` keeps (`data.include`), the first `max` of them (`data.max_prompts`,
 * `data.max_eval_prompts`). A filter that keeps none of a non-empty set is a config error.
 */
export const readRows = Effect.fn("cli.readRows")(function* (
  files: ReadonlyArray<string>,
  max?: number,
  include?: Dataset.Include
) {
  const kept = yield* Dataset.readAll(files).pipe(
    include === undefined ? (s) => s : Stream.filter(Dataset.isIncluded(include)),
    max === undefined ? (s) => s : Stream.take(max),
    Stream.runCollect
  )
  if (kept.length === 0 && include !== undefined) {
    // only to name how many rows the filter saw
    const all = yield* Stream.runCount(Dataset.readAll(files))
    if (all > 0) {
      return yield* new ConfigError({
        path: "data.include",
        message: `data.include ${JSON.stringify(include)} keeps none of the ${all} rows of ${files.join(", ")}`
      })
    }
  }
  return kept
})

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

const configFile = "config.yaml"

/** What a run writes into its directory. */
const runEntries = [
  configFile,
  Metrics.fileName,
  EpisodeLog.fileName,
  ConsumedLog.fileName,
  Checkpointer.dirName,
  Report.fileName
]

const statOf = (file: string) => fs.stat(file).catch(() => undefined)

/**
 * Moves an earlier run's files out of the way of a fresh run: to `<run dir>/earlier/<stamp>/`, the stamp being the
 * earlier run's start (its config.yaml's modification time). Returns that directory, or undefined when the run
 * directory holds no run. Other files in the directory are left where they are.
 */
export const archiveEarlierRun = (runDir: string) =>
  Effect.tryPromise(async () => {
    const present: Array<string> = []
    for (const name of runEntries) if ((await statOf(path.join(runDir, name))) !== undefined) present.push(name)
    if (present.length === 0) return undefined
    const started = (await statOf(path.join(runDir, configFile)))?.mtime ?? new Date()
    const stamp = started.toISOString().slice(0, 19).replaceAll(":", "-") // 2026-11-22T07-55-03
    let target = path.join(runDir, "earlier", stamp)
    for (let n = 2; (await statOf(target)) !== undefined; n++) target = path.join(runDir, "earlier", `${stamp}-${n}`)
    await fs.mkdir(target, { recursive: true })
    for (const name of present) await fs.rename(path.join(runDir, name), path.join(target, name))
    return target
  }).pipe(Effect.orDie)

export const command = Command.make(
  "train",
  {
    config: RunFlags.config,
    runDir: Flag.String("run-dir").pipe(Flag.withDescription("Run directory (default logging.run_dir)"), Flag.optional),
    resume: Flag.String("resume").pipe(
      Flag.withDescription("Continue from a checkpoint: latest (of the run directory) or a checkpoint path"),
      Flag.optional
    ),
    overrides: RunFlags.overrides
  },
  Effect.fn("cli.train")(function* ({ config: file, runDir: runDirFlag, resume: resumeFlag, overrides }) {
    const config = yield* RunFlags.load(file, overrides)
    const runDir = Option.getOrElse(runDirFlag, () => config.logging.run_dir)
    const resume = Option.getOrUndefined(resumeFlag) ?? config.checkpoint.resume
    if (config.data.train.length === 0) {
      return yield* new ConfigError({ file, path: "data.train", message: "data.train: no training files given" })
    }
    const train = yield* readRows(config.data.train, config.data.max_prompts, config.data.include)
    const val = yield* readRows(config.data.val, config.data.max_eval_prompts, config.data.include)
    const resumeFrom = resume === undefined ? undefined : yield* resolveResume(runDir, resume)
    if (resume !== undefined && resumeFrom === undefined)
      yield* Effect.logInfo(`no checkpoint in ${runDir} yet: starting fresh`)
    if (resumeFrom === undefined) {
      const moved = yield* archiveEarlierRun(runDir)
      if (moved !== undefined) {
        yield* Effect.logInfo(
          `${runDir} held an earlier run: moved it to ${moved} (train --resume latest continues a run instead)`
        )
      }
    }
    yield* Effect.tryPromise(async () => {
      await fs.mkdir(runDir, { recursive: true })
      const encoded = Schema.encodeSync(RunConfig)(config)
      await fs.writeFile(path.join(runDir, configFile), `${ConfigView.toYaml(ConfigView.redact(encoded))}\n`)
    }).pipe(Effect.orDie)
    yield* Effect.logInfo(`training on ${train.length} prompts (${val.length} held out) → ${runDir}`)
    const summary = yield* Pipelines.train({
      config,
      runDir,
      train,
      val,
      ...(resumeFrom === undefined ? {} : { resumeFrom })
    }).pipe(
      Effect.provide(
        RunLayers.training(config, {
          runDir,
          trainRows: train.length,
          ...(resumeFrom === undefined ? {} : { resumeFrom })
        })
      )
    )
    if (config.logging.report) {
      // the run is done and saved: a report that cannot be built is a warning, never a failed run
      yield* Report.write(runDir).pipe(
        Effect.tap((r) => Effect.logInfo(`report ${r.file} (${Math.round(r.bytes / 1024)} KiB)`)),
        Effect.catchCause((cause) => Effect.logWarning("report not written", cause))
      )
    }
    const before = summary.evalBefore?.["all"]
    const after = summary.evalAfter?.["all"]
    if (before !== undefined && after !== undefined) {
      yield* Console.error(
        `held-out avg_score ${before.avg_score.toFixed(3)} → ${after.avg_score.toFixed(3)}, ` +
          `pass@n ${before.pass_at_n.toFixed(3)} → ${after.pass_at_n.toFixed(3)} (${summary.steps} steps, ${summary.seconds} s; ${runDir})`
      )
    }
    yield* Console.log(JSON.stringify(summary))
  })
).pipe(Command.withDescription("Train a policy with GRPO/PPO on a run config"))
