import { existsSync, mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Stream } from "effect"
import * as Dataset from "../../src/data/Dataset.ts"
import * as DependentSpecs from "../../src/data/DependentSpecs.ts"
import { DatasetError } from "../../src/domain/Errors.ts"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import * as McpToolEnv from "../../src/env/McpToolEnv.ts"
import * as ToolIo from "../../src/env/ToolIo.ts"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as Servers from "../env/McpServers.ts"
import * as Cli from "../fixtures/Cli.ts"

const specsFile = "test/fixtures/specs/dependent-specs.jsonl"
const specs = readFileSync(specsFile, "utf8")
  .trim()
  .split("\n")
  .map((line) => JSON.parse(line) as unknown)

const convert = (raw: unknown, index = 1, options = DependentSpecs.defaultOptions) =>
  DependentSpecs.convert(raw, "specs.jsonl", index, "specs.jsonl", options)

const rowOf = (raw: unknown, index = 1, options = DependentSpecs.defaultOptions): PromptRow => {
  const out = convert(raw, index, options)
  if (out instanceof DatasetError) throw new Error(out.message)
  return out
}

const problemOf = (raw: unknown): string => {
  const out = convert(raw, 4)
  assert.instanceOf(out, DatasetError)
  return (out as DatasetError).message
}

