/**
 * The synchronous group source (SkyRL's `fit`): for each step, generate its batch of B groups (all concurrently, at
 * most `generator.max_concurrent_groups` at once), record them in the episode log, and hand them to the loop, which
 * trains and publishes before the next batch is generated. In-flight groups a checkpoint restored are trained
 * instead of generated again.
 *
 * Sampling seeds depend on the prompt's position (PromptOrder.sampleSeed), so a prompt seen again in a later epoch is
 * sampled afresh, and a run with the same config and seed reproduces the same trajectories.
 */
import { Clock, Effect, Stream } from "effect"
import * as Spans from "../domain/Spans.ts"
import { Generator } from "../generator/Generator.ts"
import { EpisodeLog } from "../store/EpisodeLog.ts"
import * as PromptOrder from "./PromptOrder.ts"
import * as Rollouts from "./Rollouts.ts"
import type * as TrainingLoop from "./TrainingLoop.ts"

export const make = Effect.fn("SyncSource.make")(function* (inputs: Rollouts.Inputs, start: TrainingLoop.Start) {
  const { settings } = inputs
  const generator = yield* Generator
  const episodeLog = yield* EpisodeLog
  const { B, steps, order, pending } = yield* Rollouts.prepare(inputs, start)
  if (pending.size > 0)
    yield* Effect.logInfo(`${pending.size} in-flight groups restored: they train before any is generated`)

  // the step's span opens here, so its groups are generated under it (step → group → turn → tool call); the loop
  // trains under it too and ends it
  const batch = (step: number) =>
    Effect.flatMap(Effect.makeSpan(Spans.names.step, { attributes: { "train.step": step } }), (span) =>
      generate(step, span).pipe(Effect.withParentSpan(span))
    )

  const generate = (step: number, span: TrainingLoop.Batch["span"]) =>
    Effect.gen(function* () {
      const t0 = yield* Clock.currentTimeMillis
      const prompts = order.slice((step - 1) * B, step * B)
      const groups = yield* Effect.forEach(
        prompts,
        (prompt) => {
          const restored = pending.get(prompt.cursor)
          if (restored !== undefined) return Effect.succeed({ group: restored, fresh: false })
          return generator
            .group(prompt, { seed: PromptOrder.sampleSeed(settings.samplingSeed, prompt.cursor, B) })
            .pipe(Effect.map((group) => ({ group, fresh: true })))
        },
        { concurrency: settings.maxConcurrentGroups }
      )
      for (const p of prompts) pending.delete(p.cursor)
      if (settings.recordEpisodes) {
        yield* Effect.forEach(
          groups.filter((g) => g.fresh),
          (g) => episodeLog.append(g.group),
          { discard: true }
        ).pipe(Effect.orDie)
      }
      const batch: TrainingLoop.Batch = {
        step,
        groups: groups.map((g) => g.group),
        metrics: { "timing/generate": ((yield* Clock.currentTimeMillis) - t0) / 1000 },
        startedAt: t0,
        ...(span === undefined ? {} : { span })
      }
      return batch
    })

  const source: TrainingLoop.Source = {
    totalSteps: steps,
    batches: Stream.unfold(start.firstStep, (step) =>
      step > steps ? Effect.succeed(undefined) : batch(step).pipe(Effect.map((b) => [b, step + 1] as const))
    ),
    guard: (train) => train,
    trained: () => Effect.succeed({}),
    close: Effect.void,
    checkpoint: (step, failed = []) => Effect.succeed(Rollouts.checkpointPart(step, B, order, failed))
  }
  return source
})
