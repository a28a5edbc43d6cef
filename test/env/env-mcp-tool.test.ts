import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import * as Env from "../../src/env/Env.ts"
import * as EnvRegistry from "../../src/env/EnvRegistry.ts"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as McpToolEnv from "../../src/env/McpToolEnv.ts"
import * as ToolIo from "../../src/env/ToolIo.ts"
import * as Servers from "./McpServers.ts"

const options: McpToolEnv.McpToolEnvOptions = { toolCallFormat: "hermes", maxTurns: 6 }

const call = (name: string, args: Record<string, unknown>) =>
  `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`

/** "How much did Carol Evans spend on pens?": C003 → O1004 (pen, 3 × 10) → 30. */
const pensRow: PromptRow = {
  data_source: "toolbox",
  env_class: "mcp_tool",
  prompt: [{ role: "user", content: "How much did Carol Evans spend on pens?" }],
  reward_spec: { method: "rule", ground_truth: { answer: 30, must_call_tool: "get_order" } }
}
const pensScript = [
  call("find_customer", { name: "Carol Evans" }),
  call("get_orders", { customer_id: "C003" }),
  call("get_order", { order_id: "O1004" }),
  call("multiply", { a: 3, b: 10 }),
  "<answer>30</answer>"
]

const runScript = (env: Env.Env, script: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const steps: Array<Env.StepResult> = []
    for (const text of script) {
      const out = yield* env.step(text)
      steps.push(out)
      if (out.done) break
    }
    return steps
  })

const LiveEnvs = McpToolEnv.layer(options).pipe(
  Layer.provideMerge(
    Layer.mergeAll(
      EnvRegistry.layer(),
      ToolIo.layerRecord.pipe(Layer.provideMerge(McpClient.layer({ servers: [Servers.toolbox()] })))
    )
  )
)

