/**
 * Training from a recorded stream: the groups of an episode log, in order, batched `train_batch_size` at a time into
 * `Trainer.step` — no sampling, no environments, no tool servers. The trainer is deterministic on a given backend,
 * so the same log and config give bit-identical weights. A torn last line of the log is skipped with a warning.
 */
import { Clock, Effect, Stream } from "effect"
import type { RunConfig } from "../config/RunConfig.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import { Metrics } from "../metrics/Metrics.ts"
import { Checkpointer } from "../store/Checkpointer.ts"
import { PolicyModel } from "../trainer/PolicyModel.ts"
import { Trainer } from "../trainer/Trainer.ts"

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
