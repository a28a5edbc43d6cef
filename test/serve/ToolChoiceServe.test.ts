/**
 * `tool_choice: "required"` and a named function through the official `openai` client: a random tiny model (byte
 * tokenizer, weights that never learnt to call a tool) served in process answers every request with calls, streamed
 * and not, at temperature 1, because decoding is constrained to them (serve/ToolCallGrammar.ts): each call names an
 * allowed tool and its arguments parse and validate against that tool's schema; `parallel_tool_calls: false` gives
 * exactly one. `auto` samples as before (the same tokens as a plain completion of the same prompt and seed); a
 * `max_tokens` too short for a call is a `length` stop; schemas that cannot be enforced are 400s.
 */
import { Effect, Exit, Scope } from "effect"
import OpenAI from "openai"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import * as JsonSchemaCheck from "../../src/data/JsonSchemaCheck.ts"
import * as ChatReply from "../../src/serve/ChatReply.ts"
import * as LoraServe from "../fixtures/LoraServe.ts"

const model = "random"

const tools: Array<OpenAI.Chat.ChatCompletionFunctionTool> = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The forecast for a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", minLength: 1, maxLength: 8 },
          unit: { enum: ["celsius", "fahrenheit"] },
          days: { type: "integer", minimum: 1, maximum: 7 }
        },
        required: ["city", "days"],
        additionalProperties: false
      }
    }
  },
  {
    type: "function",
    function: {
      name: "add",
      parameters: {
        type: "object",
        properties: {
          xs: { type: "array", items: { type: "number", minimum: -100, maximum: 100 }, minItems: 1, maxItems: 3 },
          exact: { type: "boolean" },
          note: { type: "object", properties: { by: { type: "string", maxLength: 4 } }, required: ["by"] }
        },
        required: ["xs"]
      }
    }
  },
  { type: "function", function: { name: "now" } }
]
const schemaOf = (name: string) =>
  (tools.find((t) => t.function.name === name)!.function.parameters ?? { type: "object", properties: {} }) as Record<
    string,
    unknown
  >
const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [{ role: "user", content: "Weather in Oslo?" }]

let scope: Scope.Closeable
let client: OpenAI

beforeAll(async () => {
  scope = await Effect.runPromise(Scope.make())
  // all 100 requests of a test in one batch: a decode step's cost is mostly per step, not per row
  const url = await Effect.runPromise(LoraServe.randomRun("serve-tool-choice-", model, 100).pipe(Scope.provide(scope)))
  client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 })
}, 120_000)

afterAll(async () => {
  await Effect.runPromise(Scope.close(scope, Exit.void))
})

interface Call {
  readonly name: string
  readonly arguments: string
}

/** One chat request, whole or streamed (its deltas put together): the finish reason, the calls and the content. */
const ask = async (body: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming, stream: boolean) => {
  if (!stream) {
    const choice = (await client.chat.completions.create(body)).choices[0]!
    const calls = (choice.message.tool_calls ?? []).map(
      (c) => (c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function
    )
    return { finish: choice.finish_reason, calls, content: choice.message.content }
  }
  const calls: Array<{ name: string; arguments: string }> = []
  let finish: string | null = null
  let content = ""
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    for (const c of chunk.choices) {
      content += c.delta.content ?? ""
      for (const d of c.delta.tool_calls ?? []) {
        calls[d.index] ??= { name: "", arguments: "" }
        calls[d.index]!.name += d.function?.name ?? ""
        calls[d.index]!.arguments += d.function?.arguments ?? ""
      }
      finish = c.finish_reason ?? finish
    }
  }
  return { finish, calls: calls as ReadonlyArray<Call>, content }
}

/** The calls' problems: a name not allowed, arguments that do not parse or do not validate ("" when none). */
const problemsOf = (calls: ReadonlyArray<Call>, allowed: ReadonlyArray<string>): string =>
  calls
    .flatMap((call) => {
      if (!allowed.includes(call.name)) return [`${call.name} is not allowed`]
      let args: unknown
      try {
        args = JSON.parse(call.arguments)
      } catch {
        return [`${call.name}: arguments are not JSON: ${call.arguments}`]
      }
      return JsonSchemaCheck.problems(schemaOf(call.name), args).map((p) => `${call.name}: ${p}`)
    })
    .join("; ")

