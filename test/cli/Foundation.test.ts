import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"

const tmp = mkdtempSync(join(tmpdir(), "effect-rl-cli-"))

describe("effect-rl CLI", () => {
  it("lists its commands in --help", () => {
    const result = Cli.run(["--help"])
    assert.strictEqual(result.code, 0)
    for (const command of ["config", "data"]) assert.include(result.stdout, command)
  })

  it("config check prints the resolved config and exits 0", () => {
    const result = Cli.run(["config", "check", "--config", "configs/tiny.yaml", "trainer.max_steps=2"])
    assert.strictEqual(result.code, 0, result.stderr)
    assert.include(result.stdout, "max_steps: 2")
    assert.include(result.stdout, "eps_clip_high: 0.28")
  })

  it("config check exits non-zero naming trainer.algorithm.eps_clip_low when it has a wrong type", () => {
    const file = join(tmp, "bad.yaml")
    writeFileSync(
      file,
      "model:\n  init: {}\ntokenizer:\n  kind: byte\ntrainer:\n  algorithm:\n    eps_clip_low: wide\n"
    )
    const result = Cli.run(["config", "check", "--config", file])
    assert.notStrictEqual(result.code, 0)
    assert.include(result.stderr, "trainer.algorithm.eps_clip_low")
    assert.include(result.stderr, '"wide"')
  })

  it("data inspect reports a JSONL whose row 7 lacks prompt as FILE:7: and exits non-zero", () => {
    const file = join(tmp, "rows.jsonl")
    const rows = Array.from({ length: 10 }, (_, i) => ({
      data_source: "toolbox",
      env_class: "mcp_tool",
      ...(i + 1 === 7 ? {} : { prompt: [{ role: "user", content: `task ${i + 1}` }] })
    }))
    writeFileSync(file, rows.map((r) => JSON.stringify(r)).join("\n"))
    const result = Cli.run(["data", "inspect", file])
    assert.notStrictEqual(result.code, 0)
    assert.include(result.stderr, `${file}:7: prompt: Missing key`)
    const stats = JSON.parse(result.lastLine)
    assert.strictEqual(stats.rows, 10)
    assert.strictEqual(stats.badRows, 1)
    assert.deepStrictEqual(stats.envClasses, { mcp_tool: 9 })
  })
})
