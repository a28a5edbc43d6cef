import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as ToolboxTasks from "../../src/data/ToolboxTasks.ts"
import type { Message } from "../../src/domain/Message.ts"
import { PromptRow } from "../../src/domain/PromptRow.ts"
import type { ToolCallRecord } from "../../src/domain/ToolCall.ts"
import * as McpToolEnv from "../../src/env/McpToolEnv.ts"
import * as Rewards from "../../src/env/Rewards.ts"
import * as ToolCallParser from "../../src/env/ToolCallParser.ts"
import * as ToolIo from "../../src/env/ToolIo.ts"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as Servers from "../env/McpServers.ts"
import * as Cli from "../fixtures/Cli.ts"

const root = resolve(import.meta.dirname, "../..")
/** The committed dataset and the command its README gives. */
const committed = { dir: join(root, "data/toolbox"), seed: 1, train: 2000, val: 200 }
const data = ToolboxTasks.generate({ seed: committed.seed, train: committed.train, val: committed.val })
const rows = [...data.train, ...data.val]

interface ExpectedCall {
  readonly tool: string
  readonly arguments: Record<string, unknown>
}
const truthOf = (row: PromptRow) =>
  row.reward_spec!.ground_truth as {
    readonly tool_sequence: ReadonlyArray<ExpectedCall>
    readonly answer: string | number
    readonly answer_match: string
  }
const familyOf = (row: PromptRow) => row.extra_info!["family"] as ToolboxTasks.Family

/** Values a later call may take from an output: the text, its comma-separated parts, a JSON object's fields. */
const valuesIn = (output: string): Set<string> => {
  const values = new Set([output, ...output.split(",")])
  if (output.startsWith("{")) for (const v of Object.values(JSON.parse(output) as object)) values.add(String(v))
  return values
}

const recordsFor = (calls: ReadonlyArray<ExpectedCall>, outputs: ReadonlyArray<string>): Array<ToolCallRecord> =>
  calls.map((c, i) => ({
    id: "call_0",
    server: "toolbox",
    tool: c.tool,
    arguments: c.arguments,
    result: outputs[i]!,
    isError: false,
    ms: 0
  }))

