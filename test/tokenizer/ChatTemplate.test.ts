/**
 * ChatTemplate: how messages reach a jinja template (tool-call arguments as strings or objects, tools as None,
 * named templates), and the checks that guard the incremental continuation.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import type { Message } from "../../src/domain/Message.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/tokenizer/ChatTemplate.ts"
import * as HfTokenizer from "../../src/tokenizer/HfTokenizer.ts"
import { ChatTemplatePrefixError, TokenizerError } from "../../src/tokenizer/Tokenizer.ts"

const call: Message = {
  role: "assistant",
  content: "",
  tool_calls: [{ id: "c1", type: "function", function: { name: "add", arguments: '{"a":1,"b":[2,3]}' } }]
}
const render = (
  source: string,
  messages: ReadonlyArray<Message>,
  options?: Partial<ChatTemplate.ChatTemplateOptions>
) => ChatTemplate.make(source, { eos_token: "<|im_end|>" }).render(messages, { addGenerationPrompt: false, ...options })

const expectPrefixError = (thunk: () => unknown, reason: ChatTemplatePrefixError["reason"]) => {
  try {
    thunk()
  } catch (error) {
    assert.instanceOf(error, ChatTemplatePrefixError)
    assert.strictEqual(error.reason, reason)
    return
  }
  assert.fail(`expected ChatTemplatePrefixError ${reason}`)
}

describe("ChatTemplate", () => {
  it("hands tool-call arguments to templates that apply tojson as objects, to `is string` templates verbatim", () => {
    const tojson = "{% for c in messages[0].tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}"
    assert.strictEqual(render(tojson, [call]), '{"a": 1, "b": [2, 3]}')
    const either =
      "{% for c in messages[0].tool_calls %}{% if c.function.arguments is string %}{{ c.function.arguments }}" +
      "{% else %}{{ c.function.arguments | tojson }}{% endif %}{% endfor %}"
    assert.strictEqual(render(either, [call]), '{"a":1,"b":[2,3]}')
    const forced = ChatTemplate.make(tojson, {}, { toolArguments: "string" }).render([call], {
      addGenerationPrompt: false
    })
    assert.strictEqual(forced, '"{\\"a\\":1,\\"b\\":[2,3]}"')
    const broken: Message = {
      ...call,
      tool_calls: [{ ...call.tool_calls![0]!, function: { name: "add", arguments: "{oops" } }]
    }
    assert.strictEqual(render(tojson, [broken]), '"{oops"') // not JSON: the model's text is kept
  })

  it("passes tools as None when absent, the special-token strings, and extra variables", () => {
    const source = "{{ tools is none }} {{ eos_token }} {{ add_generation_prompt }} {{ flavour }}"
    assert.strictEqual(render(source, [], { addGenerationPrompt: true, flavour: "x" }), "true <|im_end|> true x")
    assert.strictEqual(
      render("{{ tools | length }}", [], { tools: [{ type: "function", function: { name: "f" } }] }),
      "1"
    )
  })

  it("fails with a typed error when a template does not parse or raises", () => {
    assert.throws(() => ChatTemplate.make("{% if %}", {}), TokenizerError)
    try {
      render("{{ raise_exception('no system role') }}", [])
      assert.fail("expected TokenizerError")
    } catch (error) {
      assert.instanceOf(error, TokenizerError)
      assert.strictEqual(error.reason, "Template")
      assert.include(error.message, "no system role")
    }
  })

  it("takes the `tool_use` template of a named list when tools are given, `default` otherwise", () => {
    const files = ByteTokenizer.make().hfFiles()
    const tokenizer = HfTokenizer.fromFiles({
      tokenizerJson: files["tokenizer.json"],
      tokenizerConfig: {
        ...(files["tokenizer_config.json"] as object),
        chat_template: [
          { name: "default", template: "plain" },
          { name: "tool_use", template: "with tools" }
        ]
      }
    })
    assert.strictEqual(tokenizer.applyChatTemplate([], { addGenerationPrompt: false }), "plain")
    assert.strictEqual(tokenizer.applyChatTemplate([], { addGenerationPrompt: false, tools: [] }), "with tools")
  })

  it("continuation appends exactly the ids that encoding the whole conversation ends with", () => {
    const byte = ByteTokenizer.make()
    const history: ReadonlyArray<Message> = [{ role: "user", content: "add 1 and 2" }, call]
    const next: ReadonlyArray<Message> = [
      { role: "tool", content: "3" },
      { role: "tool", content: "ok" }
    ]
    const options = { addGenerationPrompt: true }
    const result = ChatTemplate.continuation(byte, history, next, options)
    assert.strictEqual(
      result.text,
      "\n<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n" +
        "<|im_start|>assistant\n"
    )
    const full = byte.applyChatTemplateIds([...history, ...next], options)
    assert.deepStrictEqual(result.ids, full.slice(full.length - result.ids.length))
    // from a prompt (no assistant turn yet) it is the generation prompt alone
    const first = ChatTemplate.continuation(byte, history.slice(0, 1), [], options)
    assert.strictEqual(first.text, "<|im_start|>assistant\n")
  })

  it("continuation refuses what it cannot append token-exactly", () => {
    const history: ReadonlyArray<Message> = [
      { role: "user", content: "hi" },
      { role: "assistant", content: "yo" }
    ]
    const more: ReadonlyArray<Message> = [{ role: "user", content: "bye" }]
    const options = { addGenerationPrompt: true }
    const withTemplate = (chatTemplate: string) => ByteTokenizer.make({ chatTemplate })
    // a template that rewrites history: it numbers turns from the end
    expectPrefixError(
      () =>
        ChatTemplate.continuation(
          withTemplate(
            "{% for m in messages %}{{ messages|length - loop.index0 }}{{ m.content }}<|im_end|>{% endfor %}"
          ),
          history,
          more,
          options
        ),
      "HistoryRewritten"
    )
    // an assistant turn that ends without an end-of-turn token
    expectPrefixError(
      () =>
        ChatTemplate.continuation(
          withTemplate("{% for m in messages %}{{ m.content }}\n{% endfor %}"),
          history,
          more,
          options
        ),
      "NoEndOfTurn"
    )
    // the new text starts mid-word, where encoding it alone could merge differently
    expectPrefixError(
      () =>
        ChatTemplate.continuation(
          withTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"),
          [history[0]!],
          more,
          options
        ),
      "UnsafeBoundary"
    )
  })

  it.effect("the run config's chat_template (inline or a file) replaces the saved one; chat_template.jinja wins", () =>
    Effect.gen(function* () {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      yield* AutoTokenizer.save(ByteTokenizer.make(), dir)
      const user: ReadonlyArray<Message> = [{ role: "user", content: "q" }]
      const inline = yield* AutoTokenizer.fromConfig({
        kind: "byte",
        path: dir,
        chat_template: "{{ messages[0].content }}!"
      })
      assert.strictEqual(inline.applyChatTemplate(user, { addGenerationPrompt: false }), "q!")
      yield* fs.writeFileString(`${dir}/t.jinja`, "file:{{ messages[0].content }}")
      const fromFile = yield* AutoTokenizer.fromConfig({ kind: "hf", chat_template: `${dir}/t.jinja` }, dir)
      assert.strictEqual(fromFile.kind, "byte") // the files say what it is
      assert.strictEqual(fromFile.applyChatTemplate(user, { addGenerationPrompt: false }), "file:q")
      yield* fs.writeFileString(`${dir}/chat_template.jinja`, "jinja:{{ messages[0].content }}")
      const withJinja = yield* AutoTokenizer.load(dir)
      assert.strictEqual(withJinja.applyChatTemplate(user, { addGenerationPrompt: false }), "jinja:q")
      const noDir = yield* AutoTokenizer.fromConfig({ kind: "hf" }).pipe(Effect.flip)
      assert.strictEqual(noDir.reason, "NotFound")
    }).pipe(Effect.provide(NodeServices.layer))
  )
})
