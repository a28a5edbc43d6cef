/**
 * The synchronous training loop (SkyRL's `fit`): generate a batch of groups → record them → train → publish the
 * weights → repeat; evaluate before, every `eval_interval` steps and after; checkpoint every `checkpoint.interval`
 * steps and at the end. `consumed.jsonl` gets one `{"uid", "cursor", "step"}` line per prompt trained on, fsync'd
 * per step (ConsumedLog: a resume truncates it to the checkpoint's step).
 *
 * Sampling seeds depend on the step (PromptOrder.sampleSeed), so a prompt seen again in a later epoch is sampled afresh, and a run with the
 * same config and seed reproduces the same trajectories.
 */
import { Clock, Effect } from "effect"
import type { RunConfig } from "../config/RunConfig.ts"
import { ConfigError } from "../domain/Errors.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import { Generator } from "../generator/Generator.ts"
import { Metrics } from "../metrics/Metrics.ts"
import { Checkpointer } from "../store/Checkpointer.ts"
import { EpisodeLog } from "../store/EpisodeLog.ts"
import { WeightSync } from "../sync/WeightSync.ts"
import { PolicyModel } from "../trainer/PolicyModel.ts"
import { Trainer } from "../trainer/Trainer.ts"
import * as ConsumedLog from "./ConsumedLog.ts"
import * as Evaluator from "./Evaluator.ts"
import * as PromptOrder from "./PromptOrder.ts"

export interface Summary {
  readonly event: "summary"
  readonly steps: number
  readonly seconds: number
  readonly runDir: string
  readonly evalBefore?: Evaluator.Report
  readonly evalAfter?: Evaluator.Report
}

export interface Inputs {
  readonly config: RunConfig
  readonly runDir: string
  readonly train: ReadonlyArray<PromptRow>
  readonly val: ReadonlyArray<PromptRow>
  /** A checkpoint directory to continue from (weights already loaded from it by the layers). */
  readonly resumeFrom?: string
}

/** When training must stop (epoch ms), for `trainer.max_train_seconds` counted from `start`; Infinity without it. */
export const deadlineOf = (config: RunConfig, start: number): number =>
  config.trainer.max_train_seconds === undefined
    ? Number.POSITIVE_INFINITY
    : start + config.trainer.max_train_seconds * 1000

export const totalSteps = (config: RunConfig, trainRows: number): number => {
  const byData = Math.floor((trainRows * config.trainer.epochs) / config.trainer.train_batch_size)
  return config.trainer.max_steps === undefined ? byData : Math.min(config.trainer.max_steps, byData)
}

/** Evaluate on the held-out rows at `step` (recorded as an `eval` metrics event); undefined when there are none. */
export const evaluation = (config: RunConfig, val: ReadonlyArray<PromptRow>) => {
  const evalOptions = Evaluator.optionsOf(config)
  return (label: string, step: number) =>
    Effect.gen(function* () {
      if (val.length === 0) return undefined
      const metrics = yield* Metrics
      const t0 = yield* Clock.currentTimeMillis
      const { report } = yield* Evaluator.run(
        val,
        { ...evalOptions, seed: config.generator.seed + 7919 * step },
        config.trainer.eval_group_by
      )
      const seconds = ((yield* Clock.currentTimeMillis) - t0) / 1000
      yield* metrics.record("eval", step, { ...Evaluator.metrics(report), "timing/eval": seconds })
      const all = report["all"]!
      yield* Effect.logInfo(
        `eval ${label} (step ${step}): avg_score ${all.avg_score.toFixed(3)}, pass@n ${all.pass_at_n.toFixed(3)} over ${all.prompts} prompts`
      )
      return report
    })
}

