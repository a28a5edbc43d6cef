/**
 * Held-out evaluation (SkyRL's eval): `eval_n_samples_per_prompt` samples of every validation prompt with the eval
 * sampling settings (greedy by default), scored by the environment's reward.
 *   eval/<data_source>/avg_score  = mean reward over all samples of that source
 *   eval/<data_source>/pass_at_n  = share of prompts with at least one sample scoring > 0 (SkyRL's definition)
 * plus the same over every source as `all`.
 */
import { Effect, Stream } from "effect"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import { Generator, type GeneratorOptions } from "../generator/Generator.ts"

export interface Score {
  readonly avg_score: number
  readonly pass_at_n: number
  readonly prompts: number
}

export type Report = Readonly<Record<string, Score>> // by data source, and "all"

export const score = (groups: ReadonlyArray<TrajectoryGroup>): Report => {
  const bySource = new Map<string, Array<TrajectoryGroup>>()
  for (const g of groups) bySource.set(g.dataSource, [...(bySource.get(g.dataSource) ?? []), g])
  const of = (gs: ReadonlyArray<TrajectoryGroup>): Score => {
    const rewards = gs.flatMap((g) => g.trajectories.map((t) => t.reward))
    return {
      avg_score: rewards.length === 0 ? 0 : rewards.reduce((a, b) => a + b, 0) / rewards.length,
      pass_at_n: gs.length === 0 ? 0 : gs.filter((g) => g.trajectories.some((t) => t.reward > 0)).length / gs.length,
      prompts: gs.length
    }
  }
  return Object.fromEntries([...[...bySource].map(([source, gs]) => [source, of(gs)] as const), ["all", of(groups)]])
}

/** Flatten a report into metric keys: `eval/<source>/avg_score`, `eval/<source>/pass_at_n`. */
export const metrics = (report: Report): Record<string, number> =>
  Object.fromEntries(
    Object.entries(report).flatMap(([source, s]) => [
      [`eval/${source}/avg_score`, s.avg_score],
      [`eval/${source}/pass_at_n`, s.pass_at_n]
    ])
  )

export const run = Effect.fn("Evaluator.run")(function* (
  rows: ReadonlyArray<PromptRow>,
  overrides: Partial<GeneratorOptions>
) {
  const generator = yield* Generator
  const groups = yield* Stream.runCollect(
    generator.rollouts(Stream.fromIterable(rows.map((row, cursor) => ({ row, cursor }))), overrides)
  )
  return { report: score(groups), groups }
})
