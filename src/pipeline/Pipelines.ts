/**
 * The training loop with each of its sources, as the commands run them: `train` (sync or async rollouts, by
 * `pipeline.mode`) and `replay` (a recorded episode log). The one place the pipeline's config slices are cut from the
 * run config (TrainingLoop.settingsOf, Rollouts.settingsOf).
 */
import { Effect } from "effect"
import { RolloutClient } from "../cluster/RolloutClient.ts"
import type { RunConfig } from "../config/RunConfig.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import { WeightSync } from "../sync/WeightSync.ts"
import { Trainer } from "../trainer/Trainer.ts"
import * as AsyncSource from "./AsyncSource.ts"
import * as Evaluator from "./Evaluator.ts"
import * as ReplaySource from "./ReplaySource.ts"
import * as Rollouts from "./Rollouts.ts"
import * as SyncSource from "./SyncSource.ts"
import * as TrainingLoop from "./TrainingLoop.ts"

export interface TrainInputs {
  readonly config: RunConfig
  readonly runDir: string
  readonly train: ReadonlyArray<PromptRow>
  readonly val: ReadonlyArray<PromptRow>
  /** A checkpoint directory to continue from (weights already loaded from it by the layers). */
  readonly resumeFrom?: string
}

/**
 * Train with rollouts: SyncSource, or AsyncSource with `pipeline.mode: async` (its groups rolled out by the cluster's
 * runners with `pipeline.rollouts: cluster`: the RolloutClient in context); evaluates on `val`.
 */
export const train = Effect.fn("Pipelines.train")(function* (inputs: TrainInputs) {
  const { config } = inputs
  const trainer = yield* Trainer
  const weightSync = yield* WeightSync
  return yield* TrainingLoop.run(
    {
      settings: TrainingLoop.settingsOf(config),
      runDir: inputs.runDir,
      ...(inputs.resumeFrom === undefined ? {} : { resumeFrom: inputs.resumeFrom }),
      ...(weightSync.published === undefined ? {} : { publishedBefore: weightSync.published }),
      publish: (version) => {
        let bytes = 0 // what the sync read of the trainer's weights: none when the engine shares them
        const snapshot = Effect.tap(trainer.snapshot, (s) =>
          Effect.sync(() => {
            bytes = WeightSnapshot.byteSize(s)
          })
        )
        return weightSync.publish({ version, snapshot }).pipe(
          Effect.map(() => bytes),
          Effect.orDie
        )
      },
      evaluate: Evaluator.atStep(config, inputs.val),
      recordConsumed: true
    },
    (start) => {
      const rollouts = { settings: Rollouts.settingsOf(config), train: inputs.train }
      if (config.pipeline.mode !== "async") return SyncSource.make(rollouts, start)
      if (config.pipeline.rollouts === "local") return AsyncSource.make(rollouts, start)
      return Effect.serviceOption(RolloutClient).pipe(
        Effect.flatMap((client) =>
          client._tag === "Some"
            ? AsyncSource.make(rollouts, start, client.value.rollOut)
            : Effect.die(new Error("Pipelines.train: pipeline.rollouts cluster without a RolloutClient in context"))
        )
      )
    }
  )
})

/** Train from recorded groups (ReplaySource.recorded): no sampling, no publishing, no evaluation. */
export const replay = (config: RunConfig, runDir: string, groups: ReadonlyArray<TrajectoryGroup>) =>
  TrainingLoop.run<never, never>(
    { settings: TrainingLoop.settingsOf(config), runDir, publish: () => Effect.succeed(0), recordConsumed: false },
    () => ReplaySource.make(config.trainer, groups)
  )