export const run = Effect.fn("SyncPipeline.run")(function* (inputs: Inputs) {
  const { config, runDir, train, val } = inputs
  const generator = yield* Generator
  const trainer = yield* Trainer
  const weightSync = yield* WeightSync
  const episodeLog = yield* EpisodeLog
  const metrics = yield* Metrics
  const checkpointer = yield* Checkpointer
  const { model } = yield* PolicyModel
  const started = yield* Clock.currentTimeMillis

  const B = config.trainer.train_batch_size
  const steps = totalSteps(config, train.length)
  if (steps < 1) {
    return yield* new ConfigError({
      path: "trainer.train_batch_size",
      message: `${train.length} training prompts × ${config.trainer.epochs} epochs cannot fill one batch of ${B}`
    })
  }
  const order = PromptOrder.make(train, config.trainer.epochs, config.trainer.seed, config.data.shuffle)
  let firstStep = 1
  if (inputs.resumeFrom !== undefined) {
    const restored = yield* checkpointer.read(inputs.resumeFrom)
    yield* trainer.restore(restored.trainer)
    firstStep = restored.trainer.step + 1
    // the engine starts at version 0: tell it the restored weights' version, so trajectories record it
    yield* weightSync.publish({ version: yield* trainer.version, snapshot: trainer.snapshot }).pipe(Effect.orDie)
    yield* Effect.logInfo(`resumed from ${inputs.resumeFrom} at step ${restored.trainer.step}`)
  }
  // steps from firstStep on are trained (again): forget their consumed lines, e.g. those a crash left after the
  // checkpoint or a killed run left before its first one, and cut any torn last line off the episode log
  yield* ConsumedLog.truncateTo(runDir, firstStep - 1)
  yield* ConsumedLog.dropTornTail(episodeLog.file)
  const evaluate = evaluation(config, val)

  const evalBefore =
    config.trainer.eval_before_train && firstStep === 1 ? yield* evaluate("before training", 0) : undefined
  const deadline = deadlineOf(config, yield* Clock.currentTimeMillis)
  let lastStep = steps
  for (let step = firstStep; step <= lastStep; step++) {
    const prompts = order.slice((step - 1) * B, step * B)
    const t0 = yield* Clock.currentTimeMillis
    const groups = yield* Effect.forEach(
      prompts,
      (prompt) => generator.group(prompt, { seed: PromptOrder.sampleSeed(config.generator.seed, prompt.cursor, B) }),
      { concurrency: config.generator.max_concurrent_groups }
    )
    const generateSeconds = ((yield* Clock.currentTimeMillis) - t0) / 1000
    if (config.logging.record_episodes) {
      yield* Effect.forEach(groups, (g) => episodeLog.append(g), { discard: true }).pipe(Effect.orDie)
    }
    const result = yield* trainer.step(groups)
    const t1 = yield* Clock.currentTimeMillis
    yield* weightSync.publish({ version: result.version, snapshot: trainer.snapshot }).pipe(Effect.orDie)
    const syncSeconds = ((yield* Clock.currentTimeMillis) - t1) / 1000
    yield* ConsumedLog.append(runDir, step, groups)
    const values = {
      ...result.metrics,
      "trainer/policy_version": result.version,
      "timing/generate": generateSeconds,
      "timing/weight_sync": syncSeconds,
      "timing/step": ((yield* Clock.currentTimeMillis) - t0) / 1000
    }
    yield* metrics.record("train", step, values)
    yield* metrics.progress({ step, totalSteps: steps, values })
    if (step < lastStep && (yield* Clock.currentTimeMillis) >= deadline) {
      yield* Effect.logInfo(
        `trainer.max_train_seconds (${config.trainer.max_train_seconds}) reached after step ${step} of ${steps}: stopping`
      )
      lastStep = step
    }
    if (config.trainer.eval_interval > 0 && step % config.trainer.eval_interval === 0 && step < lastStep) {
      yield* evaluate(`at step ${step}`, step)
    }
    if (step === lastStep || (config.checkpoint.interval > 0 && step % config.checkpoint.interval === 0)) {
      const saved = yield* checkpointer.save(step, model, yield* trainer.state, { cursor: step * B }).pipe(Effect.orDie)
      yield* Effect.logInfo(`checkpoint ${saved.dir}`)
    }
  }

  const evalAfter = yield* evaluate("after training", lastStep)
  const summary: Summary = {
    event: "summary",
    steps: lastStep,
    seconds: Math.round((((yield* Clock.currentTimeMillis) - started) / 1000) * 10) / 10,
    runDir,
    ...(evalBefore === undefined ? {} : { evalBefore }),
    ...(evalAfter === undefined ? {} : { evalAfter })
  }
  return summary
})
