/**
 * The fully-async training loop: K = `pipeline.num_generation_workers` generation fibers and one trainer fiber,
 * joined by a bounded queue, with the StalenessManager as the one owner of how far generation may run ahead.
 *
 * - A generation fiber waits for admission, takes the next prompt cursor (PromptOrder), runs one group
 *   (`Generator.group`: n trajectories concurrently), appends it to the episode log and offers it to the queue.
 * - The trainer fiber takes groups off the queue into a reorder buffer and trains step s on exactly the B groups at
 *   cursors [(s−1)·B, s·B) (groups stay intact), publishes the weights, appends the step's prompts to
 *   `consumed.jsonl` (fsync'd), then counts the step in the StalenessManager, which admits B more groups.
 *
 * Departure from SkyRL, on purpose: SkyRL's trainer takes groups in completion order, so its capacity rule bounds
 * staleness only in steady state, and it discards and regenerates groups that came out too stale. Training in
 * cursor order turns the same capacity rule into a hard per-group bound (see StalenessManager), so nothing is ever
 * thrown away and a checkpoint is simply "cursor + the groups generated beyond it". The price is head-of-line
 * blocking: a slow group holds its step, while the other fibers keep generating up to the staleness budget.
 * With `max_staleness_steps: 0` generation and training alternate batch by batch, and since sampling seeds depend
 * on the prompt's position (PromptOrder.sampleSeed) and groups train in cursor order, the run produces exactly the
 * weights SyncPipeline produces.
 *
 * Staleness of a group = the trainer step whose weights it trains from − the step whose weights produced its oldest
 * token (found from the turns' `policyVersionFirst` via the versions published after each step). Over
 * `max_staleness_steps` is a defect. With in-process weight sync the engine samples from the trainer's own
 * variables, so it is paused while the trainer updates them (a decode step never sees half-updated weights).
 *
 * Checkpoints record the cursor, the consumed prompt uids, the published version of each step and the in-flight
 * groups (generated, not yet trained) as `inflight.jsonl`; a resumed run trains those first and generates only the
 * cursors missing beyond the checkpoint. `consumed.jsonl` is truncated to the checkpoint's step (ConsumedLog).
 * Groups generated after the last checkpoint and lost in a crash are generated again, so `episodes.jsonl` may hold
 * two attempts of a prompt; only the later one is trained on, and `consumed.jsonl` says which steps trained which
 * cursors, so replay (ReplayPipeline.recorded) trains exactly the run's batches.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Cause, Clock, Effect, Fiber, Queue, Schema } from "effect"
import { ConfigError } from "../domain/Errors.ts"
import { TrajectoryGroup } from "../domain/Trajectory.ts"
import { Generator } from "../generator/Generator.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import { Metrics } from "../metrics/Metrics.ts"
import { Checkpointer } from "../store/Checkpointer.ts"
import { EpisodeLog } from "../store/EpisodeLog.ts"
import { WeightSync } from "../sync/WeightSync.ts"
import { PolicyModel } from "../trainer/PolicyModel.ts"
import { Trainer } from "../trainer/Trainer.ts"
import * as ConsumedLog from "./ConsumedLog.ts"
import * as PromptOrder from "./PromptOrder.ts"
import * as StalenessManager from "./StalenessManager.ts"
import * as SyncPipeline from "./SyncPipeline.ts"

export const inflightFile = "inflight.jsonl"

/** What an async checkpoint adds to the trainer state (`trainer_state.json` → `data`). */
export interface CheckpointData {
  readonly cursor: number // prompts [0, cursor) of the run's order have been trained on
  readonly consumed: ReadonlyArray<string> // their uids, in cursor order
  readonly stepVersions: ReadonlyArray<number> // [s] = policy version published after step s (0: the start)
  readonly inflight: number // groups in inflight.jsonl
}

const encodeGroup = Schema.encodeSync(Schema.fromJsonString(TrajectoryGroup))
const decodeGroup = Schema.decodeUnknownSync(Schema.fromJsonString(TrajectoryGroup))

const readInflight = (dir: string) =>
  Effect.tryPromise(async () => {
    const text = await fs.readFile(path.join(dir, inflightFile), "utf8").catch(() => "")
    return text
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map((l) => decodeGroup(l))
  }).pipe(Effect.orDie)

/** The step whose published weights are `version`: the last step s with stepVersions[s] ≤ version. */
export const stepOfVersion = (stepVersions: ReadonlyArray<number>, version: number): number => {
  let s = 0
  for (let i = 0; i < stepVersions.length; i++) if (stepVersions[i]! <= version) s = i
  return s
}

/** The oldest `policyVersionFirst` of a group's turns (undefined when no trajectory produced a token). */
export const oldestVersion = (group: TrajectoryGroup): number | undefined => {
  let oldest: number | undefined
  for (const t of group.trajectories)
    for (const turn of t.turns)
      oldest = oldest === undefined ? turn.policyVersionFirst : Math.min(oldest, turn.policyVersionFirst)
  return oldest
}

