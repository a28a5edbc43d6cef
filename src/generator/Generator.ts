/**
 * The Generator service: prompts in, trajectory groups out. `rollouts` runs `n_samples_per_prompt` trajectories of
 * each prompt concurrently (the GRPO group), at most `max_concurrent_groups` prompts at a time, with backpressure end
 * to end: a slow consumer (the trainer) holds the prompts stream back.
 */
import { Context, Effect, Layer, Stream, Tracer } from "effect"
import type { PolicyDivergedError } from "../domain/Errors.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import * as Spans from "../domain/Spans.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import type { EnvRegistry } from "../env/EnvRegistry.ts"
import type { GroupJudge } from "../env/GroupJudge.ts"
import type { InferenceEngine } from "../inference/InferenceEngine.ts"
import { Tokenizer } from "../tokenizer/Tokenizer.ts"
import { AgentGateway } from "./AgentGateway.ts"
import * as AgentLoop from "./AgentLoop.ts"
import * as AgentProgram from "./AgentProgram.ts"

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
  /** scores the finished groups of rows whose reward_spec.method is judge (environment.judge) */
  readonly judge?: GroupJudge | undefined
  /** trainer.distillation: scores each finished group's tokens with the teacher (Teacher.scorer), before it is logged */
  readonly teacher?: ((group: TrajectoryGroup) => Effect.Effect<TrajectoryGroup>) | undefined
  /** each sample is a run of this agent program (generator.agent), through the AgentGateway in context */
  readonly agent?: AgentProgram.AgentOptions | undefined
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

/** The current span (the group's) as a TraceRef, when spans are exported (Spans.RecordTrace). */
const traceRef: Effect.Effect<Spans.TraceRef | undefined> = Effect.flatMap(
  Effect.service(Spans.RecordTrace),
  (record) =>
    record
      ? Effect.match(Effect.currentSpan, {
          onFailure: () => undefined,
          onSuccess: (span) => ({ traceId: span.traceId, spanId: span.spanId })
        })
      : Effect.succeed(undefined)
)

export const make = Effect.fn("Generator.make")(function* (options: GeneratorOptions) {
  // the services, not the span the layer was built under: a group's span is a child of the caller's (the step's)
  const context = Context.omit(Tracer.ParentSpan)(yield* Effect.context<InferenceEngine | Tokenizer | EnvRegistry>())
  const tokenizer = Context.get(context, Tokenizer)
  const found = yield* Effect.serviceOption(AgentGateway)
  const gateway =
    found._tag === "Some"
      ? Effect.succeed(found.value)
      : Effect.die(
          new Error(
            "generator.agent needs the agent gateway, which this runner does not host (use pipeline.rollouts: local)"
          )
        )
  const decode = (ids: ReadonlyArray<number>) => tokenizer.decode(ids)
  /** A judge row's group once the judge scored it (the episodes paid nothing: Rewards' method "judge"). */
  const judged = (row: PromptRow, g: TrajectoryGroup, judge: GroupJudge | undefined) => {
    if (judge?.applies(row)) return judge.judge(row, g, decode)
    if (row.reward_spec?.method === "judge") {
      return Effect.die(
        new Error(`row ${row.uid ?? g.promptUid} has reward_spec.method judge: set environment.judge (url, model)`)
      )
    }
    return Effect.succeed(g)
  }
  const group = (prompt: Prompt, overrides: Partial<GeneratorOptions> = {}) => {
    const o = { ...options, ...overrides }
    return Effect.forEach(
      Array.from({ length: o.samplesPerPrompt }, (_, i) => i),
      (sample) =>
        o.agent === undefined
          ? AgentLoop.run(prompt.row, sample, o)
          : AgentProgram.run(prompt.row, sample, o, o.agent).pipe(Effect.provideServiceEffect(AgentGateway, gateway)),
      { concurrency: o.samplesPerPrompt }
    ).pipe(
      Effect.flatMap((trajectories) =>
        Effect.map(
          traceRef,
          (trace): TrajectoryGroup => ({
            promptUid: prompt.row.uid ?? `cursor-${prompt.cursor}`,
            cursor: prompt.cursor,
            dataSource: prompt.row.data_source,
            envClass: prompt.row.env_class,
            trajectories,
            ...(trace === undefined ? {} : { trace })
          })
        )
      ),
      Effect.flatMap((g) => judged(prompt.row, g, o.judge)),
      Effect.flatMap((g) => (o.teacher === undefined ? Effect.succeed(g) : o.teacher(g))),
      Effect.withSpan(Spans.names.group, {
        attributes: { "prompt.uid": prompt.row.uid ?? `cursor-${prompt.cursor}`, "prompt.cursor": prompt.cursor }
      }),
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
