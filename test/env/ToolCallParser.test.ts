import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import * as ToolCallParser from "../../src/env/ToolCallParser.ts"
import * as Prng from "../../src/model/Prng.ts"

const { parse } = ToolCallParser

describe("ToolCallParser.parse (hermes)", () => {
  it("reads several <tool_call> blocks in one turn, numbering them call_0, call_1", () => {
    const text = `I'll add, then echo.
<tool_call>
{"name": "add", "arguments": {"a": 2, "b": 3}}
</tool_call>
<tool_call>
{"name": "echo", "arguments": {"text": "hi"}}
</tool_call>`
    assert.deepStrictEqual(parse(text, "hermes"), {
      calls: [
        { id: "call_0", name: "add", arguments: { a: 2, b: 3 } },
        { id: "call_1", name: "echo", arguments: { text: "hi" } }
      ]
    })
  })

  it("accepts arguments given as a JSON string (Qwen3), braces inside strings included", () => {
    const text = `<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"a } b { c\\", \\"n\\": {\\"k\\": [1, 2]}}"}</tool_call>`
    assert.deepStrictEqual(parse(text, "hermes").calls, [
      { id: "call_0", name: "echo", arguments: { text: "a } b { c", n: { k: [1, 2] } } }
    ])
  })

  it("reads nested argument objects whose strings contain braces and escaped quotes", () => {
    const text = `<tool_call>{"name": "write", "arguments": {"path": "x.json", "content": "{\\"a\\": \\"}\\"}", "opts": {"mode": "w"}}}</tool_call>`
    assert.deepStrictEqual(parse(text, "hermes").calls[0]!.arguments, {
      path: "x.json",
      content: '{"a": "}"}',
      opts: { mode: "w" }
    })
  })

  it("reads a last block whose </tool_call> was swallowed as a stop string", () => {
    assert.deepStrictEqual(parse(`<tool_call>\n{"name": "now", "arguments": {}}\n`).calls, [
      { id: "call_0", name: "now", arguments: {} }
    ])
  })

  it("forgives a stray closing brace after the object, a slip small models make", () => {
    assert.deepStrictEqual(parse(`<tool_call>{"name": "add", "arguments": {"a": 1}}}</tool_call>`).calls, [
      { id: "call_0", name: "add", arguments: { a: 1 } }
    ])
  })

  it("reads `parameters` as arguments, and a missing arguments key as no arguments", () => {
    const text = `<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call><tool_call>{"name": "b"}</tool_call>`
    assert.deepStrictEqual(parse(text).calls, [
      { id: "call_0", name: "a", arguments: { x: 1 } },
      { id: "call_1", name: "b", arguments: {} }
    ])
  })

  it("reads Qwen3-Coder's XML body inside <tool_call>; values that are JSON become JSON", () => {
    const text = `<tool_call>
<function=add>
<parameter=a>
2
</parameter>
<parameter=label>
two plus
</parameter>
</function>
</tool_call>`
    assert.deepStrictEqual(parse(text).calls, [{ id: "call_0", name: "add", arguments: { a: 2, label: "two plus" } }])
  })

  it("ignores calls written inside <think>, and a lone </think> whose <think> was in the prompt", () => {
    const thought = `<think>maybe <tool_call>{"name": "wrong", "arguments": {}}</tool_call></think>
<tool_call>{"name": "right", "arguments": {}}</tool_call>`
    assert.deepStrictEqual(
      parse(thought).calls.map((c) => c.name),
      ["right"]
    )
    const promptOpened = `I could call <tool_call>{"name": "wrong", "arguments": {}}</tool_call></think>
<tool_call>{"name": "right", "arguments": {}}</tool_call>`
    assert.deepStrictEqual(
      parse(promptOpened).calls.map((c) => c.name),
      ["right"]
    )
  })

  it("reports malformed JSON with its position, and keeps the calls that did parse", () => {
    // position 37 is the "}" after the trailing comma in {"a": 1,}
    const text = `<tool_call>{"name": "ok", "arguments": {}}</tool_call>
<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>`
    assert.deepStrictEqual(parse(text), {
      calls: [{ id: "call_0", name: "ok", arguments: {} }],
      error: "<tool_call> 2: invalid JSON: Expected double-quoted property name in JSON at position 37"
    })
  })

  it("reports a missing name, non-object arguments and an empty block", () => {
    assert.strictEqual(parse(`<tool_call>{"arguments": {}}</tool_call>`).error, `<tool_call> 1: missing "name"`)
    assert.strictEqual(
      parse(`<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>`).error,
      "<tool_call> 1: add: arguments must be a JSON object, got an array"
    )
    assert.strictEqual(
      parse(`<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>`).error,
      "<tool_call> 1: add: arguments: invalid JSON: Expected property name or '}' in JSON at position 1"
    )
    assert.strictEqual(parse(`<tool_call>  </tool_call>`).error, "<tool_call> 1: empty")
  })

  it("gives no finalAnswer when the turn makes calls or fails to", () => {
    assert.isUndefined(parse(`Let me check.<tool_call>{"name": "a", "arguments": {}}</tool_call>`).finalAnswer)
    assert.isUndefined(parse(`<tool_call>{"name": </tool_call>`).finalAnswer)
  })
})

