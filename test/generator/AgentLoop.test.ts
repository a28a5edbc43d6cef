import { readFileSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Stream } from "effect"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import * as Trajectory from "../../src/domain/Trajectory.ts"
import * as EnvRegistry from "../../src/env/EnvRegistry.ts"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as McpToolEnv from "../../src/env/McpToolEnv.ts"
import * as ToolIo from "../../src/env/ToolIo.ts"
import * as AgentLoop from "../../src/generator/AgentLoop.ts"
import * as Generator from "../../src/generator/Generator.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as Tokenizer from "../../src/tokenizer/Tokenizer.ts"
import * as Servers from "../env/McpServers.ts"
import * as CountdownEnv from "../fixtures/CountdownEnv.ts"
import * as ScriptedEngine from "../fixtures/ScriptedEngine.ts"

const tokenizer = ByteTokenizer.make()
const row: PromptRow = {
  uid: "p1",
  data_source: "test",
  env_class: "countdown",
  prompt: [{ role: "user", content: "go" }]
}
const options: AgentLoop.Options = {
  maxTurns: 5,
  maxGenerateLength: 32,
  maxInputLength: 4096,
  temperature: 1,
  topP: 1,
  topK: 0,
  stopStrings: [],
  seed: 0
}

const services = (script: ScriptedEngine.Script) =>
  Layer.mergeAll(ScriptedEngine.layer(tokenizer, script), Tokenizer.layerImpl(tokenizer), CountdownEnv.registry)