describe("tool_choice required / named in serve, through the openai client", () => {
  it("100 of 100 requests get valid calls at temperature 1: required and named, streamed and not", async () => {
    const modes = [
      { choice: "required" as const, parallel: undefined, stream: false },
      { choice: "required" as const, parallel: false, stream: true },
      { choice: "get_weather", parallel: undefined, stream: true },
      { choice: "add", parallel: false, stream: false }
    ]
    const started = performance.now()
    const outcomes = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const mode = modes[i % modes.length]!
        const body: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming = {
          model,
          messages,
          tools,
          tool_choice: mode.choice === "required" ? "required" : { type: "function", function: { name: mode.choice } },
          ...(mode.parallel === undefined ? {} : { parallel_tool_calls: mode.parallel }),
          temperature: 1,
          seed: i,
          max_tokens: 400
        }
        const reply = await ask(body, mode.stream)
        const allowed = mode.choice === "required" ? tools.map((t) => t.function.name) : [mode.choice]
        const problems = [
          reply.finish === "tool_calls" ? "" : `finish_reason ${reply.finish}`,
          reply.calls.length === 0 ? "no call" : "",
          reply.content === null || reply.content === "" ? "" : `content ${JSON.stringify(reply.content)}`,
          mode.parallel === false && reply.calls.length !== 1 ? `${reply.calls.length} calls` : "",
          problemsOf(reply.calls, allowed)
        ].filter((p) => p !== "")
        return { i, mode, calls: reply.calls, problems }
      })
    )
    const seconds = (performance.now() - started) / 1000
    const failed = outcomes.filter((o) => o.problems.length > 0)
    assert.deepStrictEqual(
      failed.map((o) => `request ${o.i}: ${o.problems.join(", ")}`),
      [],
      `${100 - failed.length} of 100 in ${seconds.toFixed(1)} s`
    )
    // the mask constrains, it does not decide: the sampled arguments differ, and `required` calls more than one tool
    assert.isAbove(new Set(outcomes.flatMap((o) => o.calls.map((c) => c.arguments))).size, 50)
    const requiredNames = outcomes
      .filter((o) => o.mode.choice === "required")
      .flatMap((o) => o.calls.map((c) => c.name))
    assert.isAbove(new Set(requiredNames).size, 1)
    console.log(`tool_choice: 100 constrained requests (4 modes, in one batch) in ${seconds.toFixed(1)} s`)
  }, 120_000)

  it("auto samples as before: the tokens of a plain completion of the same prompt and seed", async () => {
    const whole = await client.chat.completions.create({
      model,
      messages,
      tools,
      tool_choice: "auto",
      temperature: 1,
      seed: 5,
      max_tokens: 40
    })
    const promptIds = (whole as unknown as { prompt_token_ids: Array<number> }).prompt_token_ids
    const completion = await client.completions.create({
      model,
      prompt: promptIds,
      temperature: 1,
      seed: 5,
      max_tokens: 40
    })
    const tokenIds = (c: unknown) => (c as { token_ids: Array<number> }).token_ids
    assert.deepStrictEqual(tokenIds(whole.choices[0]), tokenIds(completion.choices[0]))
    // the random model writes no call of its own
    assert.isUndefined(whole.choices[0]!.message.tool_calls)
    assert.notStrictEqual(whole.choices[0]!.finish_reason, "tool_calls")
  })

  it("a max_tokens too short for a call is a length stop: the unfinished call as content, no tool_calls", async () => {
    for (const stream of [false, true]) {
      const reply = await ask({ model, messages, tools, tool_choice: "required", seed: 1, max_tokens: 6 }, stream)
      assert.strictEqual(reply.finish, "length")
      assert.deepStrictEqual(reply.calls, [])
      // the call's opening, as the `<tool_call>` token or spelt out byte by byte
      assert.isTrue(
        '<tool_call>\n{"name": '.startsWith(reply.content ?? "-") || (reply.content ?? "").startsWith("<tool_call>"),
        reply.content ?? ""
      )
    }
  })

  it("refuses a tool schema it cannot enforce (param tools) and a non-boolean parallel_tool_calls", async () => {
    const refused = async (body: Record<string, unknown>) => {
      try {
        await client.chat.completions.create({ model, messages, max_tokens: 8, ...body } as never)
      } catch (e) {
        if (e instanceof OpenAI.APIError) return e
        throw e
      }
      throw new Error("the request was answered")
    }
    const pattern: OpenAI.Chat.ChatCompletionFunctionTool = {
      type: "function",
      function: { name: "find", parameters: { type: "object", properties: { q: { type: "string", pattern: "^a" } } } }
    }
    const schema = await refused({ tools: [...tools, pattern], tool_choice: "required" })
    assert.strictEqual(schema.status, 400)
    assert.strictEqual(schema.param, "tools")
    assert.match((schema.error as { message: string }).message, /tools\[3\] \(find\).*`pattern`/)
    // a named function whose schema is fine is served beside it
    const fine = await client.chat.completions.create({
      model,
      messages,
      tools: [...tools, pattern],
      tool_choice: { type: "function", function: { name: "now" } },
      parallel_tool_calls: false,
      max_tokens: 80
    })
    assert.strictEqual(fine.choices[0]!.finish_reason, "tool_calls")
    assert.deepStrictEqual(
      fine.choices[0]!.message.tool_calls!.map(
        (c) => (c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function
      ),
      [{ name: "now", arguments: "{}" }]
    )
    const parallel = await refused({ tools, tool_choice: "required", parallel_tool_calls: "no" })
    assert.strictEqual(parallel.status, 400)
    assert.strictEqual(parallel.param, "parallel_tool_calls")
  })
})

describe("ChatReply.chatMessage", () => {
  it("keeps only the first call with parallel_tool_calls false, under auto too", () => {
    const text =
      '<tool_call>\n{"name": "add", "arguments": {"xs": [1]}}\n</tool_call>\n' +
      '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    const calls = (parallel: boolean) =>
      (ChatReply.chatMessage(text, true, undefined, parallel).message["tool_calls"] as Array<{ function: Call }>).map(
        (c) => c.function.name
      )
    assert.deepStrictEqual(calls(true), ["add", "now"])
    assert.deepStrictEqual(calls(false), ["add"])
  })
})
