/**
 * The fully-async group source: K = `pipeline.num_generation_workers` generation fibers and the training loop,
 * joined by a bounded queue, with the StalenessManager as the one owner of how far generation may run ahead.
 *
 * - A generation fiber waits for admission, takes the next prompt cursor (PromptOrder), runs one group
 *   (`Generator.group`: n trajectories concurrently), appends it to the episode log and offers it to the queue.
 * - The loop pulls step s's batch: groups come off the queue into a reorder buffer until exactly the B groups at
 *   cursors [(s−1)·B, s·B) are there (groups stay intact). After the loop trained and published it, `trained` counts
 *   the step in the StalenessManager, which admits B more groups.
 *
 * Departure from SkyRL, on purpose: SkyRL's trainer takes groups in completion order, so its capacity rule bounds
 * staleness only in steady state, and it discards and regenerates groups that came out too stale. Training in
 * cursor order turns the same capacity rule into a hard per-group bound (see StalenessManager), so nothing is ever
 * thrown away and a checkpoint is simply "cursor + the groups generated beyond it". The price is head-of-line
 * blocking: a slow group holds its step, while the other fibers keep generating up to the staleness budget.
 * With `max_staleness_steps: 0` generation and training alternate batch by batch, and since sampling seeds depend
 * on the prompt's position (PromptOrder.sampleSeed) and groups train in cursor order, the run produces exactly the
 * weights SyncSource produces.
 *
 * Staleness of a group = the trainer step whose weights it trains from − the step whose weights produced its oldest
 * token (found from the turns' `policyVersionFirst` via the versions published after each step). Over
 * `max_staleness_steps` is a defect. A local engine samples from the trainer's own variables, so it is paused while
 * the trainer updates them (a decode step never sees half-updated weights).
 *
 * Checkpoints record the cursor, the consumed prompt uids, the published version of each step and the in-flight
 * groups (generated, not yet trained) as `inflight.jsonl` (Rollouts).
 */
import { Cause, Clock, Effect, Fiber, Queue, Stream } from "effect"
import type { PolicyDivergedError } from "../domain/Errors.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import { Generator, type Prompt } from "../generator/Generator.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import { EpisodeLog } from "../store/EpisodeLog.ts"
import { Trainer } from "../trainer/Trainer.ts"
import * as PromptOrder from "./PromptOrder.ts"
import * as Rollouts from "./Rollouts.ts"
import * as StalenessManager from "./StalenessManager.ts"
import type * as TrainingLoop from "./TrainingLoop.ts"

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

/**
 * How a generation fiber rolls out one group: by default this process's Generator; with `pipeline.rollouts: cluster`
 * a rollout runner (cluster/RolloutClient), which samples on weights of `minVersion` or newer: the version the
 * trainer had published when it admitted the group, so the staleness bound holds wherever the group runs.
 */
export type RollGroup = (
  prompt: Prompt,
  options: { readonly seed: number; readonly minVersion: number }
) => ReturnType<Generator["Service"]["group"]>