describe("AgentLoop.run", () => {
  it.effect("gives loss mask 1 exactly to sampled tokens and 0 to template and tool-output tokens", () =>
    Effect.gen(function* () {
      // turn 0 "step", turn 1 "step", turn 2 "DONE" → two tool observations in between
      const t = yield* AgentLoop.run(row, 0, options)
      assert.strictEqual(t.stopReason, "stop")
      assert.strictEqual(t.turns.length, 3)
      assert.strictEqual(t.lossMask.length, t.responseIds.length)
      assert.strictEqual(t.rolloutLogprobs.length, t.responseIds.length)
      const sampled = new Set<number>()
      for (const turn of t.turns) for (let i = turn.start; i < turn.end; i++) sampled.add(i)
      t.lossMask.forEach((m, i) => assert.strictEqual(m, sampled.has(i) ? 1 : 0, `position ${i}`))
      // what the policy sampled is kept token for token: text + eos
      const first = t.turns[0]!
      assert.deepStrictEqual(t.responseIds.slice(first.start, first.end), [
        ...tokenizer.encode("step"),
        tokenizer.eosIds[0]!
      ])
      // the tokens between turns are exactly the template's rendering of the tool message
      const between = tokenizer.decode(t.responseIds.slice(first.end, t.turns[1]!.start))
      assert.include(between, "left: 2")
      assert.strictEqual(first.observationTokens, t.turns[1]!.start - first.end)
    }).pipe(Effect.provide(services((_, call) => (call < 2 ? "step" : "DONE"))))
  )

  it.effect("keeps behaviour log-probs aligned with their tokens and 0 where the mask is 0", () =>
    Effect.gen(function* () {
      const t = yield* AgentLoop.run(row, 0, options)
      t.turns.forEach((turn, call) => {
        for (let i = turn.start; i < turn.end; i++) {
          assert.closeTo(t.rolloutLogprobs[i]!, -0.01 * (i - turn.start + 1) - 0.001 * call, 1e-12)
        }
      })
      t.lossMask.forEach((m, i) => {
        if (m === 0) assert.strictEqual(t.rolloutLogprobs[i], 0)
      })
    }).pipe(Effect.provide(services((_, call) => (call < 2 ? "step" : "DONE"))))
  )

  it.effect("puts each turn's reward on its last generated token", () =>
    Effect.gen(function* () {
      const t = yield* AgentLoop.run(row, 0, options)
      const rewards = Trajectory.tokenRewards(t)
      // turns: 0.1, 0.1, then DONE = 1
      assert.closeTo(t.reward, 1.2, 1e-12)
      t.turns.forEach((turn) => assert.strictEqual(rewards[turn.end - 1], turn.reward))
      assert.strictEqual(rewards.filter((r) => r !== 0).length, 3)
    }).pipe(Effect.provide(services((_, call) => (call < 2 ? "step" : "DONE"))))
  )

  it.effect("ends `overlong` when the context reaches max_input_length", () =>
    Effect.gen(function* () {
      const prompt = yield* Effect.sync(() =>
        tokenizer.applyChatTemplateIds([{ role: "system", content: "Count down." }, ...row.prompt], {
          addGenerationPrompt: true
        })
      )
      const t = yield* AgentLoop.run(row, 0, { ...options, maxInputLength: prompt.length + 12 })
      assert.strictEqual(t.stopReason, "overlong")
      assert.isAtMost(t.promptIds.length + t.responseIds.length, prompt.length + 12)
    }).pipe(Effect.provide(services(() => "a long turn that does not stop soon")))
  )

  it.effect("ends a prompt longer than max_input_length `overlong` with no generation, its ids cut at the limit", () =>
    Effect.gen(function* () {
      // 200,000 bytes of prompt: push(...ids) of so many ids overflowed the stack (RangeError, not a trajectory)
      const huge: PromptRow = { ...row, prompt: [{ role: "user", content: "x".repeat(200_000) }] }
      const t = yield* AgentLoop.run(huge, 0, { ...options, maxInputLength: 640 })
      assert.strictEqual(t.stopReason, "overlong")
      assert.isUndefined(t.error)
      assert.strictEqual(t.promptIds.length, 640)
      assert.deepStrictEqual([t.responseIds.length, t.turns.length], [0, 0])
    }).pipe(
      Effect.provide(
        services(() => {
          throw new Error("a prompt over max_input_length must not reach the engine")
        })
      )
    )
  )

  it.effect("ends `length` when a turn hits max_generate_length", () =>
    Effect.gen(function* () {
      const t = yield* AgentLoop.run(row, 0, { ...options, maxGenerateLength: 4 })
      assert.strictEqual(t.stopReason, "length")
      assert.strictEqual(t.turns[0]!.end - t.turns[0]!.start, 4)
    }).pipe(Effect.provide(services(() => "more than four tokens")))
  )

  it.effect("ends `max_turns` after max_turns turns, and `env_done` when the env ends for its own reason", () =>
    Effect.gen(function* () {
      const capped = yield* AgentLoop.run(row, 0, { ...options, maxTurns: 2 })
      assert.strictEqual(capped.stopReason, "max_turns")
      assert.strictEqual(capped.turns.length, 2)
      const budget = yield* AgentLoop.run(row, 0, options)
      assert.strictEqual(budget.stopReason, "env_done")
      assert.strictEqual(budget.turns.length, 3)
    }).pipe(Effect.provide(services(() => "step")))
  )

  it.effect("records an env failure as stop reason `error` with its message instead of failing", () =>
    Effect.gen(function* () {
      const t = yield* AgentLoop.run(row, 0, options)
      assert.strictEqual(t.stopReason, "error")
      assert.include(t.error ?? "", "cannot handle p1")
      assert.strictEqual(t.turns.length, 0)
      assert.isAbove(t.responseIds.length, 0)
    }).pipe(Effect.provide(services(() => "FAIL")))
  )
})

describe("AgentLoop.run in step-wise mode", () => {
  it.effect("makes one training row per turn whose prompt is the whole history re-rendered", () =>
    Effect.gen(function* () {
      const t = yield* AgentLoop.run(row, 0, { ...options, stepWise: true })
      assert.strictEqual(t.stopReason, "stop")
      const steps = t.steps ?? []
      assert.strictEqual(steps.length, 3)
      // turn 2's context = the template over [system, user, assistant "step", tool "left: 2", assistant "step", tool "left: 1"]
      const history = [
        { role: "system" as const, content: "Count down." },
        ...row.prompt,
        { role: "assistant" as const, content: "step" },
        { role: "tool" as const, content: "left: 2" },
        { role: "assistant" as const, content: "step" },
        { role: "tool" as const, content: "left: 1" }
      ]
      assert.deepStrictEqual(
        steps[2]!.promptIds,
        tokenizer.applyChatTemplateIds(history, { addGenerationPrompt: true })
      )
      assert.deepStrictEqual(steps[2]!.responseIds, [...tokenizer.encode("DONE"), tokenizer.eosIds[0]!])
      assert.deepStrictEqual(steps[0]!.promptIds, t.promptIds)
      // responseIds holds only generated tokens, all trained on
      assert.strictEqual(
        t.responseIds.length,
        steps.reduce((n, s) => n + s.responseIds.length, 0)
      )
      assert.isTrue(t.lossMask.every((m) => m === 1))
    }).pipe(Effect.provide(services((_, call) => (call < 2 ? "step" : "DONE"))))
  )
})