layer(LiveEnvs, { excludeTestServices: true })("McpToolEnv (live toolbox, record mode)", (it) => {
  it.effect("init adds a system message listing the tools' JSON schemas (toolPrompt system), not metadata.tools", () =>
    Effect.gen(function* () {
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("mcp_tool", pensRow)
      const { messages, metadata } = yield* env.init(pensRow.prompt)
      assert.strictEqual(messages.length, 2)
      assert.strictEqual(messages[0]!.role, "system")
      assert.match(messages[0]!.content, /"name":"find_customer"/)
      assert.match(messages[0]!.content, /<tool_call>/)
      assert.deepStrictEqual(messages[1], pensRow.prompt[0])
      assert.isUndefined(metadata.tools) // listed once: a chat template must not render them again
    })
  )

  it.effect("toolPrompt template leaves the prompt alone and hands the chat template the tools in OpenAI form", () =>
    Effect.gen(function* () {
      const env = yield* McpToolEnv.make(pensRow, { ...options, toolPrompt: "template" })
      const { messages, metadata } = yield* env.init(pensRow.prompt)
      assert.deepStrictEqual(messages, pensRow.prompt)
      assert.strictEqual(metadata.tools?.length, 11)
      assert.deepStrictEqual(metadata.tools?.[0], {
        type: "function",
        function: {
          name: "add",
          description: "a + b",
          parameters: {
            type: "object",
            properties: {
              a: { type: "number", description: "a number" },
              b: { type: "number", description: "a number" }
            },
            required: ["a", "b"]
          }
        }
      })
    })
  )

  it.effect("toolPrompt none shows no tools at all", () =>
    Effect.gen(function* () {
      const env = yield* McpToolEnv.make(pensRow, { ...options, toolPrompt: "none" })
      const { messages, metadata } = yield* env.init(pensRow.prompt)
      assert.deepStrictEqual(messages, pensRow.prompt)
      assert.isUndefined(metadata.tools)
    })
  )

  it.effect("toolPrompt compact lists one `name(args): description` line per tool", () =>
    Effect.gen(function* () {
      const env = yield* McpToolEnv.make(pensRow, { ...options, toolPrompt: "compact" })
      const { messages } = yield* env.init(pensRow.prompt)
      const system = messages[0]!.content
      assert.include(system, "\nadd(a, b): a + b\n")
      assert.include(system, "find_customer(name)")
      assert.notInclude(system, '"type"')
      assert.isBelow(system.length, 900)
    })
  )

  it.effect("a 4-call episode: tool results come back as tool messages; the answer ends it with reward 1", () =>
    Effect.gen(function* () {
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("mcp_tool", pensRow)
      yield* env.init(pensRow.prompt)
      const steps = yield* runScript(env, pensScript)
      assert.deepStrictEqual(
        steps.slice(0, 4).map((s) => s.observations.map((m) => [m.role, m.content, m.tool_call_id])),
        [
          [["tool", "C003", "call_0"]],
          [["tool", "O1004,O1005,O1006", "call_0"]],
          [["tool", '{"item":"pen","price":3,"qty":10}', "call_0"]],
          [["tool", "30", "call_0"]]
        ]
      )
      assert.deepStrictEqual(
        steps.map((s) => [s.reward, s.done]),
        [
          [0, false],
          [0, false],
          [0, false],
          [0, false],
          [1, true]
        ]
      )
      const last = steps[4]!
      assert.strictEqual(last.metadata.finalAnswer, "30")
      assert.strictEqual(last.metadata.stopReason, "answer")
      assert.deepStrictEqual(last.observations, [])
      const record = steps[0]!.metadata.toolCalls[0]!
      assert.deepStrictEqual(
        { ...record, ms: 0 },
        {
          id: "call_0",
          server: "toolbox",
          tool: "find_customer",
          arguments: { name: "Carol Evans" },
          result: "C003",
          isError: false,
          ms: 0
        }
      )
      const metrics = yield* env.metrics
      assert.strictEqual(metrics["env/turns"], 5)
      assert.strictEqual(metrics["env/tool_calls"], 4)
      assert.strictEqual(metrics["env/tool_errors"], 0)
      assert.strictEqual(metrics["env/parse_failures"], 0)
      assert.strictEqual(metrics["reward/outcome"], 1)
    })
  )

  it.effect("tool errors and unparsable calls are observations, counted; max_turns ends the episode", () =>
    Effect.gen(function* () {
      const row: PromptRow = { ...pensRow, extras: { max_turns: 3 } }
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("mcp_tool", row)
      yield* env.init(row.prompt)
      const steps = yield* runScript(env, [
        call("divide", { a: 1, b: 0 }),
        '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>',
        call("sqrt", { x: 9 }),
        "never reached"
      ])
      assert.strictEqual(steps.length, 3)
      assert.deepStrictEqual(steps[0]!.observations, [
        { role: "tool", content: "Error: division by zero", tool_call_id: "call_0", name: "divide" }
      ])
      assert.isTrue(steps[0]!.metadata.toolCalls[0]!.isError)
      assert.isDefined(steps[1]!.metadata.parseError)
      assert.strictEqual(steps[1]!.observations[0]!.role, "tool")
      assert.match(steps[1]!.observations[0]!.content, /^Error: /)
      assert.strictEqual(steps[2]!.done, true)
      assert.strictEqual(steps[2]!.metadata.stopReason, "max_turns")
      assert.match(steps[2]!.metadata.toolCalls[0]!.result, /^Error: unknown tool sqrt/)
      assert.strictEqual(steps[2]!.reward, 0)
      const metrics = yield* env.metrics
      assert.deepStrictEqual(
        [metrics["env/turns"], metrics["env/tool_calls"], metrics["env/tool_errors"], metrics["env/parse_failures"]],
        [3, 2, 2, 1]
      )
    })
  )

  it.effect("replay serves the recorded results with no server; a call that was never recorded is ReplayMiss", () =>
    Effect.gen(function* () {
      const recorded = yield* (yield* ToolIo.ToolIo).recorded
      assert.isAtLeast(recorded.length, 4)
      const replay = ToolIo.makeReplay({ records: recorded })
      const env = yield* McpToolEnv.make(pensRow, options).pipe(Effect.provideService(ToolIo.ToolIo, replay))
      yield* env.init(pensRow.prompt)
      const steps = yield* runScript(env, pensScript)
      assert.deepStrictEqual(
        steps.map((s) => s.observations.map((m) => m.content).join()),
        ["C003", "O1004,O1005,O1006", '{"item":"pen","price":3,"qty":10}', "30", ""]
      )
      assert.strictEqual(steps[4]!.reward, 1)
      // keys are canonical: argument order does not matter
      const env2 = yield* McpToolEnv.make(pensRow, options).pipe(Effect.provideService(ToolIo.ToolIo, replay))
      const swapped = yield* env2.step(call("multiply", { b: 10, a: 3 }))
      assert.strictEqual(swapped.observations[0]!.content, "30")
      const miss = yield* Effect.flip(env2.step(call("multiply", { a: 4, b: 10 })))
      assert.strictEqual(miss.reason, "ReplayMiss")
      assert.match(miss.message, /multiply\(\{"a":4,"b":10\}\)/)
    })
  )

  it.effect("the registry refuses unknown classes and takes user classes registered as a layer", () =>
    Effect.gen(function* () {
      const registry = yield* EnvRegistry.EnvRegistry
      const unknown = yield* Effect.flip(registry.make("nope", pensRow))
      assert.strictEqual(unknown.reason, "UnknownEnvClass")
      assert.match(unknown.message, /registered: mcp_tool/)
      const echo: EnvRegistry.EnvFactory = () =>
        Effect.succeed({
          envClass: "echo",
          init: (prompt) => Effect.succeed({ messages: prompt, metadata: {} }),
          step: (text) =>
            Effect.succeed({ observations: [], reward: text.length, done: true, metadata: { toolCalls: [] } }),
          metrics: Effect.succeed({}),
          close: Effect.void
        })
      yield* Layer.build(EnvRegistry.layerRegister("echo", echo))
      assert.deepStrictEqual(yield* registry.classes, ["echo", "mcp_tool"])
      const env = yield* registry.make("echo", pensRow)
      assert.strictEqual((yield* env.step("four")).reward, 4)
    })
  )
})