/** The async source; its generation fibers are children of the calling fiber, interrupted by `close`. */
export const make = Effect.fn("AsyncSource.make")(function* (
  inputs: Rollouts.Inputs,
  start: TrainingLoop.Start,
  roll?: RollGroup
) {
  const { settings } = inputs
  const generator = yield* Generator
  const engine = yield* InferenceEngine
  const episodeLog = yield* EpisodeLog
  const trainer = yield* Trainer
  const { B, steps, order, limit, pending } = yield* Rollouts.prepare(inputs, start)
  const S = settings.maxStaleness
  const K = settings.workers
  const done = start.firstStep - 1

  const data = (start.checkpoint?.data ?? {}) as Partial<Rollouts.CheckpointData>
  // [s] = the version published after step s; a sync checkpoint records only its own step's (the trainer's)
  const stepVersions: Array<number> =
    data.stepVersions !== undefined && data.stepVersions.length === done + 1
      ? [...data.stepVersions]
      : Array.from({ length: done + 1 }, () => 0)
  // the checkpoint's own version where it recorded one: a resumed trainer may publish above it (past the versions an
  // earlier process published, TrainingLoop.resume), and its groups sampled on those count as sampled at this step
  if (data.stepVersions?.length !== done + 1) stepVersions[done] = yield* trainer.version
  if (start.checkpoint !== undefined) {
    yield* Effect.logInfo(
      `resumed at step ${done}: ${pending.size} in-flight groups restored, generating from cursor ${done * B}`
    )
  }

  const manager = yield* StalenessManager.make(
    StalenessManager.initial({ batchSize: B, maxStaleness: S, trainerStep: done, accepted: done * B + pending.size })
  )
  const queue = yield* Queue.bounded<TrajectoryGroup, PolicyDivergedError>((S + 1) * B + K)

  // cursors handed out in increasing order, skipping those restored from the checkpoint
  const restoredCursors = new Set(pending.keys())
  let nextCursor = done * B
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
      const seed = PromptOrder.sampleSeed(settings.samplingSeed, cursor, B)
      const group = yield* roll === undefined
        ? generator.group(order.at(cursor), { seed })
        : roll(order.at(cursor), { seed, minVersion: stepVersions[stepVersions.length - 1]! })
      if (settings.recordEpisodes) yield* episodeLog.append(group).pipe(Effect.orDie)
      yield* manager.accept
      yield* Queue.offer(queue, group)
    }
  }).pipe(
    // a dying generation fiber fails the queue, so the loop does not wait for it forever
    Effect.onExit((exit) =>
      exit._tag === "Failure" && !Cause.hasInterruptsOnly(exit.cause) ? Queue.failCause(queue, exit.cause) : Effect.void
    )
  )
  const workers = yield* Effect.forEach(Array.from({ length: K }), () => Effect.forkChild(worker))

  let lastStepEnd = yield* Clock.currentTimeMillis
  let current = { waitedMs: 0, staleness: [] as Array<{ g: TrajectoryGroup; oldest: number; steps: number }> }

  const batch = (step: number) =>
    Effect.gen(function* () {
      const cursors = Array.from({ length: B }, (_, i) => (step - 1) * B + i)
      const t0 = yield* Clock.currentTimeMillis
      while (!cursors.every((c) => pending.has(c))) {
        // a generation fiber's failure (diverged weights) or death reaches the loop here
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
            `AsyncSource: group ${worst.g.promptUid} (cursor ${worst.g.cursor}) is ${worst.steps} steps stale at step ${step} ` +
              `(oldest token from version ${worst.oldest}, step versions ${JSON.stringify(stepVersions)}), over max_staleness_steps ${S}`
          )
        )
      }
      current = { waitedMs, staleness }
      const batch: TrainingLoop.Batch = {
        step,
        groups,
        metrics: {
          "async/staleness_mean":
            staleness.length === 0 ? 0 : staleness.reduce((sum, x) => sum + x.steps, 0) / staleness.length,
          "async/staleness_max": worst.steps,
          "async/version_lag_max": staleness.reduce((m, x) => Math.max(m, stepVersions[step - 1]! - x.oldest), 0),
          "async/queue_depth": queueDepth,
          "timing/wait_for_groups": waitedMs / 1000
        },
        startedAt: t0
      }
      return batch
    })

  // a local engine samples from the trainer's own variables, whatever publishes the versions: it must not decode
  // while an update writes them
  const sharesWeights = settings.engineSharesWeights
  const source: TrainingLoop.Source = {
    totalSteps: steps,
    batches: Stream.unfold(start.firstStep, (step) =>
      step > steps ? Effect.succeed(undefined) : batch(step).pipe(Effect.map((b) => [b, step + 1] as const))
    ),
    guard: (train) =>
      sharesWeights ? engine.pause.pipe(Effect.andThen(train), Effect.ensuring(engine.resume)) : train,
    trained: (_step, version) =>
      Effect.gen(function* () {
        stepVersions.push(version)
        yield* manager.step
        const now = yield* Clock.currentTimeMillis
        const intervalMs = Math.max(1, now - lastStepEnd)
        lastStepEnd = now
        const counts = yield* manager.state
        const values = {
          "async/running": counts.running,
          "async/trainer_idle_fraction": Math.min(1, current.waitedMs / intervalMs),
          "async/generator_idle_fraction": Math.min(1, admissionWaitMs / (K * intervalMs))
        }
        admissionWaitMs = 0
        return values
      }),
    close: Fiber.interruptAll(workers),
    checkpoint: (step, failed = []) =>
      Effect.gen(function* () {
        for (const g of yield* Queue.clear(queue).pipe(Effect.orDie)) pending.set(g.cursor, g)
        return Rollouts.checkpointPart(step, B, order, [...failed, ...pending.values()], {
          stepVersions: stepVersions.slice(0, step + 1)
        })
      })
  }
  return source
})
