import { assert, describe, it } from "@effect/vitest"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import type { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Evaluator from "../../src/pipeline/Evaluator.ts"
import { oneTurn } from "../fixtures/Trajectories.ts"

/** A group of the row at `cursor` whose samples scored `rewards`. */
const group = (cursor: number, dataSource: string, rewards: ReadonlyArray<number>): TrajectoryGroup => ({
  promptUid: `p${cursor}`,
  cursor,
  dataSource,
  envClass: "mcp_tool",
  trajectories: rewards.map((reward, sample) =>
    oneTurn({ uid: `p${cursor}`, sample, prompt: [1], response: [2], reward, rolloutLogprob: -1 })
  )
})

const row = (extra_info?: Record<string, unknown>): PromptRow => ({
  data_source: "toolbox",
  env_class: "mcp_tool",
  prompt: [{ role: "user", content: "q" }],
  ...(extra_info === undefined ? {} : { extra_info })
})

describe("Evaluator.score", () => {
  const groups = [
    group(0, "toolbox", [1, 0]),
    group(1, "toolbox", [0, 0]),
    group(2, "toolbox", [0.5, 0.5]),
    group(3, "math", [1, 1])
  ]

  it("scores each data source and all: avg_score over samples, pass_at_n over prompts", () => {
    const report = Evaluator.score(groups)
    assert.deepStrictEqual(Object.keys(report), ["toolbox", "math", "all"])
    assert.deepStrictEqual(report["toolbox"], { avg_score: 2 / 6, pass_at_n: 2 / 3, prompts: 3 })
    assert.deepStrictEqual(report["all"], { avg_score: 4 / 8, pass_at_n: 3 / 4, prompts: 4 })
  })

  it("with eval_group_by, scores each value of the rows' extra_info key within its source, after the sources", () => {
    const rows = [row({ family: "b" }), row({ family: "a" }), row({ family: "b" }), row()]
    const report = Evaluator.score(groups, (g) => Evaluator.subgroupOf(rows[g.cursor], "family"))
    assert.deepStrictEqual(Object.keys(report), ["toolbox", "math", "toolbox/family=a", "toolbox/family=b", "all"])
    assert.deepStrictEqual(report["toolbox/family=a"], { avg_score: 0, pass_at_n: 0, prompts: 1 })
    assert.deepStrictEqual(report["toolbox/family=b"], { avg_score: 2 / 4, pass_at_n: 1, prompts: 2 })
    assert.deepStrictEqual(report["all"], Evaluator.score(groups)["all"])
    assert.deepStrictEqual(Evaluator.metrics(report)["eval/toolbox/family=b/pass_at_n"], 1)
  })

  it("subgroupOf: only scalar extra_info values name a subgroup", () => {
    assert.strictEqual(Evaluator.subgroupOf(row({ calls: 3 }), "calls"), "calls=3")
    assert.strictEqual(Evaluator.subgroupOf(row({ tags: ["x"] }), "tags"), undefined)
    assert.strictEqual(Evaluator.subgroupOf(row(), "family"), undefined)
    assert.strictEqual(Evaluator.subgroupOf(undefined, "family"), undefined)
  })
})
