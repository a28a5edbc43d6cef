/**
 * The assistant reply of a chat completion (serve/ChatCompletions.ts) and the tool calls in it: what `tool_choice`
 * asks, the calls read out of the sampled text, and the text a stream may send before the reply is parsed.
 *
 * - Tool calls are read out of the text (env/ToolCallParser.ts, `auto`): a reply with calls has `message.tool_calls`
 *   and `finish_reason: "tool_calls"`, as vLLM's tool parsers give (`--enable-auto-tool-choice --tool-call-parser
 *   hermes`), with each call's `arguments` written as Python's `json.dumps(arguments, ensure_ascii=False)` writes
 *   them (vLLM's `Hermes2ProToolParser`, vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py at
 *   836d1f31211015f62485b0151fbbf85b6cc7a934), so a template that prints them back reproduces what was sampled.
 * - `tool_choice`: `auto` (the default with `tools`) reads calls; `none` reads none (the tools stay in the prompt, as
 *   vLLM keeps them); `required` and `{"type": "function", "function": {"name"}}` constrain decoding to calls (to
 *   any of `tools`, or to the named function: serve/ToolCallGrammar.ts) and read them (only the named function's).
 *   A named function not in `tools`, or `tool_choice` other than `none` without `tools`, are vLLM's 400s.
 * - Call ids are unique per response (ChatCompletions.ts names them), as OpenAI's and vLLM's are: agent SDKs match
 *   tool results to calls by id and refuse one used twice.
 * - `parallel_tool_calls: false` keeps a reply's first call only (vLLM's `maybe_filter_parallel_tool_calls`), and
 *   under `required` / a named function decoding stops after one call.
 * - Streamed with tools offered, the text from where a call's marker (`<tool_call>`, `<tool>`, a line starting
 *   `Action:`) starts or may start is held back until the reply is parsed (as is its leading whitespace).
 */
import { Effect } from "effect"
import type { ToolCallWire } from "../domain/Message.ts"
import * as ToolCallParser from "../env/ToolCallParser.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"
import * as Refusal from "./Refusal.ts"
import type * as RequestBody from "./RequestBody.ts"

/** What `tool_choice` asks of a chat reply. */
export type ToolChoice =
  | { readonly kind: "none" | "auto" | "required" }
  | { readonly kind: "named"; readonly name: string }

/** `tool_choice` read and checked against `tools`, with vLLM's refusals. Absent: `auto` with tools, else `none`. */
export const toolChoiceOf = (body: RequestBody.Json, tools: ReadonlyArray<ToolDefinition>) => {
  const choice = body["tool_choice"]
  if (choice === undefined || choice === null)
    return Effect.succeed<ToolChoice>({ kind: tools.length > 0 ? "auto" : "none" })
  if (choice === "none") return Effect.succeed<ToolChoice>({ kind: "none" })
  if (tools.length === 0) {
    return Refusal.fail("When using `tool_choice`, `tools` must be set.", 400, "tool_choice")
  }
  if (choice === "auto" || choice === "required") return Effect.succeed<ToolChoice>({ kind: choice })
  const name =
    typeof choice === "object" && (choice as RequestBody.Json)["type"] === "function"
      ? ((choice as RequestBody.Json)["function"] as RequestBody.Json | undefined)?.["name"]
      : undefined
  if (typeof name !== "string") {
    return Refusal.fail(
      `"tool_choice" must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}`,
      400,
      "tool_choice"
    )
  }
  if (!tools.some((t) => t.function.name === name)) {
    return Refusal.fail(`Tool '${name}' has not been passed in \`tools\`.`, 400, "tool_choice")
  }
  return Effect.succeed<ToolChoice>({ kind: "named", name })
}

/** `parallel_tool_calls` (default true): whether a reply may hold more than one call. */
export const parallelOf = (body: RequestBody.Json) => {
  const parallel = body["parallel_tool_calls"]
  if (parallel === undefined || parallel === null) return Effect.succeed(true)
  if (typeof parallel !== "boolean") {
    return Refusal.fail(`"parallel_tool_calls" must be a boolean`, 400, "parallel_tool_calls")
  }
  return Effect.succeed(parallel)
}

/**
 * The assistant message of a chat completion: tool calls read out of the text when the request offered tools (only
 * calls to `only` when given; the first one alone unless `parallel`), call `k` named `callId(k, the parser's id)`.
 */
export const chatMessage = (
  text: string,
  toolsOffered: boolean,
  only?: string,
  parallel = true,
  callId: (k: number, parsed: string) => string = (_, parsed) => parsed
): { readonly message: RequestBody.Json; readonly finishReason: "tool_calls" | undefined } => {
  if (!toolsOffered) return { message: { role: "assistant", content: text }, finishReason: undefined }
  const parsed = ToolCallParser.parse(text, "auto")
  const named = only === undefined ? parsed.calls : parsed.calls.filter((call) => call.name === only)
  const calls = parallel ? named : named.slice(0, 1)
  if (calls.length === 0) return { message: { role: "assistant", content: text }, finishReason: undefined }
  const toolCalls: Array<ToolCallWire> = calls.map((call, k) => ({
    id: callId(k, call.id),
    type: "function",
    function: { name: call.name, arguments: ToolCallParser.pythonJson(call.arguments) }
  }))
  // vLLM's tool parsers keep the text before the first call as content (null when there is none)
  const before = text.split(/<tool_call>|<tool>|^Action:/m)[0]!.trim()
  return {
    message: { role: "assistant", content: before === "" ? null : before, tool_calls: toolCalls },
    finishReason: "tool_calls"
  }
}

/** Where a tool call may begin in a reply (env/ToolCallParser.ts `auto`): tags anywhere, ReAct's words at a line start. */
const callTags = ["<tool_call>", "<tool>"]
const callWords = ["Action:"]

/**
 * The part of a reply that cannot belong to a tool call, streamed while a chat turn with tools is sampled: the text
 * before the first place a call's marker starts or may start (a partial tag at the end, a line that may become
 * `Action:`), without leading and trailing whitespace (the parsed reply's content is trimmed).
 */
export const beforeCalls = (text: string): string => {
  let cut = text.length
  for (const tag of callTags) {
    const at = text.indexOf(tag)
    if (at >= 0) cut = Math.min(cut, at)
    for (let k = Math.min(tag.length - 1, text.length); k > 0; k--) {
      if (text.endsWith(tag.slice(0, k))) {
        cut = Math.min(cut, text.length - k)
        break
      }
    }
  }
  let lineStart = 0
  const lines = text.split("\n")
  for (const [i, line] of lines.entries()) {
    const partial = i === lines.length - 1 && line.length > 0
    if (callWords.some((w) => line.startsWith(w) || (partial && w.startsWith(line)))) {
      cut = Math.min(cut, lineStart)
      break
    }
    lineStart += line.length + 1
  }
  return text.slice(0, cut).trim()
}

/**
 * The part of a streamed reply's content not sent yet, once the reply is parsed: what follows the text sent while it
 * was sampled (which skipped leading whitespace with tools on; with calls, the content is the trimmed text before
 * them).
 */
export const unsent = (content: string, sent: string, hasCalls: boolean): string =>
  sent === ""
    ? content
    : !hasCalls
      ? content.slice(content.indexOf(sent) + sent.length)
      : content.startsWith(sent)
        ? content.slice(sent.length)
        : ""