describe("ToolCallParser.parse (json)", () => {
  it("reads a bare object that is the whole turn, even without arguments", () => {
    assert.deepStrictEqual(parse(`{"name": "add", "arguments": {"a": 1}}`, "json").calls, [
      { id: "call_0", name: "add", arguments: { a: 1 } }
    ])
    assert.deepStrictEqual(parse(`  {"name": "list_files"}  `, "json").calls, [
      { id: "call_0", name: "list_files", arguments: {} }
    ])
  })

  it("reads an array of calls inside a ```json fence, braces inside strings included", () => {
    const text =
      "Two calls:\n```json\n" + `[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"q": "} { ]"}}]` + "\n```"
    assert.deepStrictEqual(parse(text, "json").calls, [
      { id: "call_0", name: "a", arguments: {} },
      { id: "call_1", name: "b", arguments: { q: "} { ]" } }
    ])
  })

  it("reads calls embedded in prose, but not data objects that merely have a name", () => {
    const text = `The user {"name": "Bob"} wants a search: {"name": "search", "arguments": {"query": "x"}}. See [1].`
    assert.deepStrictEqual(parse(text, "json").calls, [{ id: "call_0", name: "search", arguments: { query: "x" } }])
  })

  it("reads the OpenAI-style {function: {name, arguments}} object with string arguments", () => {
    assert.deepStrictEqual(parse(`{"function": {"name": "add", "arguments": "{\\"a\\": 1}"}}`, "json").calls, [
      { id: "call_0", name: "add", arguments: { a: 1 } }
    ])
  })

  it("finds a call after an unclosed brace in prose, and reports a call missing its last brace", () => {
    assert.deepStrictEqual(parse(`Use { carefully: {"name": "a", "arguments": {"q": 1}}`, "json"), {
      calls: [{ id: "call_0", name: "a", arguments: { q: 1 } }]
    })
    // the inner {"q": 1} parses, but it is not a call: the broken outer object is the attempt
    assert.strictEqual(
      parse(`{"name": "a", "arguments": {"q": 1}`, "json").error,
      "tool call 1: invalid JSON: Expected ',' or '}' after property value in JSON at position 35"
    )
  })

  it("reports a broken object that names a tool, but ignores other braces in prose", () => {
    assert.strictEqual(
      parse(`Calling {"name": "add", "arguments": {"a": 1`, "json").error,
      "tool call 1: invalid JSON: Expected ',' or '}' after property value in JSON at position 36"
    )
    assert.deepStrictEqual(parse(`The set {x | x > 0} is open.`, "json"), {
      calls: [],
      finalAnswer: "The set {x | x > 0} is open."
    })
  })
})

