/**
 * The tool calls `tool_choice: "required"` or a named function asks of a chat reply (serve/ChatCompletions.ts), as a
 * grammar for constrained decoding (serve/JsonGrammar.ts, masked per token by serve/StructuredOutput.ts): the reply is
 * one call, or with `parallel_tool_calls` (the default) one or more, in the markup the served model writes, each naming
 * an allowed tool (any of `tools`, or the named one) with arguments valid against that tool's `parameters` schema.
 * vLLM constrains decoding the same way but to a JSON list of `{"name", "parameters"}`; a call in the model's own
 * format keeps a trained policy on the path it was trained on, and the tool parser reads it as any other reply.
 *
 * The markup, per env/ToolCallParser.ts write format (the one the prompt teaches; the chat templates' is `hermes`),
 * as ToolCallParser `toText` and the Qwen chat templates spell it:
 * - hermes: `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`
 * - json: `{"name": "NAME", "arguments": ARGS}`
 * - xml: `<tool><name>NAME</name><arguments>ARGS</arguments></tool>`
 * - react: `Action: NAME\nAction Input: ARGS`
 * Calls are separated by one `\n`; nothing comes before the first or after the last. ARGS is what JsonGrammar writes
 * for the schema (`{}` for a tool without `parameters`); a schema keyword it cannot enforce, or a schema that is not an
 * object's, is a 400 naming the tool (param `tools`). Tags the tokenizer holds as one added token (Qwen's
 * `<tool_call>`) are allowed as that token too.
 */
import { Effect } from "effect"
import type * as ToolCallParser from "../env/ToolCallParser.ts"
import type { GenerateRequest } from "../inference/InferenceEngine.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import * as JsonGrammar from "./JsonGrammar.ts"
import * as Refusal from "./Refusal.ts"
import * as StructuredOutput from "./StructuredOutput.ts"

/** How a format writes one call around its arguments: `open`, `head(name)`, ARGS, `close`. */
interface Markup {
  readonly open: string
  readonly head: (name: string) => string
  readonly close: string
}

const jsonHead = (name: string) => `${JSON.stringify(name)}, "arguments": `

const markups: Record<ToolCallParser.WriteFormat, Markup> = {
  hermes: { open: '<tool_call>\n{"name": ', head: jsonHead, close: "}\n</tool_call>" },
  json: { open: '{"name": ', head: jsonHead, close: "}" },
  xml: { open: "<tool><name>", head: (name) => `${name}</name><arguments>`, close: "</arguments></tool>" },
  react: { open: "Action: ", head: (name) => `${name}\nAction Input: `, close: "" }
}

const separator = "\n"

/** A tool's `parameters` that cannot be enforced: `index` is the tool's place in `tools`. */
export class ToolSchemaError extends Error {
  readonly index: number
  constructor(message: string, index: number) {
    super(message)
    this.index = index
  }
}

/** A tool's arguments as a grammar node: its schema, which must describe an object (none: `{}`). */
const argumentsOf = (tool: ToolDefinition, index: number): JsonGrammar.Node => {
  const schema = tool.function.parameters
  if (schema === undefined || schema === null) return JsonGrammar.literal("{}")
  let root: JsonGrammar.Node
  try {
    root = JsonGrammar.compile(schema).root
  } catch (e) {
    if (e instanceof JsonGrammar.SchemaError) {
      throw new ToolSchemaError(`tools[${index}] (${tool.function.name}): ${e.message}`, index)
    }
    throw e
  }
  if (root.kind !== "object" && root.kind !== "anyObject") {
    throw new ToolSchemaError(
      `tools[${index}] (${tool.function.name}): \`parameters\` must be an object's schema to constrain its calls`,
      index
    )
  }
  return root
}

/**
 * The reply's grammar: calls to the tools named in `allowed` (in `tools`' order), one when `parallel` is false, else
 * one or more. Throws ToolSchemaError.
 */
export const grammarOf = (
  tools: ReadonlyArray<ToolDefinition>,
  allowed: ReadonlySet<string>,
  parallel: boolean,
  format: ToolCallParser.WriteFormat
): JsonGrammar.Grammar => {
  const markup = markups[format]
  const cases = tools.flatMap((tool, index) =>
    allowed.has(tool.function.name) ? [{ head: markup.head(tool.function.name), node: argumentsOf(tool, index) }] : []
  )
  const call = JsonGrammar.sequence([
    JsonGrammar.literal(markup.open),
    JsonGrammar.switchOn(cases),
    ...(markup.close === "" ? [] : [JsonGrammar.literal(markup.close)])
  ])
  if (!parallel) return { root: call }
  return {
    root: JsonGrammar.sequence([call, JsonGrammar.repeat(JsonGrammar.sequence([JsonGrammar.literal(separator), call]))])
  }
}

/** The text a format writes around calls, where a tokenizer's added tokens (`<tool_call>`) may stand for part of it. */
export const markupTexts = (format: ToolCallParser.WriteFormat): ReadonlyArray<string> => {
  const { open, close } = markups[format]
  return [open, close, separator]
}

/**
 * The requests constrained to the calls asked for (one automaton per request; masks memoised across requests with
 * the same tools, choice and format). A tool schema that cannot be enforced is a 400 (param `tools`).
 */
export const constrained = (
  requests: ReadonlyArray<GenerateRequest>,
  options: {
    readonly tools: ReadonlyArray<ToolDefinition>
    readonly allowed: ReadonlySet<string>
    readonly parallel: boolean
    readonly format: ToolCallParser.WriteFormat
    readonly tokenizer: TokenizerImpl
  }
) =>
  Effect.gen(function* () {
    const { tools, allowed, parallel, format, tokenizer } = options
    const grammar = yield* Effect.try({
      try: () => grammarOf(tools, allowed, parallel, format),
      catch: (e) =>
        e instanceof ToolSchemaError
          ? new Refusal.BadRequest(e.message, 400, "tools")
          : new Refusal.BadRequest(e instanceof Error ? e.message : String(e))
    })
    const trie = StructuredOutput.trieOf(tokenizer)
    const markup = StructuredOutput.markupTokens(tokenizer, markupTexts(format))
    const schemas = tools
      .filter((t) => allowed.has(t.function.name))
      .map((t) => [t.function.name, t.function.parameters])
    const memo = StructuredOutput.memoFor(
      trie,
      JSON.stringify(["tool_calls", format, parallel, schemas, requests[0]?.sampling.stopTokenIds])
    )
    return requests.map(
      (r): GenerateRequest => ({
        ...r,
        constraint: StructuredOutput.constraint(grammar, trie, r.sampling.stopTokenIds, memo, markup)
      })
    )
  })