describe("ToolIo replay from an episodes file", () => {
  it.effect("reads turns[].toolCalls of every trajectory; a torn last line is skipped", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("replay")
      const file = join(dir, "episodes.jsonl")
      const record = (id: string, a: number, result: string) => ({
        id,
        server: "toolbox",
        tool: "add",
        arguments: { a, b: 1 },
        result,
        isError: false,
        ms: 1
      })
      const group = {
        promptUid: "p0",
        trajectories: [
          { turns: [{ toolCalls: [record("call_0", 1, "2")] }, { toolCalls: [] }] },
          { turns: [{ toolCalls: [record("call_0", 1, "2"), record("call_1", 5, "6")] }] }
        ]
      }
      writeFileSync(file, `${JSON.stringify(group)}\n{"promptUid": "p1", "traj`)
      const records = yield* ToolIo.readEpisodeRecords(file)
      assert.deepStrictEqual(
        records.map((r) => r.result),
        ["2", "2", "6"]
      )
      const replay = yield* ToolIo.ToolIo.pipe(Effect.provide(ToolIo.layerReplayFile(file)))
      const session = yield* replay.session
      assert.deepStrictEqual(
        session.tools.map((t) => t.name),
        ["add"]
      )
      // add(1, 1) was recorded twice: the first and second calls in a session are served, a third misses
      const first = yield* session.call({ id: "x", name: "add", arguments: { a: 1, b: 1 } })
      const second = yield* session.call({ id: "y", name: "add", arguments: { b: 1, a: 1 } })
      assert.deepStrictEqual([first.result, first.id, second.result], ["2", "x", "2"])
      const third = yield* Effect.flip(session.call({ id: "z", name: "add", arguments: { a: 1, b: 1 } }))
      assert.strictEqual(third._tag, "ReplayMissError")
      assert.strictEqual(third.occurrence, 2)
    }).pipe(Effect.provide(NodeServices.layer))
  )
})

describe("Env.aggregateMetrics", () => {
  it("averages per-episode metrics and derives rates from sums", () => {
    // episode A: 4 turns, 1 parse failure, 3 calls, 1 error; episode B: 2 turns, 0 failures, 1 call, 0 errors
    const out = Env.aggregateMetrics([
      { "env/turns": 4, "env/parse_failures": 1, "env/tool_calls": 3, "env/tool_errors": 1 },
      { "env/turns": 2, "env/parse_failures": 0, "env/tool_calls": 1, "env/tool_errors": 0 }
    ])
    assert.strictEqual(out["env/turns"], 3)
    assert.strictEqual(out["env/tool_calls"], 2)
    assert.strictEqual(out["generate/parse_failure_rate"], 1 / 6)
    assert.strictEqual(out["env/tool_error_rate"], 1 / 4)
  })
})
