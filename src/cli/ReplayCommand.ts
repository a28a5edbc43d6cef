/**
 * `replay --episodes RUN/episodes.jsonl --config FILE [--run-dir DIR] [key.path=value ...]`: train from a recorded
 * episode log (ReplaySource in the TrainingLoop): no sampling, no tool servers; the same log and config give bit-identical weights.
 * Ends with `{"event":"summary","steps":…,"groups":…,"seconds":…,"runDir":…,"checkpoint":…}` on stdout.
 */
import { Console, Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as RunLayers from "../layers/RunLayers.ts"
import * as Pipelines from "../pipeline/Pipelines.ts"
import * as ReplaySource from "../pipeline/ReplaySource.ts"
import * as RunFlags from "./RunFlags.ts"

export const command = Command.make(
  "replay",
  {
    episodes: Flag.File("episodes", { mustExist: true }).pipe(Flag.withDescription("A recorded episodes.jsonl")),
    config: RunFlags.config,
    runDir: Flag.String("run-dir").pipe(
      Flag.withDescription("Where to write (default logging.run_dir)"),
      Flag.optional
    ),
    overrides: RunFlags.overrides
  },
  Effect.fn("cli.replay")(function* ({ episodes, config: file, runDir: runDirFlag, overrides }) {
    const config = yield* RunFlags.load(file, overrides)
    const runDir = Option.getOrElse(runDirFlag, () => config.logging.run_dir)
    const groups = yield* ReplaySource.recorded(episodes)
    const totalSteps = ReplaySource.totalSteps(config.trainer, groups.length)
    yield* Effect.logInfo(`replaying ${groups.length} groups from ${episodes} → ${runDir}`)
    const summary = yield* Pipelines.replay(config, runDir, groups).pipe(
      Effect.provide(RunLayers.replay(config, { runDir, totalSteps: Math.max(1, totalSteps) }))
    )
    yield* Console.log(JSON.stringify(summary))
  })
).pipe(
  Command.withDescription("Train from a recorded episode log, with no sampling and no tool servers"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --config configs/quickstart.yaml --episodes runs/quickstart/episodes.jsonl --run-dir runs/replayed`,
      description: "train again from the quickstart run's recorded groups"
    }
  ])
)