describe("ToolCallParser.parse (xml)", () => {
  it("reads several <tool> blocks, with JSON arguments or <key>value</key> arguments", () => {
    const text = `<tool><name>add</name><arguments><a>2</a><b>3.5</b><label>sum it</label></arguments></tool>
<tool><name>echo</name><arguments>{"text": "</arguments> is fine {here}"}</arguments></tool>`
    // the second body's JSON string contains "</arguments>": the first closing tag ends the element, so it is broken
    const parsed = parse(text, "xml")
    assert.deepStrictEqual(parsed.calls, [{ id: "call_0", name: "add", arguments: { a: 2, b: 3.5, label: "sum it" } }])
    assert.strictEqual(
      parsed.error,
      `<tool> 2: echo: arguments: invalid JSON: Unterminated string in JSON at position 10`
    )
  })

  it("reads JSON arguments with nested braces, and a call without arguments", () => {
    const text = `<tool><name>write</name><arguments>{"data": {"k": "{}"}}</arguments></tool><tool><name>now</name></tool>`
    assert.deepStrictEqual(parse(text).calls, [
      { id: "call_0", name: "write", arguments: { data: { k: "{}" } } },
      { id: "call_1", name: "now", arguments: {} }
    ])
  })

  it("reports a block without a name, and argument elements that do not close", () => {
    assert.strictEqual(parse(`<tool><arguments>{}</arguments></tool>`).error, "<tool> 1: missing <name>")
    assert.strictEqual(
      parse(`<tool><name>add</name><arguments><a>1</a><b>2</arguments></tool>`).error,
      "<tool> 1: add: <b> is not closed"
    )
    assert.strictEqual(
      parse(`<tool><name>add</name><arguments>a=1</arguments></tool>`).error,
      "<tool> 1: add: arguments must be a JSON object or <key>value</key> elements"
    )
  })
})

describe("ToolCallParser.parse (react)", () => {
  it("reads several Action / Action Input pairs, multi-line JSON included", () => {
    const text = `Thought: I need two things.
Action: add
Action Input: {"a": 1,
  "b": {"c": "}"}}
Observation: 3
Action: \`mul\`
Action Input: {"a": 2}`
    assert.deepStrictEqual(parse(text, "react").calls, [
      { id: "call_0", name: "add", arguments: { a: 1, b: { c: "}" } } },
      { id: "call_1", name: "mul", arguments: { a: 2 } }
    ])
  })

  it("takes Final Answer as the answer", () => {
    assert.deepStrictEqual(parse("Thought: done.\nFinal Answer: 42 apples\n", "react"), {
      calls: [],
      finalAnswer: "42 apples"
    })
  })

  it("reports an Action without a JSON-object input", () => {
    assert.strictEqual(
      parse("Action: add\nAction Input: 1, 2", "react").error,
      "Action 1: add: Action Input must be a JSON object"
    )
    assert.strictEqual(parse("Action: add\nThought: hmm", "react").error, `Action 1: add: missing "Action Input:"`)
  })
})

describe("ToolCallParser.parse (auto and answers)", () => {
  it("detects each format by its marker", () => {
    const name = (text: string) => parse(text).calls.map((c) => c.name)
    assert.deepStrictEqual(name(`<tool_call>{"name": "h", "arguments": {}}</tool_call>`), ["h"])
    assert.deepStrictEqual(name(`<tool><name>x</name><arguments>{}</arguments></tool>`), ["x"])
    assert.deepStrictEqual(name(`Action: r\nAction Input: {}`), ["r"])
    assert.deepStrictEqual(name(`{"name": "j", "arguments": {}}`), ["j"])
  })

  it("takes <answer>…</answer> as the answer, with or without calls beside it", () => {
    assert.deepStrictEqual(parse("Reasoning… <answer> 7 </answer>"), { calls: [], finalAnswer: "7" })
    assert.strictEqual(
      parse(`<tool_call>{"name": "log", "arguments": {}}</tool_call><answer>done</answer>`).finalAnswer,
      "done"
    )
  })

  it("takes plain text, without thinking and surrounding space, as the answer", () => {
    assert.deepStrictEqual(parse("<think>2 + 3 …</think>\n  The answer is 5.  \n"), {
      calls: [],
      finalAnswer: "The answer is 5."
    })
  })

  it("drops thinking cut off by the length limit", () => {
    assert.deepStrictEqual(parse("Partial. <think>and then <tool_call>{"), { calls: [], finalAnswer: "Partial." })
  })
})

