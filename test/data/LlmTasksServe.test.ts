/**
 * Task generation against our own `serve` with structured outputs: the quickstart policy (a tiny byte-level model
 * never trained to write tasks) served in process and asked through `ChatClient` with the generator's
 * `response_format` JSON schema. Its tasks are nonsense, but every finished answer parses as the schema's shape, and
 * what the checks refuse is rejected with a reason: generation never fails on what the model wrote. The recorded calls
 * replay to the same rows.
 */
import { Effect } from "effect"
import { assert, describe, it } from "vitest"
import * as LlmTasks from "../../src/data/LlmTasks.ts"
import * as ChatClient from "../../src/env/ChatClient.ts"
import * as Rewards from "../../src/env/Rewards.ts"
import { useQuickstartServe } from "../fixtures/QuickstartServe.ts"

const served = useQuickstartServe()

// one small tool: the quickstart policy's context is 1024 tokens (bytes), prompt and answer together
const tools = LlmTasks.toolsFromJson(
  [
    {
      name: "neg",
      description: "-x",
      inputSchema: { type: "object", properties: { x: { type: "number" } }, required: ["x"] }
    }
  ],
  "tools"
)

const settings: LlmTasks.Settings = {
  style: "llm",
  domains: ["math"],
  complexities: ["simple"],
  maxTools: 2,
  maxTurns: 4,
  count: 2,
  seed: 3,
  batch: 1,
  maxCalls: 2,
  concurrency: 1,
  dataSource: "serve_tasks",
  sequenceWeight: 0.2,
  temperature: 1,
  maxTokens: 200,
  responseFormat: true
}

describe("LlmTasks against serve (structured outputs)", () => {
  it("every finished answer parses; refused tasks carry reasons; kept rows are valid; replay gives the same rows", async () => {
    const client = ChatClient.make({ url: `${served.url}/v1`, model: "quickstart", mode: "record" })
    const result = await Effect.runPromise(LlmTasks.generate(client, tools, settings))
    assert.isAtLeast(result.calls.length, 1)
    let finished = 0
    for (const call of result.calls) {
      const { content, finishReason } = call.record
      if (finishReason === "stop") {
        finished++
        const value = JSON.parse(content) as {
          tasks: Array<{ prompt: string; tool_sequence: Array<{ tool: string }> }>
        }
        assert.isArray(value.tasks, content)
        assert.lengthOf(value.tasks, 1, content) // maxItems: batch
        for (const step of value.tasks[0]!.tool_sequence) assert.strictEqual(step.tool, "neg", content)
      } else {
        assert.strictEqual(finishReason, "length", content) // out of tokens before closing: rejected, not a failure
      }
      // each task asked for is kept or rejected with its reason
      assert.strictEqual(call.kept.length + call.rejected.length > 0, true, content)
      for (const r of call.rejected) assert.isAbove(r.reason.length, 0)
    }
    assert.isAtLeast(finished, 1)
    for (const row of result.rows) {
      const truth = await Effect.runPromise(Rewards.decodeGroundTruth(row.reward_spec!.ground_truth))
      for (const step of truth.tool_sequence!) assert.strictEqual(step.tool, "neg")
    }
    const records = result.calls.map((c) => c.record)
    const replay = ChatClient.make({ url: "http://127.0.0.1:9/v1", model: "quickstart", mode: "replay", records })
    const again = await Effect.runPromise(LlmTasks.generate(replay, tools, settings))
    assert.strictEqual(JSON.stringify(again.rows), JSON.stringify(result.rows))
  }, 120_000)
})