describe("Generator.rollouts", () => {
  it.effect("emits one group of n trajectories per prompt, in prompt order", () =>
    Effect.gen(function* () {
      const generator = yield* Generator.make({
        ...options,
        samplesPerPrompt: 3,
        maxConcurrentGroups: 2,
        unordered: false
      })
      const prompts = [0, 1, 2, 3].map((cursor) => ({ row: { ...row, uid: `p${cursor}` }, cursor }))
      const groups = yield* Stream.runCollect(generator.rollouts(Stream.fromIterable(prompts)))
      assert.deepStrictEqual(
        groups.map((g) => g.promptUid),
        ["p0", "p1", "p2", "p3"]
      )
      for (const g of groups) {
        assert.deepStrictEqual(
          g.trajectories.map((t) => t.sample),
          [0, 1, 2]
        )
      }
      assert.strictEqual(groups[2]!.cursor, 2)
    }).pipe(Effect.provide(services(() => "DONE")))
  )
})

describe("AgentLoop.run with a live MCP server", () => {
  const call = (name: string) => `<tool_call>\n${JSON.stringify({ name, arguments: {} })}\n</tool_call>`
  const toolRow: PromptRow = {
    uid: "long",
    data_source: "test",
    env_class: "mcp_tool",
    prompt: [{ role: "user", content: "Read it." }]
  }
  const liveServices = (dir: string) =>
    Layer.mergeAll(
      ScriptedEngine.layer(tokenizer, () => call("long_answer")),
      Tokenizer.layerImpl(tokenizer),
      McpToolEnv.layer({ toolCallFormat: "hermes", maxTurns: 5, toolPrompt: "compact" }).pipe(
        Layer.provideMerge(
          Layer.mergeAll(
            EnvRegistry.layer(),
            ToolIo.layerRecord.pipe(
              Layer.provideMerge(
                McpClient.layer({
                  servers: [Servers.faulty(dir, { allowed_tools: ["long_answer"], timeout_ms: 10_000 })]
                })
              )
            )
          )
        )
      )
    )

  it.live(
    "cuts a tool result that would overflow max_input_length at the limit and ends the trajectory `overlong`",
    () => {
      const dir = Servers.tempDir("long-answer")
      return Effect.gen(function* () {
        // the server answers 3,500 characters (= byte tokens) against a 640-token context
        const t = yield* AgentLoop.run(toolRow, 0, { ...options, maxGenerateLength: 128, maxInputLength: 640 })
        assert.strictEqual(t.stopReason, "overlong")
        assert.strictEqual(t.promptIds.length + t.responseIds.length, 640)
        assert.strictEqual(t.lossMask.length, t.responseIds.length)
        assert.strictEqual(t.rolloutLogprobs.length, t.responseIds.length)
        assert.strictEqual(t.turns.length, 1)
        const first = t.turns[0]!
        assert.strictEqual(first.toolCalls.length, 1)
        // every token after the call is the (cut) observation, none of it trained on
        assert.strictEqual(first.observationTokens, t.responseIds.length - first.end)
        assert.isTrue(t.lossMask.slice(first.end).every((m) => m === 0))
        assert.include(tokenizer.decode(t.responseIds.slice(first.end)), "0123456789")
        assert.notInclude(tokenizer.decode(t.responseIds.slice(first.end)), "end!!")
        assert.deepStrictEqual(readFileSync(join(dir, "calls.log"), "utf8"), "long_answer\n")
      }).pipe(Effect.provide(liveServices(dir)))
    }
  )
})
