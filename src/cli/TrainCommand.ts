/**
 * `train --config FILE [--run-dir DIR] [--resume latest|PATH] [key.path=value ...]`: the GRPO/PPO loop, synchronous
 * (SyncSource) or fully async (AsyncSource, `pipeline.mode: async`), in the one TrainingLoop. Writes the run directory (config.yaml, metrics.jsonl, episodes.jsonl, consumed.jsonl,
 * checkpoints/) and ends with one JSON summary line on stdout:
 * `{"event":"summary","steps":…,"seconds":…,"runDir":…,"evalBefore":{…},"evalAfter":{…}}`.
 * The run directory's files, archiving and resume resolution: RunDirectory.
 */
import { Cause, Console, Effect, Option, Schema, Stream } from "effect"
import { Command, Flag } from "effect/cli"
import * as ConfigView from "../config/ConfigView.ts"
import { RunConfig } from "../config/RunConfig.ts"
import * as Dataset from "../data/Dataset.ts"
import { ConfigError } from "../domain/Errors.ts"
import * as GroupJudge from "../env/GroupJudge.ts"
import * as ClusterLayers from "../layers/ClusterLayers.ts"
import * as Report from "../metrics/Report.ts"
import * as Pipelines from "../pipeline/Pipelines.ts"
import * as RunDirectory from "../store/RunDirectory.ts"
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
    const rows = yield* readRows(config.data.train, config.data.max_prompts, config.data.include)
    // environment.judge.apply_to all_train_rows: the judge scores every training row (held-out rows keep theirs)
    const train = config.environment.judge?.apply_to === "all_train_rows" ? GroupJudge.asJudgeRows(rows) : rows
    const val = yield* readRows(config.data.val, config.data.max_eval_prompts, config.data.include)
    const { resumeFrom } = yield* RunDirectory.open(
      runDir,
      resume,
      `${ConfigView.toYaml(ConfigView.forRunDirectory(Schema.encodeSync(RunConfig)(config)))}\n`
    )
    yield* Effect.logInfo(`training on ${train.length} prompts (${val.length} held out) → ${runDir}`)
    const summary = yield* Pipelines.train({
      config,
      runDir,
      train,
      val,
      ...(resumeFrom === undefined ? {} : { resumeFrom })
    }).pipe(
      Effect.provide(
        ClusterLayers.training(config, {
          runDir,
          trainRows: train.length,
          tracking: true,
          ...(resumeFrom === undefined ? {} : { resumeFrom })
        })
      )
    )
    if (config.logging.report) {
      // the run is done and saved: a report that cannot be built is a warning, never a failed run
      yield* Report.write(runDir).pipe(
        Effect.tap((r) => Effect.logInfo(`report ${r.file} (${Math.round(r.bytes / 1024)} KiB)`)),
        Effect.catchCause((cause) => {
          const error = Cause.squash(cause)
          return Effect.logWarning(`report not written: ${error instanceof Error ? error.message : String(error)}`)
        })
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
    if (summary.stopped !== undefined && summary.checkpoint !== undefined) {
      const quote = (arg: string) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", "'\\''")}'`)
      const resumeCommand = [
        "node dist/main.js train --config",
        quote(file),
        "--run-dir",
        quote(runDir),
        ...overrides.map(quote),
        "--resume latest"
      ].join(" ")
      yield* Console.error(
        `stopped after step ${summary.steps} (${summary.checkpoint}); continue with:\n  ${resumeCommand}`
      )
    }
    yield* Console.log(JSON.stringify(summary))
  })
).pipe(
  Command.withDescription("Train a policy with GRPO/PPO on a run config"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --config configs/quickstart.yaml --run-dir runs/my-run trainer.max_steps=50`,
      description: "50 steps of the quickstart into runs/my-run (add --resume latest to continue it)"
    }
  ])
)
