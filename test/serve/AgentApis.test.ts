/**
 * OpenAI's Responses API and Anthropic's Messages API in serve, through the official `openai` and `@anthropic-ai/sdk`
 * clients: a two-turn tool loop on each (a forced call, its result sent back, a reply), whole and streamed. A random
 * tiny model (byte tokenizer) is served in process; a turn of either API samples exactly what the chat route samples
 * for the same conversation and seed, so the translation of items and blocks into messages is held against the chat
 * route's, and a streamed answer puts together to the whole one.
 */
import Anthropic from "@anthropic-ai/sdk"
import { Effect, Exit, Scope } from "effect"
import OpenAI from "openai"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import * as JsonSchemaCheck from "../../src/data/JsonSchemaCheck.ts"
import * as ToolCallParser from "../../src/env/ToolCallParser.ts"
import * as LoraServe from "../fixtures/LoraServe.ts"

const model = "random"
const weatherSchema = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 1, maxLength: 8 },
    days: { type: "integer", minimum: 1, maximum: 7 }
  },
  required: ["city", "days"],
  additionalProperties: false
}
const question = "Weather in Oslo?"

let scope: Scope.Closeable
let openai: OpenAI
let anthropic: Anthropic

beforeAll(async () => {
  scope = await Effect.runPromise(Scope.make())
  const url = await Effect.runPromise(LoraServe.randomRun("serve-agent-apis-", model).pipe(Scope.provide(scope)))
  openai = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 })
  anthropic = new Anthropic({ baseURL: url, apiKey: "unused", maxRetries: 0 })
}, 120_000)

afterAll(async () => {
  await Effect.runPromise(Scope.close(scope, Exit.void))
})

const assertValidWeather = (args: unknown) =>
  assert.deepStrictEqual(JsonSchemaCheck.problems(weatherSchema, args), [], JSON.stringify(args))

/** The chat route's reply to the same conversation and seed: what either API's turn must have sampled. */
const chatReply = async (messages: Array<OpenAI.Chat.ChatCompletionMessageParam>, seed: number, maxTokens: number) =>
  (await openai.chat.completions.create({ model, messages, temperature: 1, seed, max_tokens: maxTokens })).choices[0]!
    .message.content ?? ""

describe("the Responses API, through the openai client", () => {
  const tools: Array<OpenAI.Responses.FunctionTool> = [
    { type: "function", name: "get_weather", description: "The forecast", parameters: weatherSchema, strict: true }
  ]
  const lastResponse = async (events: AsyncIterable<OpenAI.Responses.ResponseStreamEvent>) => {
    let last: OpenAI.Responses.Response | undefined
    for await (const event of events) if ("response" in event) last = event.response
    return last!
  }
  // vLLM's sampling extensions the Responses API has no field for
  const seeded = (seed: number) => ({ seed }) as object

  it("drives a two-turn tool loop with previous_response_id, whole and streamed alike", async () => {
    for (const stream of [false, true]) {
      const first = {
        model,
        input: question,
        instructions: "Use the tools.",
        tools,
        tool_choice: "required" as const,
        temperature: 1,
        max_output_tokens: 200,
        ...seeded(3)
      }
      const r1: OpenAI.Responses.Response = stream
        ? await openai.responses.stream(first).finalResponse()
        : await openai.responses.create({ ...first, stream: false })
      assert.strictEqual(r1.status, "completed")
      const calls = r1.output.filter(
        (item): item is OpenAI.Responses.ResponseFunctionToolCall => item.type === "function_call"
      )
      assert.isAtLeast(calls.length, 1)
      for (const call of calls) {
        assert.strictEqual(call.name, "get_weather")
        assertValidWeather(JSON.parse(call.arguments))
      }
      const second = {
        model,
        previous_response_id: r1.id,
        input: calls.map((call) => ({ type: "function_call_output" as const, call_id: call.call_id, output: "sunny" })),
        instructions: "Use the tools.",
        tools,
        tool_choice: "none" as const,
        temperature: 1,
        max_output_tokens: 24,
        ...seeded(4)
      }
      // a reply cut at max_output_tokens ends in `response.incomplete`, which the SDK's stream helper does not put
      // together (it takes `response.completed`'s): the last event carries the whole response
      const r2 = stream
        ? await lastResponse(await openai.responses.create({ ...second, stream: true }))
        : await openai.responses.create(second)
      assert.strictEqual(r2.status, "incomplete")
      assert.strictEqual(r2.incomplete_details?.reason, "max_output_tokens")
      assert.strictEqual(r2.usage?.output_tokens, 24)
      const text = r2.output.flatMap((item) =>
        item.type === "message" ? item.content.flatMap((c) => (c.type === "output_text" ? [c.text] : [])) : []
      )
      // the same conversation through the chat route samples the same reply
      const expected = await chatReply(
        [
          { role: "system", content: "Use the tools." },
          { role: "user", content: question },
          {
            role: "assistant",
            content: "",
            tool_calls: calls.map((c) => ({
              id: c.call_id,
              type: "function" as const,
              function: { name: c.name, arguments: c.arguments }
            }))
          },
          ...calls.map((c) => ({ role: "tool" as const, tool_call_id: c.call_id, content: "sunny" }))
        ],
        4,
        24
      )
      assert.strictEqual(text.join(""), expected)
      assert.notStrictEqual(expected, "")
    }
  }, 120_000)

  it("streams the events the SDK's stream helper puts together, and the whole answer equals the unstreamed one", async () => {
    const body = { model, input: question, temperature: 1, max_output_tokens: 20, ...seeded(9) }
    const whole = await openai.responses.create(body)
    const types: Array<string> = []
    let deltas = ""
    for await (const event of await openai.responses.create({ ...body, stream: true })) {
      types.push(event.type)
      if (event.type === "response.output_text.delta") deltas += event.delta
    }
    assert.strictEqual(types[0], "response.created")
    assert.strictEqual(types.at(-1), "response.incomplete")
    assert.include(types, "response.output_text.done")
    assert.strictEqual(deltas, whole.output_text)
    assert.isAbove(whole.output_text.length, 0)
  })

  it("constrains the output to text.format's JSON schema", async () => {
    const r = await openai.responses.create({
      model,
      input: question,
      text: { format: { type: "json_schema", name: "weather", schema: weatherSchema, strict: true } },
      temperature: 1,
      max_output_tokens: 200,
      ...seeded(2)
    })
    assert.strictEqual(r.status, "completed")
    assertValidWeather(JSON.parse(r.output_text))
  })

  it("answers 400 for an unknown previous_response_id and for a tool type it cannot serve", async () => {
    const refused = async (body: object) => {
      try {
        await openai.responses.create({ model, max_output_tokens: 4, ...body } as never)
      } catch (e) {
        if (e instanceof OpenAI.APIError) return e
        throw e
      }
      throw new Error("the request was answered")
    }
    const missing = await refused({ input: "hi", previous_response_id: "resp-0-none" })
    assert.strictEqual(missing.status, 400)
    assert.strictEqual(missing.param, "previous_response_id")
    const search = await refused({ input: "hi", tools: [{ type: "web_search" }] })
    assert.strictEqual(search.status, 400)
    assert.match(String((search.error as { message: string }).message), /tools\[0\].*function tools/)
  })
})

