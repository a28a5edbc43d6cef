import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as JsonSchemaCheck from "../../src/data/JsonSchemaCheck.ts"
import * as LlmTasks from "../../src/data/LlmTasks.ts"
import { PromptRow } from "../../src/domain/PromptRow.ts"
import * as ChatClient from "../../src/env/ChatClient.ts"
import * as Rewards from "../../src/env/Rewards.ts"
import * as ChatServer from "../fixtures/ChatServer.ts"
import * as TaskWriter from "../fixtures/TaskWriter.ts"

const tools: ReadonlyArray<LlmTasks.Tool> = LlmTasks.toolsFromJson(
  [
    {
      name: "search_flights",
      description: "flights between two airports on a day",
      inputSchema: {
        type: "object",
        properties: {
          from: { type: "string", minLength: 3, maxLength: 3 },
          to: { type: "string" },
          day: { type: "integer", minimum: 1, maximum: 31 },
          cabin: { type: "string", enum: ["economy", "business"] }
        },
        required: ["from", "day", "cabin"],
        additionalProperties: false
      }
    },
    {
      type: "function",
      function: {
        name: "book",
        description: "book a flight",
        parameters: { type: "object", properties: { flight_id: { type: "string" } }, required: ["flight_id"] }
      }
    },
    { name: "weather", inputSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }
  ],
  "tools.json"
)

const settings: LlmTasks.Settings = {
  style: "llm",
  domains: ["travel", "finance"],
  complexities: ["simple", "complex"],
  maxTools: 3,
  maxTurns: 5,
  count: 9,
  seed: 11,
  batch: 4,
  maxCalls: 8,
  concurrency: 2,
  dataSource: "llm_tasks",
  sequenceWeight: 0.2,
  temperature: 1,
  maxTokens: 1024,
  responseFormat: true
}

const withServer = <A, E>(f: (server: ChatServer.ChatServer) => Effect.Effect<A, E>) =>
  Effect.acquireUseRelease(
    Effect.promise(() => ChatServer.start((seen) => TaskWriter.answer(seen))),
    f,
    (server) => Effect.promise(() => server.close())
  )

describe("JsonSchemaCheck", () => {
  const schema = tools[0]!.inputSchema
  it("accepts conforming arguments and names every problem of others by path", () => {
    assert.deepStrictEqual(JsonSchemaCheck.problems(schema, { from: "SFO", day: 3, cabin: "economy" }), [])
    assert.deepStrictEqual(JsonSchemaCheck.problems(schema, { from: "SFOX", day: 3.5, cabin: "first", seat: 1 }), [
      "$.from: longer than 3 characters",
      "$.day: expected integer, got number 3.5",
      '$.cabin: "first" is not one of "economy", "business"',
      "$.seat: not a known key (known: from, to, day, cabin)"
    ])
    assert.deepStrictEqual(JsonSchemaCheck.problems(schema, { from: "SFO" }), [
      "$.day: required, missing",
      "$.cabin: required, missing"
    ])
    assert.deepStrictEqual(JsonSchemaCheck.problems(schema, [1]), ["$: expected object, got array [1]"])
  })

  it("follows local $refs, anyOf and array items", () => {
    const s = {
      type: "object",
      properties: {
        xs: { type: "array", items: { $ref: "#/$defs/n" } },
        v: { anyOf: [{ type: "string" }, { type: "null" }] }
      },
      $defs: { n: { type: "number", maximum: 10 } }
    }
    assert.deepStrictEqual(JsonSchemaCheck.problems(s, { xs: [1, 2], v: null }), [])
    assert.deepStrictEqual(JsonSchemaCheck.problems(s, { xs: [1, 20], v: 3 }), [
      "$.xs[1]: 20 is above the maximum 10",
      "$.v: matches none of the 2 anyOf alternatives"
    ])
  })
})

