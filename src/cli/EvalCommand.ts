/**
 * `eval --config FILE [--model DIR] [key.path=value ...]`: score a policy on the held-out data (`data.val`) with the
 * eval sampling settings. `--model` takes a checkpoint directory, a run directory (its latest checkpoint) or a
 * `checkpoints/latest` pointer file. `trainer.eval_group_by: KEY` adds a line per value of the rows' `extra_info.KEY`.
 * Prints per-source lines and, as the last stdout line, the JSON report
 * `{"event":"eval","report":{"<source>":{"avg_score":…,"pass_at_n":…,"prompts":…},"all":{…}}}`.
 * `--episodes-dir DIR` also writes every eval trajectory group to `DIR/episodes.jsonl` (the run directory's episode
 * format, so `report` and the trajectory viewer read it), to see what the policy does on each held-out task.
 */
import { Console, Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as RunLayers from "../layers/RunLayers.ts"
import { ConfigError } from "../domain/Errors.ts"
import * as Evaluator from "../pipeline/Evaluator.ts"
import * as Checkpointer from "../store/Checkpointer.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"
import * as RunFlags from "./RunFlags.ts"
import { readRows } from "./TrainCommand.ts"

export const command = Command.make(
  "eval",
  {
    config: RunFlags.config,
    model: Flag.String("model").pipe(
      Flag.withDescription(
        "A model to evaluate instead of model.*: a checkpoint directory, a run directory (its latest checkpoint) or a checkpoints/latest file"
      ),
      Flag.optional
    ),
    episodesDir: Flag.String("episodes-dir").pipe(
      Flag.withDescription("Write the eval trajectories to DIR/episodes.jsonl"),
      Flag.optional
    ),
    overrides: RunFlags.overrides
  },
  Effect.fn("cli.eval")(function* ({ config: file, model, episodesDir, overrides }) {
    const loaded = yield* RunFlags.load(file, overrides)
    const modelDir = Option.isNone(model)
      ? undefined
      : yield* Effect.promise(() => Checkpointer.resolveModelDir(model.value))
    const config = modelDir === undefined ? loaded : { ...loaded, model: { path: modelDir, lora: loaded.model.lora } }
    if (config.data.val.length === 0) {
      return yield* new ConfigError({ file, path: "data.val", message: "data.val: no held-out files to evaluate on" })
    }
    const val = yield* readRows(config.data.val, config.data.max_eval_prompts, config.data.include)
    const { report, groups } = yield* Evaluator.run(
      val,
      Evaluator.optionsOf(config),
      config.trainer.eval_group_by
    ).pipe(Effect.provide(RunLayers.training(config, { runDir: config.logging.run_dir, trainRows: 0 })))
    if (Option.isSome(episodesDir)) {
      const file = yield* Effect.scoped(
        Effect.gen(function* () {
          const log = yield* EpisodeLog.make(episodesDir.value)
          for (const group of groups) yield* log.append(group)
          return log.file
        })
      )
      yield* Console.error(`eval: ${groups.length} groups written to ${file}`)
    }
    for (const [source, s] of Object.entries(report)) {
      yield* Console.log(
        `${source}: avg_score ${s.avg_score.toFixed(3)}, pass@n ${s.pass_at_n.toFixed(3)} (${s.prompts} prompts)`
      )
    }
    yield* Console.log(JSON.stringify({ event: "eval", report }))
  })
).pipe(Command.withDescription("Evaluate a policy on the held-out data"))
