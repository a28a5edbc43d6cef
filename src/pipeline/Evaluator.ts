/**
 * Held-out evaluation (SkyRL's eval): `eval_n_samples_per_prompt` samples of every validation prompt with the eval
 * sampling settings (greedy by default), scored by the environment's reward.
 *   eval/<data_source>/avg_score  = mean reward over all samples of that source
 *   eval/<data_source>/pass_at_n  = share of prompts with at least one sample scoring > 0 (SkyRL's definition)
 * plus the same over every source as `all`. With `trainer.eval_group_by: KEY`, also per value of the rows'
 * `extra_info.KEY` within each source: `eval/<data_source>/KEY=<value>/…` (e.g. the toolbox tasks per family).
 */
import { Clock, Effect, Stream } from "effect"
import type { RunConfig } from "../config/RunConfig.ts"
import * as Dataset from "../data/Dataset.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import { Generator, type GeneratorOptions } from "../generator/Generator.ts"
import { Metrics } from "../metrics/Metrics.ts"

export interface Score {
  readonly avg_score: number
  readonly pass_at_n: number
  readonly prompts: number
}

export type Report = Readonly<Record<string, Score>> // by data source, and "all"

/**
 * Scores by data source, by `<source>/<key>=<value>` where `subgroup` names one for a group (sorted), and `all`.
 */
export const score = (
  groups: ReadonlyArray<TrajectoryGroup>,
  subgroup: (group: TrajectoryGroup) => string | undefined = () => undefined
): Report => {
  const bySource = new Map<string, Array<TrajectoryGroup>>()
  const bySubgroup = new Map<string, Array<TrajectoryGroup>>()
  const add = (map: Map<string, Array<TrajectoryGroup>>, key: string, g: TrajectoryGroup) => {
    const list = map.get(key)
    if (list === undefined) map.set(key, [g])
    else list.push(g)
  }
  for (const g of groups) {
    add(bySource, g.dataSource, g)
    const sub = subgroup(g)
    if (sub !== undefined) add(bySubgroup, `${g.dataSource}/${sub}`, g)
  }
  const of = (gs: ReadonlyArray<TrajectoryGroup>): Score => {
    const rewards = gs.flatMap((g) => g.trajectories.map((t) => t.reward))
    return {
      avg_score: rewards.length === 0 ? 0 : rewards.reduce((a, b) => a + b, 0) / rewards.length,
      pass_at_n: gs.length === 0 ? 0 : gs.filter((g) => g.trajectories.some((t) => t.reward > 0)).length / gs.length,
      prompts: gs.length
    }
  }
  const subgroups = [...bySubgroup].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
  return Object.fromEntries([
    ...[...bySource, ...subgroups].map(([key, gs]) => [key, of(gs)] as const),
    ["all", of(groups)]
  ])
}

/** `KEY=<value>` for a row whose `extra_info.KEY` is a string, number or boolean; otherwise undefined. */
export const subgroupOf = (row: PromptRow | undefined, key: string): string | undefined => {
  const value = Dataset.extraInfoScalar(row, key)
  return value === undefined ? undefined : `${key}=${value}`
}

/** Flatten a report into metric keys: `eval/<source>/avg_score`, `eval/<source>/pass_at_n`. */
export const metrics = (report: Report): Record<string, number> =>
  Object.fromEntries(
    Object.entries(report).flatMap(([source, s]) => [
      [`eval/${source}/avg_score`, s.avg_score],
      [`eval/${source}/pass_at_n`, s.pass_at_n]
    ])
  )

/** The generator settings of an eval: `generator.eval_n_samples_per_prompt` and `generator.eval_sampling`. */
export const optionsOf = (config: RunConfig): Partial<GeneratorOptions> => ({
  samplesPerPrompt: config.generator.eval_n_samples_per_prompt,
  temperature: config.generator.eval_sampling.temperature,
  topP: config.generator.eval_sampling.top_p,
  topK: config.generator.eval_sampling.top_k,
  stopStrings: config.generator.eval_sampling.stop,
  unordered: false,
  teacher: undefined // evaluation groups are never trained on: the distillation teacher does not score them
})

/** Roll out every row and score the groups (`groupBy`: an `extra_info` key to score per value as well). */
export const run = Effect.fn("Evaluator.run")(function* (
  rows: ReadonlyArray<PromptRow>,
  overrides: Partial<GeneratorOptions>,
  groupBy?: string
) {
  const generator = yield* Generator
  const groups = yield* Stream.runCollect(
    generator.rollouts(Stream.fromIterable(rows.map((row, cursor) => ({ row, cursor }))), overrides)
  )
  const subgroup = groupBy === undefined ? undefined : (g: TrajectoryGroup) => subgroupOf(rows[g.cursor], groupBy)
  return { report: score(groups, subgroup), groups }
})

/**
 * Evaluation during a run: on the held-out rows at `step`, recorded as an `eval` metrics event and logged; undefined
 * when there are no held-out rows.
 */
export const atStep = (config: RunConfig, val: ReadonlyArray<PromptRow>) => {
  const evalOptions = optionsOf(config)
  return (label: string, step: number) =>
    Effect.gen(function* () {
      if (val.length === 0) return undefined
      const recorder = yield* Metrics
      const t0 = yield* Clock.currentTimeMillis
      const { report } = yield* run(
        val,
        { ...evalOptions, seed: config.generator.seed + 7919 * step },
        config.trainer.eval_group_by
      )
      const seconds = ((yield* Clock.currentTimeMillis) - t0) / 1000
      yield* recorder.record("eval", step, { ...metrics(report), "timing/eval": seconds })
      const all = report["all"]!
      yield* Effect.logInfo(
        `eval ${label} (step ${step}): avg_score ${all.avg_score.toFixed(3)}, pass@n ${all.pass_at_n.toFixed(3)} over ${all.prompts} prompts`
      )
      return report
    })
}