describe("DependentSpecs", () => {
  it("turn-based: system + one user message, every call in the sequence, $refs resolved from recorded results", () => {
    const row = rowOf(specs[0], 1)
    assert.strictEqual(row.uid, "carol-first-order")
    assert.strictEqual(row.env_class, "mcp_tool")
    assert.deepStrictEqual(row.prompt, [
      { role: "system", content: "You are a shop assistant." },
      {
        role: "user",
        content: "What did Carol Evans buy in her first order?\n\nAnd what did that order cost in total?"
      }
    ])
    assert.deepStrictEqual(row.reward_spec, {
      method: "rule",
      ground_truth: {
        tool_sequence: [
          { tool: "find_customer", server: "toolbox", arguments: { name: "Carol Evans" } },
          { tool: "get_orders", server: "toolbox", arguments: { customer_id: "C003" } },
          { tool: "get_order", server: "toolbox", arguments: { order_id: "O1004" } },
          { tool: "multiply", server: "toolbox", arguments: { a: 3, b: 10 } }
        ],
        order: "subsequence",
        answer: 30,
        answer_match: "numeric",
        weights: { answer: 0.8, tool_sequence: 0.2 }
      }
    })
    assert.deepStrictEqual(row.extra_info, {
      spec_id: "carol-first-order",
      server: "toolbox",
      turns: 2,
      calls: 4,
      unresolved_arguments: 0,
      max_turns: 6
    })
  })

  it("message-based: tool results answer tool_call_ids; follow-ups dropped on request; order kept", () => {
    const row = rowOf(specs[1], 2, { ...DependentSpecs.defaultOptions, followUps: "drop", sequenceWeight: 0.5 })
    assert.deepStrictEqual(row.prompt, [
      { role: "system", content: "Use the tools for arithmetic." },
      { role: "user", content: "Add 2 and 3." }
    ])
    const truth = row.reward_spec!.ground_truth as Record<string, unknown>
    assert.deepStrictEqual(truth["tool_sequence"], [
      { tool: "add", arguments: { a: 2, b: 3 } },
      { tool: "multiply", arguments: { a: "5", b: 4 } }
    ])
    assert.strictEqual(truth["order"], "strict")
    assert.deepStrictEqual(truth["weights"], { answer: 0.5, tool_sequence: 0.5 })
  })

  it("a $ref to a call with no recorded result leaves that argument out and counts it; --server fills the server", () => {
    const row = rowOf(specs[2], 3, { ...DependentSpecs.defaultOptions, server: "toolbox" })
    assert.strictEqual(row.uid, "specs.jsonl#3")
    assert.deepStrictEqual((row.reward_spec!.ground_truth as Record<string, unknown>)["tool_sequence"], [
      { tool: "find_customer", server: "toolbox", arguments: { name: "Bob Stone" } },
      { tool: "get_orders", server: "toolbox", arguments: {} }
    ])
    assert.strictEqual(row.extra_info?.["unresolved_arguments"], 1)
  })

  it("a bad spec is an error naming the file, row and key", () => {
    const call = (args: unknown, extra: Record<string, unknown> = {}) => ({
      turns: [
        {
          user: "u",
          calls: [
            { id: "a", tool: "t", result: '{"x": 1}' },
            { tool: "t", arguments: args }
          ]
        }
      ],
      ...extra
    })
    assert.strictEqual(
      problemOf(call({ v: { $ref: "nope" } })),
      'specs.jsonl:4: turns[0].calls[1].arguments.v.$ref: "nope" names no call (give the call an "id")'
    )
    assert.strictEqual(
      problemOf(call({ v: { $ref: "a", path: "y" } })),
      'specs.jsonl:4: turns[0].calls[1].arguments.v.path: "y" is not in the result of "a"'
    )
    assert.strictEqual(
      problemOf(call("{not json")),
      "specs.jsonl:4: turns[0].calls[1].arguments: not JSON: Expected property name or '}' in JSON at position 1 (line 1 column 2)"
    )
    assert.match(
      problemOf(call({}, { order: "sideways" })),
      /^specs\.jsonl:4: the ground truth it gives is not a valid/
    )
    assert.strictEqual(problemOf({ turns: [{ user: "hi" }] }), "specs.jsonl:4: turns: has no tool call")
    assert.strictEqual(problemOf({ id: 3, turns: [] }), "specs.jsonl:4: turns: must be a non-empty array")
    assert.strictEqual(
      problemOf({ messages: [{ role: "robot", content: "x" }] }),
      'specs.jsonl:4: messages[0].role: unknown role "robot": system, user, assistant or tool'
    )
    assert.strictEqual(problemOf({ system: "s" }), "specs.jsonl:4: turns: missing: a spec needs turns (or messages)")
  })

  it.effect("the converted row runs on McpToolEnv with the toolbox server: the scripted solution earns reward 1", () =>
    Effect.gen(function* () {
      const row = rowOf(specs[0], 1)
      const env = yield* McpToolEnv.make(row, { toolCallFormat: "hermes", maxTurns: 6 })
      yield* env.init(row.prompt)
      const call = (name: string, args: Record<string, unknown>) =>
        `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`
      const script = [
        call("find_customer", { name: "Carol Evans" }),
        call("get_orders", { customer_id: "C003" }),
        call("get_order", { order_id: "O1004" }),
        call("multiply", { a: 3, b: 10 }),
        "<answer>30</answer>"
      ]
      let last = 0
      for (const text of script) last = (yield* env.step(text)).reward
      assert.strictEqual(last, 1)
      const metrics = yield* env.metrics
      assert.strictEqual(metrics["reward/tool_sequence_match"], 1)
      // skipping the lookup of the orders: outcome 0, partial credit 3/4 of the sequence weight
      const partial = yield* McpToolEnv.make(row, { toolCallFormat: "hermes", maxTurns: 6 })
      yield* partial.init(row.prompt)
      let reward = 0
      for (const text of [script[0]!, script[2]!, script[3]!, script[4]!]) reward = (yield* partial.step(text)).reward
      assert.closeTo(reward, 0.2 * 0.75, 1e-9)
    }).pipe(
      Effect.scoped,
      Effect.provide(ToolIo.layerLive.pipe(Layer.provide(McpClient.layer({ servers: [Servers.toolbox()] }))))
    )
  )

  it("data convert dependent-specs writes the rows and lists bad specs by file, row and key (nothing written)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "specs-"))
    const out = join(dir, "rows.jsonl")
    const ok = Cli.run(["data", "convert", "dependent-specs", "--in", specsFile, "--out", out, "--server", "toolbox"])
    assert.strictEqual(ok.code, 0, ok.stderr)
    assert.deepStrictEqual(JSON.parse(ok.lastLine), { in: resolve(specsFile), out, rows: 3, calls: 8, unresolved: 1 })
    const rows = readFileSync(out, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as PromptRow)
    assert.deepStrictEqual(rows[0], rowOf(specs[0], 1, { ...DependentSpecs.defaultOptions, server: "toolbox" }))
    // every row reads back through the dataset reader (the PromptRow schema)
    const read = await Effect.runPromise(Stream.runCollect(Dataset.read(out)).pipe(Effect.provide(NodeServices.layer)))
    assert.strictEqual(read.length, 3)

    const badOut = join(dir, "bad.jsonl")
    const bad = Cli.run([
      "data",
      "convert",
      "dependent-specs",
      "--in",
      "test/fixtures/specs/bad-specs.jsonl",
      "--out",
      badOut
    ])
    assert.strictEqual(bad.code, 1)
    const badFile = resolve("test/fixtures/specs/bad-specs.jsonl")
    assert.include(
      bad.stderr,
      `${badFile}:1: turns[0].calls[0].arguments.order_id.$ref: "later" is a later call: a call can only use results of calls before it`
    )
    assert.include(bad.stderr, `${badFile}:2: turns: has no tool call`)
    assert.include(bad.stderr, `2 of 2 specs of ${badFile} are invalid; nothing written`)
    assert.isFalse(existsSync(badOut))
  })
})
