/**
 * ByteTokenizer: ids are UTF-8 bytes, named special tokens follow, the vocabulary is padded to a multiple of 64;
 * its HF files load back into the same tokenizer, and an independent implementation (@huggingface/tokenizers)
 * reading those files encodes the same ids.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Layer } from "effect"
import type { Message } from "../../src/domain/Message.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import type * as ChatTemplate from "../../src/tokenizer/ChatTemplate.ts"
import * as HfTokenizer from "../../src/tokenizer/HfTokenizer.ts"
import * as Tokenizer from "../../src/tokenizer/Tokenizer.ts"

const byte = ByteTokenizer.make()

const samples = [
  "hello",
  "é€😀 naïve 你好",
  "<|im_start|>user\nhi<|im_end|>\n",
  '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
  "<think>\nwhy\n</think>\n\n<answer>42</answer><|endoftext|>",
  "<|im_start<|im_end|>|>", // a broken token around a real one
  ""
]

const tools: ReadonlyArray<ChatTemplate.ToolDefinition> = [
  {
    type: "function",
    function: { name: "add", description: "Add two numbers", parameters: { type: "object", properties: {} } }
  }
]
const conversation: ReadonlyArray<Message> = [
  { role: "system", content: "You are a calculator." },
  { role: "user", content: "1+2?" },
  {
    role: "assistant",
    content: "Let me add.",
    tool_calls: [{ id: "c1", type: "function", function: { name: "add", arguments: '{"a": 1, "b": 2}' } }]
  },
  { role: "tool", content: "3", tool_call_id: "c1" }
]

describe("ByteTokenizer", () => {
  it("lays out bytes, then named special tokens, then reserved ones up to a multiple of 64", () => {
    assert.strictEqual(byte.vocabSize, 320)
    ByteTokenizer.defaultSpecialTokens.forEach((token, i) => {
      assert.strictEqual(byte.tokenToId(token), 256 + i)
    })
    assert.strictEqual(byte.tokenToId("<|reserved_special_token_0|>"), 268)
    assert.strictEqual(byte.idToToken(319), "<|reserved_special_token_51|>")
    assert.deepStrictEqual(byte.eosIds, [259, 257]) // <|im_end|>, <|endoftext|>
    assert.strictEqual(byte.padId, 256)
    assert.strictEqual(byte.bosId, undefined)
    const small = ByteTokenizer.make({ specialTokens: ["<|eot|>", "<x>"], vocabMultiple: 8 })
    assert.strictEqual(small.vocabSize, 264)
    assert.deepStrictEqual(small.eosIds, [256])
  })

  it("encodes UTF-8 bytes and special-token strings as single ids", () => {
    assert.deepStrictEqual(byte.encode("hi"), [104, 105])
    assert.deepStrictEqual(byte.encode("é€😀"), [0xc3, 0xa9, 0xe2, 0x82, 0xac, 0xf0, 0x9f, 0x98, 0x80])
    assert.deepStrictEqual(byte.encode("<|im_start|>user\nhi<|im_end|>"), [258, 117, 115, 101, 114, 10, 104, 105, 259])
    assert.deepStrictEqual(byte.encode("<tool_call></tool_call>"), [260, 261])
  })

  it("round-trips text and special tokens; skips control tokens but keeps markup on request", () => {
    for (const text of samples) assert.strictEqual(byte.decode(byte.encode(text)), text)
    const ids = byte.encode("<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>")
    assert.strictEqual(byte.decode(ids, { skipSpecialTokens: true }), "assistant\n<tool_call>x</tool_call>")
    assert.strictEqual(byte.decode([0xe2, 0x82]), "\uFFFD") // a cut multi-byte character
    assert.strictEqual(byte.decode([104, 1000, -1, 105]), "hi") // ids outside the vocabulary
  })

  it("renders the ChatML template with tools in the system message and tool results as a user turn", () => {
    const text = byte.applyChatTemplate(conversation, { tools, addGenerationPrompt: true })
    assert.strictEqual(
      text,
      [
        "<|im_start|>system",
        "You are a calculator.",
        "",
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
        '{"type": "function", "function": {"name": "add", "description": "Add two numbers", ' +
          '"parameters": {"type": "object", "properties": {}}}}',
        "</tools>",
        "",
        "For each function call, return a json object with function name and arguments within " +
          "<tool_call></tool_call> XML tags:",
        "<tool_call>",
        '{"name": <function-name>, "arguments": <args-json-object>}',
        "</tool_call><|im_end|>",
        "<|im_start|>user",
        "1+2?<|im_end|>",
        "<|im_start|>assistant",
        "Let me add.",
        "<tool_call>",
        '{"name": "add", "arguments": {"a": 1, "b": 2}}',
        "</tool_call><|im_end|>",
        "<|im_start|>user",
        "<tool_response>",
        "3",
        "</tool_response><|im_end|>",
        "<|im_start|>assistant",
        ""
      ].join("\n")
    )
    const plain = byte.applyChatTemplate([{ role: "user", content: "hi" }], { addGenerationPrompt: false })
    assert.strictEqual(plain, "<|im_start|>user\nhi<|im_end|>\n")
    assert.deepStrictEqual(
      byte.applyChatTemplateIds(conversation, { tools, addGenerationPrompt: true }),
      byte.encode(text)
    )
  })

  it("an independent HF implementation reading the saved files encodes and decodes the same", () => {
    const files = byte.hfFiles()
    const viaHf = HfTokenizer.fromFiles({
      tokenizerJson: files["tokenizer.json"],
      tokenizerConfig: files["tokenizer_config.json"]
    })
    assert.strictEqual(viaHf.vocabSize, 320)
    assert.deepStrictEqual(viaHf.eosIds, byte.eosIds)
    assert.strictEqual(viaHf.padId, byte.padId)
    for (const text of samples) {
      assert.deepStrictEqual(viaHf.encode(text), byte.encode(text), text)
      assert.strictEqual(viaHf.decode(byte.encode(text)), text)
    }
    assert.strictEqual(
      viaHf.applyChatTemplate(conversation, { tools, addGenerationPrompt: true }),
      byte.applyChatTemplate(conversation, { tools, addGenerationPrompt: true })
    )
  })

  it.effect("saves into a checkpoint directory and loads back equal, custom tokens and template included", () =>
    Effect.gen(function* () {
      const fs = yield* FileSystem.FileSystem
      const root = yield* fs.makeTempDirectoryScoped()
      const custom = ByteTokenizer.make({
        specialTokens: ["<|pad|>", "<|eot|>", "<call>"],
        chatTemplate: "{% for m in messages %}{{ m.content }}<|eot|>{% endfor %}"
      })
      for (const [name, original] of [
        ["default", byte],
        ["custom", custom]
      ] as const) {
        yield* AutoTokenizer.save(original, `${root}/${name}`)
        const loaded = yield* AutoTokenizer.load(`${root}/${name}`)
        assert.strictEqual(loaded.kind, "byte")
        assert.strictEqual(loaded.vocabSize, original.vocabSize)
        assert.deepStrictEqual(loaded.addedTokens, original.addedTokens)
        assert.deepStrictEqual(loaded.eosIds, original.eosIds)
        assert.strictEqual(loaded.padId, original.padId)
        assert.strictEqual(loaded.chatTemplate, original.chatTemplate)
        assert.deepStrictEqual(loaded.hfFiles(), original.hfFiles())
        for (const text of samples) assert.deepStrictEqual(loaded.encode(text), original.encode(text))
      }
      const loadedCustom = yield* AutoTokenizer.load(`${root}/custom`)
      assert.strictEqual(
        loadedCustom.applyChatTemplate([{ role: "user", content: "a" }], { addGenerationPrompt: false }),
        "a<|eot|>"
      )
      assert.deepStrictEqual(loadedCustom.encode("a<|eot|>"), [97, 257])
    }).pipe(Effect.provide(NodeServices.layer))
  )

  it.effect("the service over a byte tokenizer, from the run config", () =>
    Effect.gen(function* () {
      const tokenizer = yield* Tokenizer.Tokenizer
      assert.strictEqual(tokenizer.vocabSize, 320)
      const ids = yield* tokenizer.applyChatTemplateIds([{ role: "user", content: "hi" }], {
        addGenerationPrompt: true
      })
      assert.strictEqual(tokenizer.decode(ids), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
      const next = yield* tokenizer.continuation(
        [
          { role: "user", content: "hi" },
          { role: "assistant", content: "hello" }
        ],
        [{ role: "user", content: "bye" }],
        { addGenerationPrompt: true }
      )
      assert.strictEqual(next.text, "\n<|im_start|>user\nbye<|im_end|>\n<|im_start|>assistant\n")
    }).pipe(Effect.provide(AutoTokenizer.layer({ kind: "byte" }).pipe(Layer.provide(NodeServices.layer))))
  )
})