describe("ToolCallParser.parse (degenerate turns)", () => {
  it("shows the model three problems and counts the rest", () => {
    assert.strictEqual(
      parse("<tool_call></tool_call>".repeat(5)).error,
      "<tool_call> 1: empty; <tool_call> 2: empty; <tool_call> 3: empty; and 2 more"
    )
  })

  it("reads 50k characters of repeated brackets and tags in linear time (a rescan per bracket took 11 s on 20k)", () => {
    const started = performance.now()
    for (const text of ["{".repeat(50_000), "[".repeat(50_000), '{"'.repeat(25_000), "<tool_call>".repeat(5_000)]) {
      assert.deepStrictEqual(parse(text).calls, [])
    }
    const xml = `<tool><name>x</name><arguments>${"<a>".repeat(20_000)}`
    assert.strictEqual(parse(xml).error, "<tool> 1: x: <a> is not closed")
    assert.isBelow(performance.now() - started, 2_000)
  })
})

describe("ToolCallParser.parse (adversarial turns grow linearly)", () => {
  const fill = (unit: string, n: number) => unit.repeat(Math.ceil(n / unit.length)).slice(0, n)
  /** The fastest of three parses, ms: the least disturbed by the machine's other load. */
  const fastest = (text: string) => {
    let best = Infinity
    for (let i = 0; i < 3; i++) {
      const start = performance.now()
      parse(text)
      best = Math.min(best, performance.now() - start)
    }
    return best
  }
  // 4× the text may take at most 10× the time (linear: 4×; quadratic: 16×), plus 20 ms of slack for small timings.
  // Quadratic code took, 32 KiB → 128 KiB: <think> 70 ms → 1.1 s, <parameter= 140 ms → 4.3 s.
  const shapes: Record<string, (n: number) => string> = {
    "repeated <think>": (n) => fill("<think>", n),
    "a Qwen3-Coder body of unclosed <parameter=": (n) => `<tool_call><function=f>${fill("<parameter=", n)}`,
    "deep [[[[": (n) => fill("[", n),
    'deep {"a":{"a":': (n) => fill('{"a":', n),
    "one unclosed <tool_call>": (n) => `<tool_call>{"name": "f", "arguments": {"q": "${fill("x", n)}`
  }
  for (const [name, make] of Object.entries(shapes)) {
    it(`reads ${name} in time linear in its length`, () => {
      const n = 32 * 1024
      const small = make(n)
      const large = make(4 * n)
      fastest(small) // warm-up
      const t1 = fastest(small)
      const t4 = fastest(large)
      assert.isBelow(t4, 10 * t1 + 20, `${name}: ${t1.toFixed(1)} ms at 32 KiB, ${t4.toFixed(1)} ms at 128 KiB`)
    })
  }
})

describe("ToolCallParser.parse (agrees with the regex definitions it replaces)", () => {
  /** `count` strings of 1-40 units drawn with a seeded PRNG. */
  const soups = (units: ReadonlyArray<string>, count: number, seed: number) => {
    const prng = Prng.make(seed)
    const pick = () => units[Math.floor(prng.next() * units.length)]!
    return Array.from({ length: count }, () => Array.from({ length: 1 + Math.floor(prng.next() * 40) }, pick).join(""))
  }

  it("strips each <think> to the first </think> after it, then before a lone </think> and from a cut-off <think>", () => {
    const strip = (text: string) => {
      let out = text.replace(/<think>[\s\S]*?<\/think>/g, "")
      const lone = out.indexOf("</think>")
      if (lone !== -1) out = out.slice(lone + "</think>".length)
      const open = out.indexOf("<think>")
      return open === -1 ? out : out.slice(0, open)
    }
    // no tool-call markers: the answer is the text left once thinking is removed, trimmed
    for (const text of soups(["<think>", "</think>", "<think", "think>", "a", "b", " ", "\n"], 5_000, 1)) {
      assert.strictEqual(parse(text).finalAnswer, strip(text).trim(), JSON.stringify(text))
    }
  })

  it("reads Qwen3-Coder <parameter=k>v up to </parameter>, the next <parameter=, </function> or the end", () => {
    const parameters = (body: string) => {
      const args: Record<string, unknown> = {}
      for (const m of body.matchAll(
        /<parameter=([^>\s]+)>([\s\S]*?)(?:<\/parameter>|(?=<parameter=)|<\/function>|$)/g
      )) {
        const value = m[2]!.replace(/^\n/, "").replace(/\n$/, "")
        let parsed: unknown = value
        try {
          parsed = JSON.parse(value)
        } catch {}
        args[m[1]!] = parsed
      }
      return args
    }
    const units = ["<parameter=", "a", "b", ">", " ", "\n", "</parameter>", "</function>", "1", '"', "<", "="]
    for (const rest of soups(units, 5_000, 2)) {
      const body = `<function=f>${rest}`
      const calls = parse(`<tool_call>${body}`).calls
      assert.deepStrictEqual(calls[0]?.arguments, parameters(body.trim()), JSON.stringify(body))
    }
  })
})