describe("ToolboxTasks", () => {
  it("the same seed gives byte-identical files; another seed gives other tasks", () => {
    const again = ToolboxTasks.generate({ seed: 1, train: 2000, val: 200 })
    assert.strictEqual(ToolboxTasks.toJsonl(again.train), ToolboxTasks.toJsonl(data.train))
    assert.strictEqual(ToolboxTasks.toJsonl(again.val), ToolboxTasks.toJsonl(data.val))
    assert.strictEqual(ToolboxTasks.toJsonl(again.demos), ToolboxTasks.toJsonl(data.demos))
    const other = ToolboxTasks.generate({ seed: 2, train: 2000, val: 200 })
    assert.notStrictEqual(ToolboxTasks.toJsonl(other.train), ToolboxTasks.toJsonl(data.train))
  })

  it("the committed data/toolbox is what the README's command writes, and stays small", () => {
    const sizes = ["train", "val", "demos"].map((name) => {
      const text = readFileSync(join(committed.dir, `${name}.jsonl`), "utf8")
      const expected = ToolboxTasks.toJsonl(data[name as "train" | "val" | "demos"])
      assert.strictEqual(text, expected, `${name}.jsonl differs from the generator's output for seed 1`)
      return Buffer.byteLength(text)
    })
    assert.isBelow(
      sizes.reduce((a, b) => a + b, 0),
      3_000_000
    )
    const readme = readFileSync(join(committed.dir, "README.md"), "utf8")
    assert.include(
      readme,
      `data generate toolbox --seed ${committed.seed} --train ${committed.train} --val ${committed.val} --out data/toolbox`
    )
  })

  it.effect("rows are SkyRL rows with a valid rule ground truth, a stable uid, and balanced families", () =>
    Effect.gen(function* () {
      for (const row of rows) {
        Schema.decodeUnknownSync(PromptRow)(row)
        const truth = yield* Rewards.decodeGroundTruth(row.reward_spec!.ground_truth)
        assert.deepStrictEqual([truth.weights.answer, truth.weights.tool_sequence], [0.8, 0.2])
        assert.strictEqual(truth.order, "subsequence")
        assert.strictEqual(row.data_source, "toolbox")
        assert.strictEqual(row.env_class, "mcp_tool")
        assert.strictEqual(row.prompt.length, 1)
        assert.isBelow(row.prompt[0]!.content.length, 60) // tiny byte-level policies read these
        const info = row.extra_info!
        assert.strictEqual(row.uid, `toolbox-${info["split"]}-${String(info["index"]).padStart(5, "0")}`)
        assert.strictEqual(info["max_turns"], truth.tool_sequence!.length + 2)
      }
      assert.strictEqual(new Set(rows.map((r) => r.uid)).size, rows.length)
      assert.deepStrictEqual(
        ToolboxTasks.countByFamily(data.train),
        Object.fromEntries(ToolboxTasks.families.map((f) => [f, 250]))
      )
      assert.deepStrictEqual(
        ToolboxTasks.countByFamily(data.val),
        Object.fromEntries(ToolboxTasks.families.map((f) => [f, 25]))
      )
    })
  )

  it("every task makes ≥ 2 calls, each after the first taking an argument from the previous call's output", () => {
    for (const [i, demo] of data.demos.entries()) {
      const expected = truthOf(data.train[i]!).tool_sequence
      assert.isAtLeast(expected.length, 2)
      const outputs = demo.messages.filter((m) => m.role === "tool").map((m) => m.content)
      for (let k = 1; k < expected.length; k++) {
        const used = Object.values(expected[k]!.arguments).map(String)
        const previous = valuesIn(outputs[k - 1]!)
        assert.isTrue(
          used.some((v) => previous.has(v)),
          `${demo.uid} call ${k + 1} ${JSON.stringify(expected[k])} uses nothing from ${outputs[k - 1]}`
        )
      }
    }
  })

  it("val prompts of families with many distinct tasks are not in train; only record families repeat", () => {
    const trainPrompts = new Set(data.train.map((r) => r.prompt[0]!.content))
    for (const row of data.val) {
      if (familyOf(row) === "customer_orders" || familyOf(row) === "customer_spend") continue
      assert.isFalse(trainPrompts.has(row.prompt[0]!.content), row.prompt[0]!.content)
    }
    assert.deepStrictEqual(Object.keys(data.repeats.train).sort(), ["customer_orders", "customer_spend"])
  })

  it.effect(
    "demonstrations parse back into the expected calls and score reward 1; partial progress earns a little",
    () =>
      Effect.gen(function* () {
        for (const [i, demo] of data.demos.entries()) {
          const row = data.train[i]!
          const truth = truthOf(row)
          assert.strictEqual(demo.uid, row.uid)
          assert.strictEqual(demo.family, familyOf(row))
          assert.deepStrictEqual(demo.messages[0], row.prompt[0])
          const assistant = demo.messages.filter((m) => m.role === "assistant")
          const tool = demo.messages.filter((m): m is Message => m.role === "tool")
          assert.strictEqual(assistant.length, truth.tool_sequence.length + 1)
          // the format McpToolEnv's system prompt asks for (hermes), read the way the env reads it (auto)
          for (const [k, message] of assistant.slice(0, -1).entries()) {
            for (const format of ["hermes", "auto"] as const) {
              const parsed = ToolCallParser.parse(message.content, format)
              assert.isUndefined(parsed.error)
              assert.isUndefined(parsed.finalAnswer)
              assert.deepStrictEqual(
                parsed.calls.map((c) => ({ tool: c.name, arguments: c.arguments })),
                [truth.tool_sequence[k]]
              )
            }
            assert.strictEqual(tool[k]!.name, truth.tool_sequence[k]!.tool)
          }
          const final = ToolCallParser.parse(assistant.at(-1)!.content, "hermes")
          assert.deepStrictEqual(final.calls, [])
          assert.strictEqual(final.finalAnswer, String(truth.answer))
          const outputs = tool.map((m) => m.content)
          const calls = recordsFor(truth.tool_sequence, outputs)
          const full = yield* Rewards.evaluate(row.reward_spec, {
            calls,
            finalAnswer: final.finalAnswer,
            turn: 0,
            done: true
          })
          assert.strictEqual(full.reward, 1)
          assert.strictEqual(full.metrics["reward/outcome"], 1)
          // the right first call, then a wrong answer: 0.2 · 1/n; the right answer without the calls: 0
          const n = truth.tool_sequence.length
          const partial = yield* Rewards.evaluate(row.reward_spec, {
            calls: calls.slice(0, 1),
            finalAnswer: "0",
            turn: 1,
            done: true
          })
          assert.closeTo(partial.reward, 0.2 / n, 1e-12)
          const guessed = yield* Rewards.evaluate(row.reward_spec, {
            calls: [],
            finalAnswer: final.finalAnswer,
            turn: 0,
            done: true
          })
          assert.strictEqual(guessed.reward, 0)
        }
      })
  )

  it("knobs: maxChain lengthens arith_chain, families restricts the mix, bad knobs are refused", () => {
    const long = ToolboxTasks.generate({ seed: 3, train: 200, val: 0, families: ["arith_chain"], maxChain: 5 })
    const lengths = long.train.map((r) => truthOf(r).tool_sequence.length)
    assert.deepStrictEqual([Math.min(...lengths), Math.max(...lengths)], [2, 5])
    assert.deepStrictEqual(ToolboxTasks.countByFamily(long.train), { arith_chain: 200 })
    const short = ToolboxTasks.generate({ seed: 3, train: 200, val: 0, families: ["arith_chain"] })
    assert.strictEqual(Math.max(...short.train.map((r) => truthOf(r).tool_sequence.length)), 3)
    assert.throws(() => ToolboxTasks.generate({ seed: 3, train: 1, val: 0, maxChain: 1 }), /maxChain/)
    assert.throws(() => ToolboxTasks.generate({ seed: 3, train: 1, val: 0, families: [] }), /no families/)
  })

  it("data generate toolbox writes the generator's bytes and ends with counts per split and family as JSON", () => {
    const out = mkdtempSync(join(tmpdir(), "effect-rl-toolbox-"))
    const result = Cli.run(["data", "generate", "toolbox", "--seed", "9", "--train", "40", "--val", "16", "--out", out])
    assert.strictEqual(result.code, 0, result.stderr)
    const expected = ToolboxTasks.generate({ seed: 9, train: 40, val: 16 })
    for (const name of ["train", "val", "demos"] as const) {
      assert.strictEqual(readFileSync(join(out, `${name}.jsonl`), "utf8"), ToolboxTasks.toJsonl(expected[name]))
    }
    const summary = JSON.parse(result.lastLine)
    assert.deepStrictEqual(summary.counts.train, Object.fromEntries(ToolboxTasks.families.map((f) => [f, 5])))
    assert.deepStrictEqual(summary.counts.val, Object.fromEntries(ToolboxTasks.families.map((f) => [f, 2])))
    // files that exist are never overwritten without --force
    const again = Cli.run(["data", "generate", "toolbox", "--seed", "10", "--train", "8", "--val", "8", "--out", out])
    assert.notStrictEqual(again.code, 0)
    assert.include(again.stderr, "--force")
    assert.strictEqual(readFileSync(join(out, "train.jsonl"), "utf8"), ToolboxTasks.toJsonl(expected.train))
    const forced = Cli.run([
      "data",
      "generate",
      "toolbox",
      "--seed",
      "10",
      "--train",
      "8",
      "--val",
      "8",
      "--out",
      out,
      "--force"
    ])
    assert.strictEqual(forced.code, 0, forced.stderr)
    assert.notStrictEqual(readFileSync(join(out, "train.jsonl"), "utf8"), ToolboxTasks.toJsonl(expected.train))
    const bad = Cli.run(["data", "generate", "toolbox", "--seed", "1", "--families", "arith_chain,nope", "--out", out])
    assert.notStrictEqual(bad.code, 0)
    assert.include(bad.stderr, "unknown families: nope")
  })

  it("--exclude drops the train tasks (and demos) whose prompt is in another file, keeping the others' bytes", () => {
    const out = mkdtempSync(join(tmpdir(), "effect-rl-toolbox-"))
    const full = ToolboxTasks.generate({ seed: 9, train: 40, val: 0 })
    const held = full.train.filter((_, i) => i % 3 === 0) // 14 rows to hold out
    const heldFile = join(out, "held.jsonl")
    writeFileSync(heldFile, ToolboxTasks.toJsonl(held))
    const result = Cli.run([
      "data",
      "generate",
      "toolbox",
      "--seed",
      "9",
      "--train",
      "40",
      "--val",
      "0",
      "--out",
      out,
      "--exclude",
      heldFile
    ])
    assert.strictEqual(result.code, 0, result.stderr)
    const heldPrompts = new Set(held.map(ToolboxTasks.promptText))
    const kept = full.train.map((row) => !heldPrompts.has(ToolboxTasks.promptText(row)))
    assert.isAtLeast(kept.filter((k) => !k).length, held.length) // record families repeat prompts: maybe more
    assert.include(result.stdout, `dropped ${kept.filter((k) => !k).length} train tasks`)
    assert.strictEqual(
      readFileSync(join(out, "train.jsonl"), "utf8"),
      ToolboxTasks.toJsonl(full.train.filter((_, i) => kept[i]))
    )
    assert.strictEqual(
      readFileSync(join(out, "demos.jsonl"), "utf8"),
      ToolboxTasks.toJsonl(full.demos.filter((_, i) => kept[i]))
    )
  })
})