describe("the Messages API, through the @anthropic-ai/sdk client", () => {
  const tools: Array<Anthropic.Tool> = [
    { name: "get_weather", description: "The forecast", input_schema: weatherSchema as Anthropic.Tool.InputSchema }
  ]
  // temperature (gone from the SDK's 1.x types, still sent by older clients) and vLLM's seed
  const seeded = (seed: number) => ({ seed, temperature: 1 }) as object

  it("drives a two-turn tool loop with tool_use and tool_result blocks, whole and streamed alike", async () => {
    for (const stream of [false, true]) {
      const first: Anthropic.MessageCreateParamsNonStreaming = {
        model,
        max_tokens: 200,
        system: "Use the tools.",
        messages: [{ role: "user", content: question }],
        tools,
        tool_choice: { type: "any", disable_parallel_tool_use: true },
        ...seeded(3)
      }
      const m1 = stream ? await anthropic.messages.stream(first).finalMessage() : await anthropic.messages.create(first)
      assert.strictEqual(m1.stop_reason, "tool_use")
      const uses = m1.content.filter((b) => b.type === "tool_use")
      assert.strictEqual(uses.length, 1)
      const use = uses[0]!
      assert.strictEqual(use.name, "get_weather")
      assertValidWeather(use.input)
      const m2 = await anthropic.messages.create({
        model,
        max_tokens: 24,
        system: "Use the tools.",
        messages: [
          { role: "user", content: question },
          { role: "assistant", content: m1.content },
          { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny" }] }
        ],
        tools,
        tool_choice: { type: "none" },
        ...seeded(4)
      })
      assert.strictEqual(m2.stop_reason, "max_tokens")
      assert.strictEqual(m2.usage.output_tokens, 24)
      const text = m2.content.map((b) => (b.type === "text" ? b.text : "")).join("")
      const expected = await chatReply(
        [
          { role: "system", content: "Use the tools." },
          { role: "user", content: question },
          {
            role: "assistant",
            content: "",
            tool_calls: [
              {
                id: use.id,
                type: "function",
                function: { name: use.name, arguments: ToolCallParser.pythonJson(use.input) }
              }
            ]
          },
          { role: "tool", tool_call_id: use.id, content: "sunny" }
        ],
        4,
        24
      )
      assert.strictEqual(text, expected)
      assert.notStrictEqual(expected, "")
    }
  }, 120_000)

  it("streams Anthropic's events, and the whole answer equals the unstreamed one", async () => {
    const body = { model, max_tokens: 20, messages: [{ role: "user" as const, content: question }], ...seeded(9) }
    const whole = await anthropic.messages.create(body)
    const types: Array<string> = []
    let deltas = ""
    for await (const event of await anthropic.messages.create({ ...body, stream: true })) {
      types.push(event.type)
      if (event.type === "content_block_delta" && event.delta.type === "text_delta") deltas += event.delta.text
    }
    assert.deepStrictEqual(
      [types[0], types[1], types.at(-3), types.at(-2), types.at(-1)],
      ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
    )
    const text = whole.content.map((b) => (b.type === "text" ? b.text : "")).join("")
    assert.strictEqual(deltas, text)
    assert.strictEqual(whole.stop_reason, "max_tokens")
  })

  it("refuses in Anthropic's error body: no max_tokens, an image block", async () => {
    const refused = async (body: object) => {
      try {
        await anthropic.messages.create({ model, ...body } as never)
      } catch (e) {
        if (e instanceof Anthropic.APIError) return e
        throw e
      }
      throw new Error("the request was answered")
    }
    const noMax = await refused({ messages: [{ role: "user", content: "hi" }] })
    assert.strictEqual(noMax.status, 400)
    assert.strictEqual((noMax.error as { error: { type: string } }).error.type, "invalid_request_error")
    const image = await refused({
      max_tokens: 4,
      messages: [{ role: "user", content: [{ type: "image", source: { type: "url", url: "http://x" } }] }]
    })
    assert.strictEqual(image.status, 400)
    assert.match(image.message, /messages\[0\]\.content\[0\]: image blocks are not served/)
  })
})