describe("ToolCallParser.fromOpenAi", () => {
  it('keeps the engine\'s ids, reads JSON-string arguments and treats "" as no arguments', () => {
    const parsed = ToolCallParser.fromOpenAi([
      { id: "call_abc", type: "function", function: { name: "add", arguments: `{"a": 1, "s": "}{"}` } },
      { id: "", type: "function", function: { name: "now", arguments: "" } }
    ])
    assert.deepStrictEqual(parsed, {
      calls: [
        { id: "call_abc", name: "add", arguments: { a: 1, s: "}{" } },
        { id: "call_1", name: "now", arguments: {} }
      ]
    })
  })

  it("reports arguments that are not a JSON object", () => {
    const parsed = ToolCallParser.fromOpenAi([
      { id: "c1", type: "function", function: { name: "add", arguments: "[1]" } }
    ])
    assert.deepStrictEqual(parsed, {
      calls: [],
      error: "tool call 1: add: arguments must be a JSON object, got an array"
    })
  })
})

describe("ToolCallParser.toText", () => {
  const call = { name: "add", arguments: { a: 2, b: [1, { c: "x}" }] } }

  it("writes each format as a model would (Python json separators)", () => {
    assert.strictEqual(
      ToolCallParser.toText(call, "hermes"),
      `<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": [1, {"c": "x}"}]}}\n</tool_call>`
    )
    assert.strictEqual(
      ToolCallParser.toText(call, "react"),
      `Action: add\nAction Input: {"a": 2, "b": [1, {"c": "x}"}]}`
    )
    assert.strictEqual(
      ToolCallParser.toText(call, "xml"),
      `<tool><name>add</name><arguments>{"a": 2, "b": [1, {"c": "x}"}]}</arguments></tool>`
    )
  })

  it("is read back by parse, in every format, two calls to a turn", () => {
    for (const format of ["hermes", "json", "xml", "react"] as const) {
      const text = [call, { name: "now", arguments: {} }].map((c) => ToolCallParser.toText(c, format)).join("\n")
      assert.deepStrictEqual(
        parse(text, format).calls,
        [
          { id: "call_0", ...call },
          { id: "call_1", name: "now", arguments: {} }
        ],
        format
      )
      assert.deepStrictEqual(parse(text, "auto").calls.length, 2, `auto on ${format}`)
    }
  })
})

describe("ToolCallParser.parseOrFail", () => {
  it.effect("fails with a ToolCallParseError naming the format and the problem", () =>
    Effect.gen(function* () {
      const exit = yield* Effect.exit(ToolCallParser.parseOrFail(`<tool_call>{"arguments": {}}</tool_call>`, "hermes"))
      assert.isTrue(Exit.isFailure(exit))
      const error = yield* Effect.flip(ToolCallParser.parseOrFail(`<tool_call>{"arguments": {}}</tool_call>`, "hermes"))
      assert.strictEqual(error._tag, "ToolCallParseError")
      assert.strictEqual(error.format, "hermes")
      assert.strictEqual(error.message, `<tool_call> 1: missing "name"`)
    })
  )

  it.effect("succeeds on text without tool calls", () =>
    Effect.gen(function* () {
      const parsed = yield* ToolCallParser.parseOrFail("Just 5.")
      assert.deepStrictEqual(parsed, { calls: [], finalAnswer: "Just 5." })
    })
  )
})