const Toolbox = McpClient.layer({ servers: [Servers.toolbox()] })

layer(Toolbox, { excludeTestServices: true })("ToolboxTasks against the real toolbox server", (it) => {
  it.effect(
    "every expected call of every row answers, over MCP, exactly what the row expects; the last is the answer",
    () =>
      Effect.gen(function* () {
        const client = yield* McpClient.McpClient
        const demoOutputs = new Map(
          data.demos.map((d) => [d.uid, d.messages.filter((m) => m.role === "tool").map((m) => m.content)])
        )
        for (const row of rows) {
          const truth = truthOf(row)
          const outputs: Array<string> = []
          for (const call of truth.tool_sequence) outputs.push((yield* client.call(call.tool, call.arguments)).text)
          const demo = demoOutputs.get(row.uid!)
          if (demo !== undefined) assert.deepStrictEqual(outputs, demo, row.uid)
          assert.strictEqual(outputs.at(-1), String(truth.answer), row.uid)
          assert.strictEqual(truth.answer_match, typeof truth.answer === "number" ? "numeric" : "normalized")
        }
      })
  )

  it.effect(
    "replayed through McpToolEnv, a demonstration of each family gets the demo's observations and reward 1",
    () =>
      Effect.gen(function* () {
        const toolIo = yield* ToolIo.ToolIo
        for (const family of ToolboxTasks.families) {
          const i = data.train.findIndex((r) => familyOf(r) === family)
          const row = data.train[i]!
          const demo = data.demos[i]!
          const env = yield* McpToolEnv.make(row, { toolCallFormat: "auto", maxTurns: 10 }).pipe(
            Effect.provideService(ToolIo.ToolIo, toolIo)
          )
          const { messages } = yield* env.init(row.prompt)
          assert.match(messages[0]!.content, /<tool_call>/) // the format the demos are written in
          const transcript: Array<Message> = [...row.prompt]
          let last = { reward: 0, done: false }
          for (const message of demo.messages.filter((m) => m.role === "assistant")) {
            const step = yield* env.step(message.content)
            transcript.push(message, ...step.observations)
            last = step
          }
          assert.deepStrictEqual(transcript, demo.messages, family)
          assert.deepStrictEqual(last, { ...last, reward: 1, done: true })
        }
      }).pipe(Effect.provide(ToolIo.layerLive), Effect.scoped)
  )
})
