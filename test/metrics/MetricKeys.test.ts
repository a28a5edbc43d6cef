/**
 * The metric names of a real run (the tiny async config against the toolbox MCP server) are all in MetricKeys, and
 * the environments' metrics (tool calls, parse failures) reach `metrics.jsonl`.
 */
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as MetricKeys from "../../src/metrics/MetricKeys.ts"
import * as Cli from "../fixtures/Cli.ts"

describe("MetricKeys", () => {
  it("gives a meaning to every name a training run writes, env metrics included", () => {
    const runDir = join(mkdtempSync(join(tmpdir(), "effect-rl-metric-keys-")), "run")
    const result = Cli.run(
      [
        "train",
        "--config",
        "configs/tiny-async.yaml",
        "--run-dir",
        runDir,
        "logging.progress=false",
        "data.max_prompts=4",
        "checkpoint.interval=0"
      ],
      { timeoutMs: 240_000 }
    )
    assert.strictEqual(result.code, 0, result.stderr.slice(-3000))
    const lines = readFileSync(join(runDir, "metrics.jsonl"), "utf8")
      .split("\n")
      .filter((l) => l !== "")
      .map((l) => JSON.parse(l) as Record<string, unknown>)
    const names = new Set(lines.flatMap((l) => Object.keys(l)).filter((k) => !["event", "step", "time"].includes(k)))
    const unknown = [...names].filter((k) => MetricKeys.meaning(k) === undefined)
    assert.deepStrictEqual(unknown, [], "names written by the run but missing from MetricKeys")
    for (const key of ["generate/parse_failure_rate", "env/tool_calls", "env/turns", "reward/avg_raw_reward"]) {
      assert.isTrue(names.has(key), `${key} reaches metrics.jsonl`)
    }
  }, 300_000)

  it("names only registered metrics in the report's charts", () => {
    for (const chart of MetricKeys.charts) {
      for (const key of chart.keys ?? []) assert.isDefined(MetricKeys.meaning(key), `${chart.title}: ${key}`)
      if (chart.match !== undefined) assert.doesNotThrow(() => new RegExp(chart.match!))
    }
  })
})
