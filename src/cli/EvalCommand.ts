/**
 * `eval --config FILE [--model DIR] [key.path=value ...]`: score a policy on the held-out data (`data.val`) with the
 * eval sampling settings. `--model` takes a checkpoint directory, a run directory (its latest checkpoint) or a
 * `checkpoints/latest` pointer file. A LoRA run's checkpoint (or any PEFT adapter directory) is evaluated over its base:
 * the model its `adapter_config.json` names (`base_model_name_or_path`), else the config's `model`. `trainer.eval_group_by: KEY` adds a line per value of the rows' `extra_info.KEY`.
 * Prints per-source lines and, as the last stdout line, the JSON report
 * `{"event":"eval","report":{"<source>":{"avg_score":…,"pass_at_n":…,"prompts":…},"all":{…}}}`.
 * `--episodes-dir DIR` also writes every eval trajectory group to `DIR/episodes.jsonl` (the run directory's episode
 * format, so `report` and the trajectory viewer read it), to see what the policy does on each held-out task.
 */
import { Console, Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import type { RunConfig } from "../config/RunConfig.ts"
import { CheckpointError, ConfigError } from "../domain/Errors.ts"
import * as RunLayers from "../layers/RunLayers.ts"
import * as Lora from "../model/Lora.ts"
import * as Evaluator from "../pipeline/Evaluator.ts"
import * as Checkpointer from "../store/Checkpointer.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"
import * as RunFlags from "./RunFlags.ts"
import { readRows } from "./TrainCommand.ts"

/** The config with `model.lora` set to the adapter's own options and `model` its base when the adapter names one. */
const withAdapter = (config: RunConfig, adapter: Checkpointer.AdapterSource) =>
  Effect.tryPromise({
    try: async (): Promise<RunConfig> => {
      const weights = await Lora.readDir(adapter.adapterDir)
      const lora = {
        ...config.model.lora,
        rank: weights.rank,
        alpha: weights.alpha,
        dropout: weights.dropout,
        target_modules: [...weights.targetModules]
      }
      const model = adapter.base === undefined ? { ...config.model, lora } : { path: adapter.base, lora }
      return { ...config, model }
    },
    catch: (cause) =>
      new CheckpointError({
        path: adapter.adapterDir,
        message: cause instanceof Error ? cause.message : String(cause)
      })
  })

export const command = Command.make(
  "eval",
  {
    config: RunFlags.config,
    model: Flag.String("model").pipe(
      Flag.withDescription(
        "A model to evaluate instead of model.*: a checkpoint directory, a run directory (its latest checkpoint), a checkpoints/latest file, or a LoRA adapter (PEFT directory or LoRA run checkpoint) over its base"
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
    // a LoRA run's checkpoint or a PEFT directory: the adapter over its base (the one it names, else model.*)
    const adapter =
      modelDir === undefined ? undefined : yield* Effect.promise(() => Checkpointer.adapterSourceOf(modelDir))
    const config =
      modelDir === undefined
        ? loaded
        : adapter === undefined
          ? { ...loaded, model: { path: modelDir, lora: loaded.model.lora } }
          : yield* withAdapter(loaded, adapter)
    if (config.data.val.length === 0) {
      return yield* new ConfigError({ file, path: "data.val", message: "data.val: no held-out files to evaluate on" })
    }
    const val = yield* readRows(config.data.val, config.data.max_eval_prompts, config.data.include)
    const { report, groups } = yield* Evaluator.run(
      val,
      Evaluator.optionsOf(config),
      config.trainer.eval_group_by
    ).pipe(
      Effect.provide(
        RunLayers.training(config, {
          runDir: config.logging.run_dir,
          trainRows: 0,
          ...(adapter === undefined ? {} : { adapterDir: adapter.adapterDir })
        })
      )
    )
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
).pipe(
  Command.withDescription("Evaluate a policy on the held-out data"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --config configs/quickstart.yaml --model runs/quickstart`,
      description: "the quickstart run's latest checkpoint on the held-out tasks"
    }
  ])
)