describe("LlmTasks", () => {
  it("reads MCP tools and OpenAI functions, and names a bad entry", () => {
    assert.deepStrictEqual(
      tools.map((t) => t.name),
      ["search_flights", "book", "weather"]
    )
    assert.throws(
      () => LlmTasks.toolsFromJson([{ name: "a" }, { name: "a" }], "t.json"),
      /t.json: tool 1: name: "a" is listed twice/
    )
    assert.throws(() => LlmTasks.toolsFromJson([{ description: "x" }], "t.json"), /t.json: tool 0: name/)
  })

  it.effect("asks a real endpoint, keeps valid new tasks, rejects unknown tools, bad arguments and duplicates", () =>
    withServer((server) =>
      Effect.gen(function* () {
        const client = ChatClient.make({ url: server.url, model: "writer", mode: "record" })
        const result = yield* LlmTasks.generate(client, tools, settings)
        assert.strictEqual(result.rows.length, 9)
        // 4 asked per call → 4 valid + 3 bad each; 9 rows need 3 calls (the third keeps 1 of its 4 and stops)
        assert.strictEqual(result.calls.length, 3)
        assert.strictEqual(server.seen.length, 3)
        const expectedPrompts = server.seen.flatMap((s) => TaskWriter.write(s.body).valid).slice(0, 9)
        assert.deepStrictEqual(
          result.rows.map((r) => r.prompt[0]!.content),
          expectedPrompts
        )
        const reasons = result.calls[0]!.rejected.map((r) => r.reason)
        assert.strictEqual(reasons.length, 3)
        assert.match(
          reasons[0]!,
          /tool_sequence\[0\]\.tool: "no_such_tool" is not a tool \(known: search_flights, book, weather\)/
        )
        assert.match(
          reasons[1]!,
          /tool_sequence\[0\]\.arguments of search_flights: arguments\.from: expected string, got number/
        )
        assert.match(reasons[2]!, /^duplicate of llm_tasks-11-00000$/)
        assert.strictEqual(result.duplicates, 2) // the third call stopped before its duplicate
        // the requests: the tools in the system message, the seed per call, a JSON-schema response_format
        const body = server.seen[0]!.body
        assert.match((body["messages"] as Array<{ content: string }>)[0]!.content, /"name":"search_flights"/)
        assert.deepStrictEqual(
          server.seen.map((s) => s.body["seed"]),
          [11, 12, 13]
        )
        assert.strictEqual((body["response_format"] as { type: string }).type, "json_schema")
        // every row is a rule-scored mcp_tool row whose ground truth decodes; a perfect episode scores 1
        for (const row of result.rows) {
          assert.strictEqual(row.env_class, "mcp_tool")
          const truth = yield* Rewards.decodeGroundTruth(row.reward_spec!.ground_truth)
          const calls = truth.tool_sequence!.map((c, i) => ({
            id: `c${i}`,
            server: "s",
            tool: c.tool,
            arguments: c.arguments ?? {},
            result: "ok",
            isError: false,
            ms: 0
          }))
          const answer = truth.answer === undefined ? "done" : String(truth.answer)
          const score = Rewards.score(truth, { calls, finalAnswer: answer })
          assert.strictEqual(score.outcome, 1)
          assert.strictEqual(score.tool_sequence_match, 1)
        }
        assert.deepStrictEqual(result.rows[0]!.extra_info?.["max_turns"], 5)
        assert.include(["travel", "finance"], result.rows[0]!.extra_info?.["domain"])
      })
    )
  )

  it.effect("--reward judge: rows for the LLM group judge, the expected calls as its reference, the rubric kept", () =>
    withServer((server) =>
      Effect.gen(function* () {
        const client = ChatClient.make({ url: server.url, model: "writer" })
        const rubric = "Did the agent book the cheapest flight it found?"
        const result = yield* LlmTasks.generate(client, tools, { ...settings, count: 2, reward: "judge", rubric })
        assert.strictEqual(result.rows.length, 2)
        for (const row of result.rows) {
          const decoded = Schema.decodeUnknownSync(PromptRow)(row)
          assert.strictEqual(decoded.reward_spec?.method, "judge")
          assert.strictEqual(decoded.reward_spec?.rubric, rubric)
          assert.isArray((decoded.reward_spec!.ground_truth as { tool_sequence: unknown }).tool_sequence)
        }
      })
    )
  )

  it.effect("replays the recorded calls with no endpoint: the same rows, byte for byte", () =>
    Effect.gen(function* () {
      const recorded = yield* withServer((server) =>
        Effect.gen(function* () {
          const client = ChatClient.make({ url: server.url, model: "writer", mode: "record" })
          const result = yield* LlmTasks.generate(client, tools, settings)
          const header: LlmTasks.Header = { kind: "header", settings, model: "writer", tools }
          return { result, log: LlmTasks.rawLog(header, result.calls) }
        })
      )
      // the server is closed: replay must not need it
      const { header, records } = LlmTasks.readRawLog(recorded.log, "raw.jsonl")
      const replay = ChatClient.make({ url: "http://127.0.0.1:9/v1", model: header.model, mode: "replay", records })
      const again = yield* LlmTasks.generate(replay, header.tools, header.settings)
      assert.strictEqual(JSON.stringify(again.rows), JSON.stringify(recorded.result.rows))
      assert.strictEqual(LlmTasks.rawLog(header, again.calls), recorded.log)
      // other settings ask other questions: replay misses instead of inventing answers
      const other = ChatClient.make({ url: "http://127.0.0.1:9/v1", model: header.model, mode: "replay", records })
      const miss = yield* LlmTasks.generate(other, header.tools, { ...header.settings, seed: 99 }).pipe(Effect.flip)
      assert.strictEqual(miss._tag, "ReplayMissError")
    })
  )

  it.effect("an answer that is not JSON, or not shaped as asked, is a rejection with its reason, not a failure", () =>
    Effect.acquireUseRelease(
      Effect.promise(() =>
        ChatServer.start((_seen, n) => ({
          content:
            n === 0 ? "I cannot help with that." : n === 1 ? '{"items": []}' : '[{"prompt": "", "tool_sequence": []}]'
        }))
      ),
      (server) =>
        Effect.gen(function* () {
          const client = ChatClient.make({ url: server.url, model: "m" })
          const result = yield* LlmTasks.generate(client, tools, { ...settings, count: 2, maxCalls: 3, concurrency: 1 })
          assert.strictEqual(result.rows.length, 0)
          assert.deepStrictEqual(
            result.calls.map((c) => c.rejected[0]!.reason),
            [
              "the answer is not JSON: I cannot help with that.",
              'the answer has no "tasks" array',
              "prompt: missing or empty"
            ]
          )
        }),
      (server) => Effect.promise(() => server.close())
    )
  )

  it("extracts JSON from fences and prose; normalises prompts for de-duplication", () => {
    assert.deepStrictEqual(LlmTasks.extractJson('Sure!\n```json\n{"tasks": []}\n```'), { tasks: [] })
    assert.deepStrictEqual(LlmTasks.extractJson('Here: {"tasks": [1]} hope it helps'), { tasks: [1] })
    assert.strictEqual(LlmTasks.normalizePrompt("  Book a FLIGHT, to Paris!! "), "book a flight to paris")
    assert.strictEqual(LlmTasks.rawFile("a/b.jsonl"), "a/b.raw.jsonl")
  })
})
