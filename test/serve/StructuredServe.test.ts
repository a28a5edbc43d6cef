/**
 * Structured outputs and token-by-token streaming of `serve`, through the official `openai` client: the quickstart
 * policy (a 363 K-parameter byte-level model that was never trained to write JSON) served in process, asked for a
 * judge's answer (`{"scores": [three numbers in [0, 1]]}`) at temperature 1 under several seeds, for any JSON object,
 * and through vLLM's `structured_outputs` / `guided_json` fields; every answer must parse and validate. Streaming:
 * a 200-token completion's chunks arrive while it is generated, not all at its end.
 */
import OpenAI from "openai"
import { assert, beforeAll, describe, it } from "vitest"
import { useQuickstartServe } from "../fixtures/QuickstartServe.ts"

const served = useQuickstartServe()
let client: OpenAI
beforeAll(() => {
  client = new OpenAI({ baseURL: `${served.url}/v1`, apiKey: "unused", maxRetries: 0 })
})

const scoresSchema = {
  type: "object",
  properties: {
    scores: { type: "array", items: { type: "number", minimum: 0, maximum: 1 }, minItems: 3, maxItems: 3 }
  },
  required: ["scores"]
}

/** The judge's answer checked by hand (independently of the automaton that produced it). */
const validScores = (text: string) => {
  const value = JSON.parse(text) as unknown
  assert.isObject(value, text)
  assert.deepStrictEqual(Object.keys(value as object), ["scores"], text)
  const scores = (value as { scores: unknown }).scores
  assert.isArray(scores, text)
  assert.lengthOf(scores as Array<unknown>, 3, text)
  for (const s of scores as Array<unknown>) {
    assert.isNumber(s, text)
    assert.isTrue((s as number) >= 0 && (s as number) <= 1, text)
  }
}

const judgeMessages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [
  { role: "system", content: "Score each of the three answers from 0 to 1. Answer in JSON." },
  { role: "user", content: "Question: 2 + 2?\nAnswer 1: 4\nAnswer 2: 5\nAnswer 3: four" }
]

