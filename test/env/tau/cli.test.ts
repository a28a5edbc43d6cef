import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as TauBenchConverter from "../../../src/data/TauBenchConverter.ts"
import * as Db from "../../../src/env/tau/Db.ts"
import * as Cli from "../../fixtures/Cli.ts"

const dataDir = path.resolve("../shared/tau-bench")
const tmp = () => mkdtempSync(path.join(tmpdir(), "effect-rl-tau-"))
const jsonLines = (text: string) =>
  text
    .trim()
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, unknown>)

interface GoldenTask {
  split: string
  id: number
  canonical_hash: string
}
const airlineGolden = JSON.parse(readFileSync(path.join(dataDir, "airline", "golden.json"), "utf8")) as {
  tasks: Array<GoldenTask>
}

describe("TauBenchConverter.convert", () => {
  it.effect("--train-ratio 0.8 splits airline's 50 test tasks 40/10, disjoint, the same every time", () =>
    Effect.gen(function* () {
      const data = yield* Db.loadDomain(dataDir, "airline").pipe(Effect.provide(NodeServices.layer))
      const first = TauBenchConverter.convert(data, "test", 0.8)
      const again = TauBenchConverter.convert(data, "test", 0.8)
      assert.deepStrictEqual([first.train.length, first.val.length], [40, 10])
      const ids = [...first.train, ...first.val].map((r) => r.extra_info!["task_id"] as number).sort((x, y) => x - y)
      assert.deepStrictEqual(
        ids,
        Array.from({ length: 50 }, (_, i) => i)
      )
      assert.deepStrictEqual(again, first)
      assert.deepStrictEqual(TauBenchConverter.splits(data), ["test"])
      assert.strictEqual(TauBenchConverter.valFile("out/retail-train.jsonl"), "out/retail-train.val.jsonl")
    })
  )
})

describe("effect-rl data convert tau-bench → env check", () => {
  it("writes SkyRL rows for every airline task; env check replays them: reward 1 each, the 10 golden hashes", () => {
    const dir = tmp()
    const out = path.join(dir, "airline.jsonl")
    const run = Cli.run([
      "data",
      "convert",
      "tau-bench",
      "--domain",
      "airline",
      "--split",
      "test",
      "--data",
      dataDir,
      "--out",
      out
    ])
    assert.strictEqual(run.code, 0, run.stderr)
    assert.deepStrictEqual(JSON.parse(run.lastLine), {
      domain: "airline",
      split: "test",
      train: { file: out, rows: 50 }
    })
    const rows = jsonLines(readFileSync(out, "utf8"))
    const tasks = JSON.parse(readFileSync(path.join(dataDir, "airline", "tasks.json"), "utf8")) as Array<{
      id: number
      actions: unknown
      outputs: unknown
      instruction: string
    }>
    const row = rows[7]!
    const info = row["extra_info"] as { task_id: number; domain: string; split: string; instruction: string }
    const task = tasks[7]!
    assert.strictEqual(row["env_class"], "tau_bench")
    assert.deepStrictEqual(row["reward_spec"], {
      method: "tau_bench",
      ground_truth: { actions: task.actions, outputs: task.outputs }
    })
    assert.deepStrictEqual(
      [info.task_id, info.domain, info.split, info.instruction],
      [7, "airline", "test", task.instruction]
    )
    assert.deepStrictEqual(row["prompt"], [
      { role: "system", content: readFileSync(path.join(dataDir, "airline", "wiki.md"), "utf8") }
    ])

    const golden = path.join(dataDir, "airline", "golden.json")
    const check = Cli.run(["env", "check", "--config", "configs/tau-retail.yaml", "--tasks", out, "--expect", golden])
    assert.strictEqual(check.code, 0, check.stderr)
    const lines = jsonLines(check.stdout)
    assert.strictEqual(lines.length, 51)
    assert.deepStrictEqual(lines.at(-1), {
      tasks: 50,
      reward_mean: 1,
      passed: 50,
      failed: [],
      expected: { checked: 10, mismatched: 0 }
    })
    for (const g of airlineGolden.tasks) {
      assert.deepStrictEqual(
        lines.find((l) => l["task"] === g.id),
        { task: g.id, split: "test", reward: 1, hash: g.canonical_hash }
      )
    }
  })
})

describe("effect-rl env check", () => {
  it("reads a tau-bench tasks.json too, and exits 1 naming the task whose hash differs from --expect", () => {
    const dir = tmp()
    const tasks = JSON.parse(readFileSync(path.join(dataDir, "airline", "tasks.json"), "utf8")) as Array<{ id: number }>
    writeFileSync(path.join(dir, "tasks.json"), JSON.stringify(tasks.filter((t) => t.id === 0 || t.id === 1)))
    const wrong = { tasks: airlineGolden.tasks.map((t) => (t.id === 1 ? { ...t, canonical_hash: "0".repeat(64) } : t)) }
    writeFileSync(path.join(dir, "golden.json"), JSON.stringify(wrong))
    const run = Cli.run([
      "env",
      "check",
      "--config",
      "configs/tau-retail.yaml",
      "--tasks",
      path.join(dir, "tasks.json"),
      "--data",
      dataDir,
      "--expect",
      path.join(dir, "golden.json"),
      "environment.tau.domain=airline"
    ])
    assert.strictEqual(run.code, 1)
    const lines = jsonLines(run.stdout)
    assert.strictEqual(lines[0]!["hash"], airlineGolden.tasks.find((t) => t.id === 0)!.canonical_hash)
    assert.strictEqual(lines[1]!["expected"], "0".repeat(64))
    assert.deepStrictEqual(lines.at(-1)!["expected"], { checked: 2, mismatched: 1 })
    assert.match(run.stderr, /1 hashes differ from the expected/)
  })

  it("checks mcp_tool rows by their tool_sequence on the config's MCP servers", () => {
    const dir = tmp()
    const rows = readFileSync("data/toolbox/val.jsonl", "utf8").split("\n").slice(0, 3).join("\n")
    writeFileSync(path.join(dir, "rows.jsonl"), `${rows}\n`)
    const run = Cli.run(["env", "check", "--config", "configs/tiny.yaml", "--tasks", path.join(dir, "rows.jsonl")])
    assert.strictEqual(run.code, 0, run.stderr)
    const lines = jsonLines(run.stdout)
    assert.deepStrictEqual(
      lines.slice(0, 3).map((l) => [l["task"], l["reward"]]),
      [
        ["toolbox-val-00000", 1],
        ["toolbox-val-00001", 1],
        ["toolbox-val-00002", 1]
      ]
    )
    assert.deepStrictEqual(lines.at(-1), { tasks: 3, reward_mean: 1, passed: 3, failed: [] })
  })
})