export const run = Effect.fn("AsyncPipeline.run")(function* (inputs: SyncPipeline.Inputs) {
  const { config, runDir, train, val } = inputs
  const generator = yield* Generator
  const trainer = yield* Trainer
  const weightSync = yield* WeightSync
  const engine = yield* InferenceEngine
  const episodeLog = yield* EpisodeLog
  const metrics = yield* Metrics
  const checkpointer = yield* Checkpointer
  const { model } = yield* PolicyModel
  const started = yield* Clock.currentTimeMillis

  const B = config.trainer.train_batch_size
  const S = config.pipeline.max_staleness_steps
  const K = config.pipeline.num_generation_workers
  const steps = SyncPipeline.totalSteps(config, train.length)
  if (steps < 1) {
    return yield* new ConfigError({
      path: "trainer.train_batch_size",
      message: `${train.length} training prompts × ${config.trainer.epochs} epochs cannot fill one batch of ${B}`
    })
  }
  const order = PromptOrder.make(train, config.trainer.epochs, config.trainer.seed, config.data.shuffle)
  const limit = steps * B // cursors [0, limit) are trained on; a partial last batch is not

  let firstStep = 1
  let stepVersions: Array<number> = [yield* trainer.version]
  const pending = new Map<number, TrajectoryGroup>() // generated, not trained: the reorder buffer
  if (inputs.resumeFrom !== undefined) {
    const restored = yield* checkpointer.read(inputs.resumeFrom)
    yield* trainer.restore(restored.trainer)
    const data = restored.data as Partial<CheckpointData>
    const done = restored.trainer.step
    firstStep = done + 1
    stepVersions =
      data.stepVersions !== undefined && data.stepVersions.length === done + 1
        ? [...data.stepVersions]
        : Array.from({ length: done + 1 }, (_, s) => (s === done ? restored.trainer.version : 0)) // a sync checkpoint
    // the engine starts at version 0: tell it the restored weights' version before anything samples from them
    yield* weightSync.publish({ version: yield* trainer.version, snapshot: trainer.snapshot }).pipe(Effect.orDie)
    for (const g of yield* readInflight(inputs.resumeFrom)) {
      if (g.cursor >= done * B && g.cursor < limit) pending.set(g.cursor, g)
    }
    yield* Effect.logInfo(
      `resumed from ${inputs.resumeFrom} at step ${done}: ${pending.size} in-flight groups restored, generating from cursor ${done * B}`
    )
  }

  // steps from firstStep on are trained (again): forget their consumed lines, e.g. those a crash left after the
  // checkpoint or a killed run left before its first one, and cut any torn last line off the episode log
  yield* ConsumedLog.truncateTo(runDir, firstStep - 1)
  yield* ConsumedLog.dropTornTail(episodeLog.file)
  const evaluate = SyncPipeline.evaluation(config, val)
  const evalBefore =
    config.trainer.eval_before_train && firstStep === 1 ? yield* evaluate("before training", 0) : undefined

  const manager = yield* StalenessManager.make(
    StalenessManager.initial({
      batchSize: B,
      maxStaleness: S,
      trainerStep: firstStep - 1,
      accepted: (firstStep - 1) * B + pending.size
    })
  )
  const queue = yield* Queue.bounded<TrajectoryGroup>((S + 1) * B + K)

  // cursors handed out in increasing order, skipping those restored from the checkpoint
  const restoredCursors = new Set(pending.keys())
  let nextCursor = (firstStep - 1) * B
  const takeCursor = Effect.sync((): number | undefined => {
    while (nextCursor < limit && restoredCursors.has(nextCursor)) nextCursor++
    return nextCursor < limit ? nextCursor++ : undefined
  })

  let admissionWaitMs = 0 // summed over the generation fibers since the last step
  const worker = Effect.gen(function* () {
    while (true) {
      const t0 = yield* Clock.currentTimeMillis
      yield* manager.admit
      admissionWaitMs += (yield* Clock.currentTimeMillis) - t0
      const cursor = yield* takeCursor
      if (cursor === undefined) return yield* manager.abandon
      const group = yield* generator.group(order.at(cursor), {
        seed: PromptOrder.sampleSeed(config.generator.seed, cursor, B)
      })
      if (config.logging.record_episodes) yield* episodeLog.append(group).pipe(Effect.orDie)
      yield* manager.accept
      yield* Queue.offer(queue, group)
    }
  }).pipe(
    // a dying generation fiber fails the queue, so the trainer does not wait for it forever
    Effect.onExit((exit) =>
      exit._tag === "Failure" && !Cause.hasInterruptsOnly(exit.cause) ? Queue.failCause(queue, exit.cause) : Effect.void
    )
  )
  const workers = yield* Effect.forEach(Array.from({ length: K }), () => Effect.forkChild(worker))

  const inProcess = config.pipeline.weight_sync === "inprocess"
  let lastStepEnd = yield* Clock.currentTimeMillis
  const deadline = SyncPipeline.deadlineOf(config, lastStepEnd)
  let lastStep = steps
  for (let step = firstStep; step <= lastStep; step++) {
    const cursors = Array.from({ length: B }, (_, i) => (step - 1) * B + i)
    const t0 = yield* Clock.currentTimeMillis
    while (!cursors.every((c) => pending.has(c))) {
      const group = yield* Queue.take(queue)
      pending.set(group.cursor, group)
    }
    for (const g of yield* Queue.clear(queue)) pending.set(g.cursor, g)
    const waitedMs = (yield* Clock.currentTimeMillis) - t0
    const queueDepth = pending.size - B
    const groups = cursors.map((c) => pending.get(c)!)
    for (const c of cursors) pending.delete(c)

    // staleness, in training steps: the weights of step `step − 1` train these groups
    const staleness = groups.flatMap((g) => {
      const oldest = oldestVersion(g)
      return oldest === undefined ? [] : [{ g, oldest, steps: step - 1 - stepOfVersion(stepVersions, oldest) }]
    })
    const worst = staleness.reduce((m, x) => (x.steps > m.steps ? x : m), { steps: 0, oldest: 0, g: groups[0]! })
    if (worst.steps > S) {
      return yield* Effect.die(
        new Error(
          `AsyncPipeline: group ${worst.g.promptUid} (cursor ${worst.g.cursor}) is ${worst.steps} steps stale at step ${step} ` +
            `(oldest token from version ${worst.oldest}, step versions ${JSON.stringify(stepVersions)}), over max_staleness_steps ${S}`
        )
      )
    }

    const t1 = yield* Clock.currentTimeMillis
    const trainAndPublish = Effect.gen(function* () {
      const result = yield* trainer.step(groups)
      yield* weightSync.publish({ version: result.version, snapshot: trainer.snapshot }).pipe(Effect.orDie)
      return result
    })
    const result = inProcess
      ? yield* engine.pause.pipe(Effect.andThen(trainAndPublish), Effect.ensuring(engine.resume))
      : yield* trainAndPublish
    const trainSeconds = ((yield* Clock.currentTimeMillis) - t1) / 1000
    yield* ConsumedLog.append(runDir, step, groups)
    stepVersions.push(result.version)
    yield* manager.step

    const now = yield* Clock.currentTimeMillis
    const intervalMs = Math.max(1, now - lastStepEnd)
    lastStepEnd = now
    const counts = yield* manager.state
    const values = {
      ...result.metrics,
      "trainer/policy_version": result.version,
      "async/staleness_mean":
        staleness.length === 0 ? 0 : staleness.reduce((sum, x) => sum + x.steps, 0) / staleness.length,
      "async/staleness_max": worst.steps,
      "async/version_lag_max": staleness.reduce((m, x) => Math.max(m, stepVersions[step - 1]! - x.oldest), 0),
      "async/queue_depth": queueDepth,
      "async/running": counts.running,
      "async/trainer_idle_fraction": Math.min(1, waitedMs / intervalMs),
      "async/generator_idle_fraction": Math.min(1, admissionWaitMs / (K * intervalMs)),
      "timing/wait_for_groups": waitedMs / 1000,
      "timing/train_and_sync": trainSeconds,
      "timing/step": intervalMs / 1000
    }
    admissionWaitMs = 0
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
      for (const g of yield* Queue.clear(queue)) pending.set(g.cursor, g)
      const inflight = [...pending.values()].sort((a, b) => a.cursor - b.cursor)
      const data: CheckpointData = {
        cursor: step * B,
        consumed: order.slice(0, step * B).map((p) => p.row.uid ?? `cursor-${p.cursor}`),
        stepVersions,
        inflight: inflight.length
      }
      const saved = yield* checkpointer
        .save(step, model, yield* trainer.state, data as unknown as Record<string, unknown>, {
          [inflightFile]: inflight.map((g) => `${encodeGroup(g)}\n`).join("")
        })
        .pipe(Effect.orDie)
      yield* Effect.logInfo(`checkpoint ${saved.dir} (${inflight.length} in-flight groups)`)
    }
  }
  yield* Fiber.interruptAll(workers)

  const evalAfter = yield* evaluate("after training", lastStep)
  const summary: SyncPipeline.Summary = {
    event: "summary",
    steps: lastStep,
    seconds: Math.round((((yield* Clock.currentTimeMillis) - started) / 1000) * 10) / 10,
    runDir,
    ...(evalBefore === undefined ? {} : { evalBefore }),
    ...(evalAfter === undefined ? {} : { evalAfter })
  }
  return summary
})