describe("structured outputs in serve", () => {
  it("json_schema: every answer parses and validates, at temperature 1 under several seeds (chat and completions)", async () => {
    const response_format = {
      type: "json_schema" as const,
      json_schema: { name: "scores", schema: scoresSchema, strict: true }
    }
    const texts: Array<string> = []
    for (const seed of [1, 2, 3]) {
      const chat = await client.chat.completions.create({
        model: "quickstart",
        messages: judgeMessages,
        response_format,
        temperature: 1,
        seed,
        max_tokens: 160
      })
      const choice = chat.choices[0]!
      assert.strictEqual(choice.finish_reason, "stop", choice.message.content ?? "")
      validScores(choice.message.content!)
      texts.push(choice.message.content!)
    }
    // the mask constrains, it does not decide: different seeds give different answers
    assert.isAbove(new Set(texts).size, 1)
    const completion = await client.completions.create({
      model: "quickstart",
      prompt: "Scores of the three answers:",
      temperature: 1,
      seed: 5,
      n: 2,
      max_tokens: 160,
      logprobs: 0,
      response_format
    } as OpenAI.CompletionCreateParamsNonStreaming)
    for (const c of completion.choices) {
      assert.strictEqual(c.finish_reason, "stop")
      validScores(c.text)
      // the log-probs are those of the masked distribution: each token was drawn among the allowed ones only
      assert.isTrue(c.logprobs!.token_logprobs!.every((lp) => lp <= 0 && Number.isFinite(lp)))
    }
  })

  it("json_object, vLLM's structured_outputs / guided_json / guided_choice, and a streamed constrained answer", async () => {
    for (const seed of [1, 2]) {
      const chat = await client.chat.completions.create({
        model: "quickstart",
        messages: judgeMessages,
        response_format: { type: "json_object" },
        temperature: 1,
        seed,
        max_tokens: 200
      })
      const text = chat.choices[0]!.message.content!
      if (chat.choices[0]!.finish_reason === "stop") assert.isObject(JSON.parse(text), text)
      else assert.strictEqual(chat.choices[0]!.finish_reason, "length") // ran out before closing: OpenAI's length
      assert.isTrue(text.startsWith("{"), text)
    }
    const small = {
      type: "object",
      properties: { ok: { type: "boolean" }, n: { type: "integer", minimum: 1, maximum: 5 } },
      required: ["ok", "n"]
    }
    for (const extra of [{ structured_outputs: { json: small } }, { guided_json: JSON.stringify(small) }]) {
      const r = await client.chat.completions.create({
        model: "quickstart",
        messages: judgeMessages,
        temperature: 1,
        seed: 9,
        max_tokens: 40,
        ...extra
      } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
      const value = JSON.parse(r.choices[0]!.message.content!) as { ok: unknown; n: number }
      assert.isBoolean(value.ok)
      assert.isTrue(Number.isInteger(value.n) && value.n >= 1 && value.n <= 5)
    }
    const choice = await client.completions.create({
      model: "quickstart",
      prompt: "Is 2 + 2 = 4?",
      temperature: 1,
      max_tokens: 10,
      guided_choice: ["yes", "no"]
    } as OpenAI.CompletionCreateParamsNonStreaming)
    assert.include(["yes", "no"], choice.choices[0]!.text)
    // streamed: the deltas are the constrained answer
    const stream = await client.chat.completions.create({
      model: "quickstart",
      messages: judgeMessages,
      response_format: { type: "json_schema", json_schema: { name: "scores", schema: scoresSchema } },
      temperature: 1,
      seed: 11,
      max_tokens: 160,
      stream: true
    })
    let content = ""
    let finish: string | null = null
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        content += c.delta.content ?? ""
        finish = c.finish_reason ?? finish
      }
    }
    assert.strictEqual(finish, "stop")
    validScores(content)
  })

  it("refuses schema keywords it cannot enforce with a 400 naming the keyword", async () => {
    const refused = async (body: object) => {
      try {
        await client.chat.completions.create({
          model: "quickstart",
          messages: judgeMessages,
          max_tokens: 8,
          ...body
        } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
      } catch (e) {
        if (e instanceof OpenAI.APIError) return e
        throw e
      }
      throw new Error("the request was served")
    }
    const pattern = await refused({
      response_format: {
        type: "json_schema",
        json_schema: { name: "x", schema: { type: "object", properties: { a: { type: "string", pattern: "^a" } } } }
      }
    })
    assert.strictEqual(pattern.status, 400)
    assert.include(pattern.message, "`pattern`")
    assert.include(pattern.message, "#/properties/a")
    assert.strictEqual((pattern.error as { param: string }).param, "response_format.json_schema.schema")
    const regex = await refused({ structured_outputs: { regex: "a+" } })
    assert.strictEqual(regex.status, 400)
    assert.include(regex.message, "regex")
  })
})

describe("token-by-token streaming", () => {
  it("sends each token as it is sampled: the first chunk arrives long before the last", async () => {
    const started = performance.now()
    const stream = await client.completions.create({
      model: "quickstart",
      prompt: "Compute (5 - 4) + 2.",
      max_tokens: 200,
      temperature: 1,
      seed: 3,
      ignore_eos: true,
      stream: true
    } as OpenAI.CompletionCreateParamsStreaming)
    const arrivals: Array<number> = []
    let tokens = 0
    for await (const chunk of stream) {
      arrivals.push(performance.now() - started)
      for (const c of chunk.choices) tokens += ((c as unknown as { token_ids?: Array<number> }).token_ids ?? []).length
    }
    assert.strictEqual(tokens, 200)
    const first = arrivals[0]!
    const last = arrivals.at(-1)!
    // generated one decode step at a time: chunks spread over the generation rather than arriving together at its end
    assert.isBelow(first, last / 2, `first chunk at ${first.toFixed(0)} ms, last at ${last.toFixed(0)} ms`)
    const distinct = new Set(arrivals.map((t) => Math.round(t))).size
    assert.isAbove(distinct, 20, `${distinct} distinct arrival times of ${arrivals.length} chunks`)
  })

  it("streams a chat reply live too", async () => {
    const started = performance.now()
    const stream = await client.chat.completions.create({
      model: "quickstart",
      messages: [{ role: "user", content: "Compute (5 - 4) + 2." }],
      max_tokens: 64,
      temperature: 1,
      seed: 4,
      stream: true,
      ignore_eos: true
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming)
    const arrivals: Array<number> = []
    for await (const _ of stream) arrivals.push(performance.now() - started)
    assert.isBelow(arrivals[0]!, arrivals.at(-1)! / 2)
    assert.strictEqual(arrivals.length, 1 + 64 + 1) // the role, one chunk per token, the finish reason
  })
})
