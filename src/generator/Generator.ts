/**
 * The Generator service: prompts in, trajectory groups out. `rollouts` runs `n_samples_per_prompt` trajectories of
 * each prompt concurrently (the GRPO group), at most `max_concurrent_groups` prompts at a time, with backpressure end
 * to end: a slow consumer (the trainer) holds the prompts stream back.
 */
import { Context, Effect, Layer, Stream } from "effect"
import type { PolicyDivergedError } from "../domain/Errors.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import type { EnvRegistry } from "../env/EnvRegistry.ts"
import type { InferenceEngine } from "../inference/InferenceEngine.ts"
import type { Tokenizer } from "../tokenizer/Tokenizer.ts"
import * as AgentLoop from "./AgentLoop.ts"

/** A prompt and its position in this run's dataset order (the resume cursor). */
export interface Prompt {
  readonly row: PromptRow
  readonly cursor: number
}

export interface GeneratorOptions extends AgentLoop.Options {
  readonly samplesPerPrompt: number
  readonly maxConcurrentGroups: number
  /** emit groups as they complete (async pipeline) instead of in prompt order (sync, deterministic) */
  readonly unordered: boolean
}

export class Generator extends Context.Service<
  Generator,
  {
    /**
     * The n trajectories of one prompt, run concurrently. Failed trajectories carry their error; the group fails only
     * when the policy's weights have diverged (a non-finite log-prob).
     */
    readonly group: (
      prompt: Prompt,
      overrides?: Partial<GeneratorOptions>
    ) => Effect.Effect<TrajectoryGroup, PolicyDivergedError>
    readonly rollouts: (
      prompts: Stream.Stream<Prompt>,
      overrides?: Partial<GeneratorOptions>
    ) => Stream.Stream<TrajectoryGroup, PolicyDivergedError>
  }
>()("rl/generator/Generator") {}

export const make = Effect.fn("Generator.make")(function* (options: GeneratorOptions) {
  const context = yield* Effect.context<InferenceEngine | Tokenizer | EnvRegistry>()
  const group = (prompt: Prompt, overrides: Partial<GeneratorOptions> = {}) => {
    const o = { ...options, ...overrides }
    return Effect.forEach(
      Array.from({ length: o.samplesPerPrompt }, (_, i) => i),
      (sample) => AgentLoop.run(prompt.row, sample, o),
      { concurrency: o.samplesPerPrompt }
    ).pipe(
      Effect.map(
        (trajectories): TrajectoryGroup => ({
          promptUid: prompt.row.uid ?? `cursor-${prompt.cursor}`,
          cursor: prompt.cursor,
          dataSource: prompt.row.data_source,
          envClass: prompt.row.env_class,
          trajectories
        })
      ),
      Effect.withSpan("Generator.group", { attributes: { promptUid: prompt.row.uid } }),
      Effect.provideContext(context)
    )
  }
  const rollouts = (prompts: Stream.Stream<Prompt>, overrides: Partial<GeneratorOptions> = {}) => {
    const o = { ...options, ...overrides }
    return prompts.pipe(
      Stream.mapEffect((prompt) => group(prompt, overrides), {
        concurrency: o.maxConcurrentGroups,
        unordered: o.unordered
      })
    )
  }
  return Generator.of({ group, rollouts })
})

export const layer = (
  options: GeneratorOptions
): Layer.Layer<Generator, never, InferenceEngine | Tokenizer | EnvRegistry> => Layer.effect(Generator, make(options))
