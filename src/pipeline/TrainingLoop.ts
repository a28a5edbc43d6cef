/**
 * The one training loop (SkyRL's `fit`), fed by a source of trajectory groups:
 *
 *   source.batches ──▶ train (Trainer.step, guarded by the source) ──▶ publish ──▶ consumed.jsonl ──▶ metrics
 *        ▲                                                                                              │
 *        └──────────── source.trained (admits more work) ◀──── eval every eval_interval, checkpoint ◀────┘
 *
 * Sources (one file each): SyncSource (generate a batch, then train it), AsyncSource (K generation fibers, admission
 * by the StalenessManager, a reorder buffer), ReplaySource (a recorded episode log). A source hands out the batch of
 * step s only after step s − 1 was trained, published and handed back to it (`trained`), so the stream's pull order
 * is the feedback edge of the async pipeline.
 *
 * Around the steps: resume (restore the trainer, publish the restored weights, let the source restore its
 * in-flight groups), truncate `consumed.jsonl` to the checkpoint's step, evaluate before, every `eval_interval`
 * steps and after; checkpoint every `checkpoint.interval` steps and at the last; with `logging.report`, rewrite
 * report.html after each evaluation and checkpoint (a warning, never a failure, when it cannot be written). The run
 * stops early after the step that passes `trainer.max_train_seconds`, or after the step during which a graceful stop
 * was asked for (SIGTERM: StopSignal); either way the last step is checkpointed, and a stop skips the final evaluation.
 *
 * A trainer fault (an exception inside Trainer.step: the tensor backend out of memory, a non-finite loss) ends the
 * run with a TrainerFault naming the step and its prompts. When the step applied no optimizer update yet, the
 * weights are still those of the step before: the loop checkpoints that step with the failed step's groups in
 * flight, so `--resume latest` trains exactly those groups again instead of regenerating them.
 */
import { Cause, Clock, Effect, type Exit, type FileSystem, type Path, Schema, Stream, Tracer } from "effect"
import type { RunConfig } from "../config/RunConfig.ts"
import type { CheckpointError, PolicyDivergedError } from "../domain/Errors.ts"
import type { PolicyVersion } from "../domain/PolicyVersion.ts"
import * as Spans from "../domain/Spans.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import * as Env from "../env/Env.ts"
import * as GroupJudge from "../env/GroupJudge.ts"
import * as Teacher from "../inference/Teacher.ts"
import type * as MetricKeys from "../metrics/MetricKeys.ts"
import { Metrics } from "../metrics/Metrics.ts"
import * as Report from "../metrics/Report.ts"
import * as Transformer from "../model/Transformer.ts"
import { Checkpointer } from "../store/Checkpointer.ts"
import * as ConsumedLog from "../store/ConsumedLog.ts"
import { PolicyModel } from "../trainer/PolicyModel.ts"
import { Trainer, type TrainerState } from "../trainer/Trainer.ts"
import type * as Evaluator from "./Evaluator.ts"
import * as StopSignal from "./StopSignal.ts"

/** The trainer failed inside a step: the step, its prompts, and whether a checkpoint keeps its groups for a retry. */
export class TrainerFault extends Schema.TaggedError<TrainerFault>()("TrainerFault", {
  step: Schema.Int,
  prompts: Schema.String,
  message: Schema.String,
  kept: Schema.optionalKey(Schema.String) // the checkpoint that holds the step's groups in flight
}) {}

/** Where a run starts: fresh, or from a checkpoint (its trainer state already restored by the loop). */
export interface Start {
  readonly firstStep: number
  readonly checkpoint?: { readonly dir: string; readonly data: Readonly<Record<string, unknown>> }
}

/** The groups of one training step, in cursor order, with the source's own measurements of how they came. */
export interface Batch {
  readonly step: number
  readonly groups: ReadonlyArray<TrajectoryGroup>
  readonly metrics: MetricKeys.Values // e.g. timing/generate, async/staleness_max
  readonly startedAt: number // epoch ms when the source started on this batch
  /**
   * The step's span (`train.step`) when the source opened it to generate the batch under it (SyncSource); the loop
   * trains under it and ends it. Without one the loop opens it, linked to the groups' spans (AsyncSource, replay).
   */
  readonly span?: Tracer.Span
}

/** The `train.step` span of a step whose groups were generated before it, linked to each group's span. */
export const stepSpan = (step: number, groups: ReadonlyArray<TrajectoryGroup>) =>
  Effect.makeSpan(Spans.names.step, {
    attributes: { "train.step": step },
    links: groups.flatMap((g) =>
      g.trace === undefined ? [] : [{ span: Tracer.externalSpan(g.trace), attributes: { "prompt.uid": g.promptUid } }]
    )
  })

/** Run `effect` under `span` and end the span with its exit. */
const underSpan = <A, E, R>(span: Tracer.Span, effect: Effect.Effect<A, E, R>) =>
  effect.pipe(
    Effect.withParentSpan(span),
    Effect.onExit((exit: Exit.Exit<A, E>) =>
      Effect.flatMap(Clock.currentTimeNanos, (now) => Effect.sync(() => span.end(now, exit)))
    )
  )

/** What a checkpoint adds for the source: trainer_state.json `data` and extra files (in-flight groups). */
export interface CheckpointPart {
  readonly data: Readonly<Record<string, unknown>>
  readonly files?: Readonly<Record<string, string>>
  readonly inflight: number
}

export interface Source {
  /** Steps this source can feed (from step 1): the loop trains up to this many. */
  readonly totalSteps: number
  /**
   * The batches of steps start.firstStep, firstStep + 1, …; the next is pulled after the previous was trained. It
   * fails only when the policy's weights have diverged (it sampled a non-finite log-prob), which ends the run.
   */
  readonly batches: Stream.Stream<Batch, PolicyDivergedError>
  /** Runs around a step's training and weight publish (in-process sync pauses the engine). */
  readonly guard: <A, E, R>(train: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /** Step `step` was trained and its weights published as `version`; returns metrics measured since the batch. */
  readonly trained: (step: number, version: PolicyVersion) => Effect.Effect<MetricKeys.Values>
  /** Stop whatever the source runs in the background (after the last step, before the final evaluation). */
  readonly close: Effect.Effect<void>
  /** The source's part of a checkpoint at `step`; `failed` are groups of a later step that must be trained again. */
  readonly checkpoint: (step: number, failed?: ReadonlyArray<TrajectoryGroup>) => Effect.Effect<CheckpointPart>
}

/** The loop's slice of the run config (`settingsOf`). */
export interface Settings {
  readonly evalBeforeTrain: boolean // trainer.eval_before_train
  readonly evalInterval: number // trainer.eval_interval (0: none)
  readonly checkpointInterval: number // checkpoint.interval (0: only the last step)
  readonly maxTrainSeconds?: number // trainer.max_train_seconds
  readonly report?: boolean // logging.report: refresh report.html after each eval and checkpoint
}

export const settingsOf = (c: RunConfig): Settings => ({
  evalBeforeTrain: c.trainer.eval_before_train,
  evalInterval: c.trainer.eval_interval,
  checkpointInterval: c.checkpoint.interval,
  report: c.logging.report,
  ...(c.trainer.max_train_seconds === undefined ? {} : { maxTrainSeconds: c.trainer.max_train_seconds })
})

/** The trainer keys that fix how many steps a run has. */
export type StepCount = Pick<RunConfig["trainer"], "epochs" | "train_batch_size" | "max_steps">

export interface Options<R = never> {
  readonly settings: Settings
  readonly runDir: string
  readonly resumeFrom?: string
  /**
   * Publish the trainer's weights as `version` to whatever samples from them (nothing for replay); returns the bytes
   * the sync moved (0 when the engine shares the trainer's tensors).
   */
  readonly publish: (version: PolicyVersion) => Effect.Effect<number>
  /**
   * The newest version already published where engines read (WeightSync.published): a resumed run whose earlier
   * process published past the checkpoint publishes the restored weights above it, or engines that loaded those lost
   * versions (rollout runners load only newer ones) would go on sampling from them.
   */
  readonly publishedBefore?: Effect.Effect<number | undefined>
  /** Held-out evaluation at a step; absent: no evaluation (replay). */
  readonly evaluate?: (
    label: string,
    step: number
  ) => Effect.Effect<Evaluator.Report | undefined, PolicyDivergedError, R>
  /** Append every trained prompt to `consumed.jsonl` (off for replay, which must not touch the recorded run). */
  readonly recordConsumed: boolean
}

export interface Summary {
  readonly event: "summary"
  readonly steps: number
  readonly groups: number
  readonly seconds: number
  readonly runDir: string
  readonly checkpoint?: string
  readonly stopped?: "max_train_seconds" | "signal"
  readonly evalBefore?: Evaluator.Report
  readonly evalAfter?: Evaluator.Report
}

/** When training must stop (epoch ms), for `trainer.max_train_seconds` counted from `start`; Infinity without it. */
export const deadlineOf = (settings: Settings, start: number): number =>
  settings.maxTrainSeconds === undefined ? Number.POSITIVE_INFINITY : start + settings.maxTrainSeconds * 1000

/** Steps a run of `trainRows` prompts trains: whole batches over `epochs`, at most `max_steps`. */
export const totalSteps = (trainer: StepCount, trainRows: number): number => {
  const byData = Math.floor((trainRows * trainer.epochs) / trainer.train_batch_size)
  return trainer.max_steps === undefined ? byData : Math.min(trainer.max_steps, byData)
}

const promptsOf = (groups: ReadonlyArray<TrajectoryGroup>) => groups.map((g) => `${g.promptUid}@${g.cursor}`).join(", ")

/** The error of a failed trainer step, as one line (the first failure or defect of the cause). */
const describe = (cause: Cause.Cause<unknown>): string => {
  const error = Cause.squash(cause)
  return error instanceof Error
    ? error.name === "Error"
      ? error.message
      : `${error.name}: ${error.message}`
    : String(error)
}

interface Trained {
  readonly batch: Batch
  readonly last: boolean
  readonly stopped?: "max_train_seconds" | "signal"
}

/** What the steps of one run share: the services, the loop's options and the source. */
interface Loop<R> {
  readonly options: Options<R>
  readonly trainer: Trainer["Service"]
  readonly metrics: Metrics["Service"]
  readonly checkpointer: Checkpointer["Service"]
  readonly model: PolicyModel["Service"]["model"]
  readonly source: Source
  readonly evaluate: NonNullable<Options<R>["evaluate"]>
  readonly refreshReport: Effect.Effect<void, never, FileSystem.FileSystem | Path.Path>
}

/** What the steps trained: how many groups, the last step, the latest checkpoint written. */
interface TrainedSteps {
  readonly groups: number
  readonly last: Trained | undefined
  readonly checkpoint: string | undefined
}

/**
 * Run the loop: `makeSource` builds the source once the start is known (after the trainer state was restored).
 */
export const run = <R1, R2>(
  options: Options<R1>,
  makeSource: (start: Start) => Effect.Effect<Source, never, R2>
): Effect.Effect<
  Summary,
  TrainerFault | PolicyDivergedError | CheckpointError | ConsumedLog.ConsumedLogError,
  R1 | R2 | Trainer | Metrics | Checkpointer | PolicyModel | FileSystem.FileSystem | Path.Path
> =>
  Effect.gen(function* () {
    const { settings, runDir } = options
    const trainer = yield* Trainer
    const metrics = yield* Metrics
    const checkpointer = yield* Checkpointer
    const { model } = yield* PolicyModel
    const started = yield* Clock.currentTimeMillis

    const start = yield* resume(options, trainer, checkpointer)
    // a checkpoint holds each trained parameter and its two Adam moments, 4 bytes each
    const trainable = Transformer.trainableVariables(model).reduce((n, v) => n + v.size, 0)
    yield* checkpointer.checkSpace(12 * trainable)
    const source = yield* makeSource(start)
    const loop: Loop<R1> = {
      options,
      trainer,
      metrics,
      checkpointer,
      model,
      source,
      evaluate: evaluator(options),
      refreshReport: settings.report === true ? Report.refresh(runDir) : Effect.void
    }
    const evalBefore =
      settings.evalBeforeTrain && start.firstStep === 1 ? yield* loop.evaluate("before training", 0) : undefined
    if (evalBefore !== undefined) yield* loop.refreshReport
    const trained = yield* trainAll(loop, start)
    return yield* summary(loop, start, started, evalBefore, trained)
  }).pipe(Effect.withSpan(Spans.names.run))

/**
 * Where the run starts: from `resumeFrom`, the trainer restored and its weights published; `consumed.jsonl` cut to
 * the step before.
 */
const resume = <R>(options: Options<R>, trainer: Trainer["Service"], checkpointer: Checkpointer["Service"]) =>
  Effect.gen(function* () {
    let start: Start = { firstStep: 1 }
    if (options.resumeFrom !== undefined) {
      const restored = yield* checkpointer.read(options.resumeFrom)
      const published = options.publishedBefore === undefined ? undefined : yield* options.publishedBefore
      const version =
        published !== undefined && published > restored.trainer.version ? published + 1 : restored.trainer.version
      yield* trainer.restore({ ...restored.trainer, version })
      if (version !== restored.trainer.version) {
        yield* Effect.logInfo(
          `versions up to ${published} were published past the checkpoint (version ${restored.trainer.version}) by ` +
            `the earlier process: the restored weights go out as version ${version}, so every engine takes them`
        )
      }
      start = { firstStep: restored.trainer.step + 1, checkpoint: { dir: options.resumeFrom, data: restored.data } }
      // what samples starts at version 0: tell it the restored weights' version before anything samples from them
      yield* options.publish(yield* trainer.version)
      yield* Effect.logInfo(`resumed from ${options.resumeFrom} at step ${restored.trainer.step}`)
    }
    // steps from firstStep on are trained (again): forget their consumed lines, e.g. those a crash left after the
    // checkpoint or a killed run left before its first one
    if (options.recordConsumed) yield* ConsumedLog.truncateTo(options.runDir, start.firstStep - 1)
    return start
  })

/** The held-out evaluation under its span (`eval`); nothing without one. */
const evaluator = <R>(options: Options<R>): NonNullable<Options<R>["evaluate"]> =>
  options.evaluate === undefined
    ? () => Effect.succeed(undefined)
    : (label, step) =>
        options.evaluate!(label, step).pipe(
          Effect.withSpan(Spans.names.eval, { attributes: { "train.step": step, "eval.label": label } })
        )

/** The steps from `start` on, until the last, a stop asked for or the deadline; evaluating and checkpointing. */
const trainAll = <R>(loop: Loop<R>, start: Start) =>
  Effect.gen(function* () {
    const steps = loop.source.totalSteps
    const deadline = deadlineOf(loop.options.settings, yield* Clock.currentTimeMillis)
    let groups = 0
    let last: Trained | undefined
    let checkpoint: string | undefined
    const stream = loop.source.batches.pipe(
      Stream.take(Math.max(0, steps - start.firstStep + 1)),
      Stream.mapEffect((batch) =>
        Effect.gen(function* () {
          yield* trainStep(loop, batch, deadline)
          groups += batch.groups.length
          return yield* stopCheck(loop, batch, deadline)
        })
      ),
      Stream.takeUntil((t) => t.last),
      Stream.runForEach((t) =>
        Effect.gen(function* () {
          last = t
          const saved = yield* evalAndCheckpoint(loop, t)
          if (saved !== undefined) checkpoint = saved
        })
      )
    )
    yield* StopSignal.honour(stream).pipe(Effect.ensuring(loop.source.close))
    const trained: TrainedSteps = { groups, last, checkpoint }
    return trained
  })

/** One step under its span (`train.step`), which ends with it. */
const trainStep = <R>(loop: Loop<R>, batch: Batch, deadline: number) =>
  Effect.flatMap(batch.span === undefined ? stepSpan(batch.step, batch.groups) : Effect.succeed(batch.span), (span) =>
    underSpan(span, trainAndRecord(loop, batch, deadline))
  )

/** One step: train and publish under the source's guard, then record it (the progress line's ETA heeds `deadline`). */
const trainAndRecord = <R>(loop: Loop<R>, batch: Batch, deadline: number) =>
  Effect.gen(function* () {
    const { options, trainer, source } = loop
    const before = yield* trainer.version
    const t0 = yield* Clock.currentTimeMillis
    let publishMs = 0
    let syncBytes = 0
    const result = yield* source.guard(
      trainer.step(batch.groups).pipe(
        Effect.catchCause((cause) =>
          Cause.hasInterruptsOnly(cause) ? Effect.failCause(cause) : fault(loop, batch, before, cause)
        ),
        Effect.tap((r) =>
          Effect.gen(function* () {
            const t1 = yield* Clock.currentTimeMillis
            syncBytes = yield* options
              .publish(r.version)
              .pipe(Effect.withSpan(Spans.names.weightSync, { attributes: { "policy.version": r.version } }))
            publishMs = (yield* Clock.currentTimeMillis) - t1
          })
        )
      )
    )
    const trainAndSyncMs = (yield* Clock.currentTimeMillis) - t0
    if (options.recordConsumed) yield* ConsumedLog.append(options.runDir, batch.step, batch.groups)
    const after = yield* source.trained(batch.step, result.version)
    const now = yield* Clock.currentTimeMillis
    const values: MetricKeys.Values = {
      ...result.metrics,
      ...Env.aggregateMetrics(batch.groups.flatMap((g) => g.trajectories.map((t) => t.envMetrics))),
      ...GroupJudge.stepMetrics(batch.groups),
      ...Teacher.stepMetrics(batch.groups),
      ...batch.metrics,
      ...after,
      "trainer/policy_version": result.version,
      "timing/weight_sync": publishMs / 1000,
      "sync/bytes": syncBytes,
      "timing/train_and_sync": trainAndSyncMs / 1000,
      "timing/step": (now - batch.startedAt) / 1000,
      ...memoryMetrics()
    }
    yield* loop.metrics.record("train", batch.step, values)
    // the step's span carries its metrics: a trace backend without OTLP metrics (W&B Weave) still gets them
    yield* Effect.annotateCurrentSpan(values)
    yield* loop.metrics.progress({
      step: batch.step,
      totalSteps: source.totalSteps,
      values,
      ...(Number.isFinite(deadline) ? { deadline } : {})
    })
  })

/** The trainer process's memory now, MB (a long run's growth shows here: `npm run bench -- soak`). */
const memoryMetrics = (): MetricKeys.Values => {
  const usage = process.memoryUsage()
  const mb = (bytes: number) => Math.round(bytes / 1e5) / 10
  return {
    "memory/rss_mb": mb(usage.rss),
    "memory/heap_used_mb": mb(usage.heapUsed),
    "memory/external_mb": mb(usage.external),
    "memory/array_buffers_mb": mb(usage.arrayBuffers)
  }
}

/** A trainer exception at `batch`'s step, as a TrainerFault; the step's groups are kept when nothing was applied. */
const fault = <R>(loop: Loop<R>, batch: Batch, before: PolicyVersion, cause: Cause.Cause<never>) =>
  Effect.gen(function* () {
    const untouched = (yield* loop.trainer.version) === before
    // the weights and optimizer are those of the step before (the step counter only moves at a step's end)
    const kept =
      untouched && batch.step > 1
        ? yield* save(loop, batch.step - 1, yield* loop.trainer.state, batch.groups)
        : undefined
    return yield* new TrainerFault({
      step: batch.step,
      prompts: promptsOf(batch.groups),
      message:
        `${describe(cause)}. ` +
        (kept !== undefined
          ? `No update was applied: ${kept} holds this step's groups, and train --resume latest trains them again`
          : untouched
            ? "No update was applied; train again (the first step has no checkpoint to keep its groups in)"
            : "An update was applied mid-step: train --resume latest continues from the last checkpoint"),
      ...(kept === undefined ? {} : { kept })
    })
  })

/** After a trained step: whether the run stops there (the last step, a stop asked for, the deadline passed). */
const stopCheck = <R>(loop: Loop<R>, batch: Batch, deadline: number) =>
  Effect.gen(function* () {
    const steps = loop.source.totalSteps
    const isLast = batch.step >= steps
    const stopped: Trained["stopped"] = isLast
      ? undefined
      : StopSignal.requested()
        ? "signal"
        : (yield* Clock.currentTimeMillis) >= deadline
          ? "max_train_seconds"
          : undefined
    if (stopped === "signal") yield* Effect.logInfo(`stop requested: checkpointing step ${batch.step} and stopping`)
    if (stopped === "max_train_seconds") {
      yield* Effect.logInfo(
        `trainer.max_train_seconds (${loop.options.settings.maxTrainSeconds}) reached after step ${batch.step} of ${steps}: stopping`
      )
    }
    const trained: Trained = {
      batch,
      last: isLast || stopped !== undefined,
      ...(stopped ? { stopped } : {})
    }
    return trained
  })

/**
 * Evaluate every `eval_interval` steps (not at the last: the final evaluation follows), checkpoint every
 * `checkpoint.interval` steps and at the last, and refresh the report after either; returns the checkpoint written.
 */
const evalAndCheckpoint = <R>(loop: Loop<R>, t: Trained) =>
  Effect.gen(function* () {
    const { settings } = loop.options
    const step = t.batch.step
    const evaluated = settings.evalInterval > 0 && step % settings.evalInterval === 0 && !t.last
    if (evaluated) yield* loop.evaluate(`at step ${step}`, step)
    const saved = t.last || (settings.checkpointInterval > 0 && step % settings.checkpointInterval === 0)
    const checkpoint = saved ? yield* save(loop, step, yield* loop.trainer.state) : undefined
    if (evaluated || saved) yield* loop.refreshReport
    return checkpoint
  })

/** Checkpoint `step` with the source's part (and `failed`, groups of a later step to train again); returns its dir. */
const save = <R>(loop: Loop<R>, step: number, state: TrainerState, failed?: ReadonlyArray<TrajectoryGroup>) =>
  Effect.gen(function* () {
    const part = yield* loop.source.checkpoint(step, failed)
    // a failed checkpoint (a full disk) stops the run with its one-line reason; the one before stays `latest`
    const saved = yield* loop.checkpointer.save(step, loop.model, state, part.data, part.files)
    yield* Effect.logInfo(`checkpoint ${saved.dir}${part.inflight > 0 ? ` (${part.inflight} in-flight groups)` : ""}`)
    return saved.dir
  })

/** The final evaluation (skipped after a stop asked for) and the run's summary. */
const summary = <R>(
  loop: Loop<R>,
  start: Start,
  started: number,
  evalBefore: Evaluator.Report | undefined,
  { groups, last, checkpoint }: TrainedSteps
) =>
  Effect.gen(function* () {
    const lastStep = last?.batch.step ?? start.firstStep - 1
    const evalAfter = last?.stopped === "signal" ? undefined : yield* loop.evaluate("after training", lastStep)
    const summary: Summary = {
      event: "summary",
      steps: lastStep,
      groups,
      seconds: Math.round((((yield* Clock.currentTimeMillis) - started) / 1000) * 10) / 10,
      runDir: loop.options.runDir,
      ...(checkpoint === undefined ? {} : { checkpoint }),
      ...(last?.stopped === undefined ? {} : { stopped: last.stopped }),
      ...(evalBefore === undefined ? {} : { evalBefore }),
      ...(evalAfter === undefined ? {} : { evalAfter })
    }
    return summary
  })
