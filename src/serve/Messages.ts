/**
 * `POST /v1/messages`, Anthropic's Messages API, answered by the chat route's machinery (serve/ChatCompletions.ts
 * `prepare`): the request becomes one chat turn, its reply becomes content blocks. Shapes pinned from
 * `@anthropic-ai/sdk` 1.14.0 (src/resources/messages/messages.ts: `MessageCreateParams`, `Message`,
 * `RawMessageStreamEvent`; src/core/streaming.ts, how events are read; src/lib/MessageStream.ts, how
 * `messages.stream` puts them together).
 *
 * - `system` (a string or text blocks) is the system message. `messages`: user and assistant turns (and `system`
 *   ones), content a string or blocks: `text`; an assistant's `tool_use` (`{id, name, input}`: a call, its arguments
 *   written as the served tool-call format writes them, so the policy sees back what it sampled); a user's
 *   `tool_result` (`{tool_use_id, content, is_error}`: a tool message, before the turn's text). `thinking` blocks
 *   are skipped; other blocks (images, documents) are 400s naming the block.
 * - `tools` (`{name, description, input_schema}`) are offered as the chat route offers tools (as the served policy
 *   was trained to see them); server tools (a `type` other than `custom`) are 400s. `tool_choice`: `auto`, `any`
 *   (chat's `required`), `tool` with `name` (a named function) and `none`; `any` and `tool` constrain decoding to calls
 *   (serve/ToolCallGrammar.ts); `disable_parallel_tool_use` is chat's `parallel_tool_calls: false`.
 * - `max_tokens` is required (Anthropic's 400 without it); `stop_sequences`, `temperature`, `top_p`, `top_k` (and
 *   vLLM's `seed`) sample.
 * - The answer: a `text` block when the reply has text, then one `tool_use` block per call; `stop_reason`
 *   `tool_use`, `max_tokens`, `stop_sequence` (with `stop_sequence`, the one the reply ends at) or `end_turn`.
 * - Refusals in Anthropic's error body (`{type: "error", error: {type, message}}`, the types by status as Anthropic's
 *   API documents them).
 * - `stream: true`: named events (serve/Streaming.ts `namedEvents`): `message_start` (the message, no content yet),
 *   a text block's `content_block_start`, `content_block_delta` (`text_delta`) per piece of text as it is sampled
 *   (text that may start a call is held back, as in chat) and `content_block_stop`; per call `content_block_start`
 *   (`tool_use` with `input: {}`), one `input_json_delta` with the whole input and `content_block_stop`; then
 *   `message_delta` (`stop_reason`, `usage.output_tokens`) and `message_stop`. A failure after the first event is an
 *   `error` event.
 */
import { Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import * as ToolCallParser from "../env/ToolCallParser.ts"
import type { GenerateResult } from "../inference/InferenceEngine.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"
import * as ChatCompletions from "./ChatCompletions.ts"
import * as ChatReply from "./ChatReply.ts"
import * as Refusal from "./Refusal.ts"
import * as RequestBody from "./RequestBody.ts"
import type * as Served from "./Served.ts"
import * as Streaming from "./Streaming.ts"

type Json = RequestBody.Json

/** Anthropic's error types by status (https://docs.anthropic.com/en/api/errors). */
const errorTypes: Record<number, string> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  413: "request_too_large",
  429: "rate_limit_error",
  503: "overloaded_error"
}

/** Anthropic's error body. */
export const errorBody = (e: Refusal.BadRequest) => ({
  type: "error",
  error: { type: errorTypes[e.status] ?? "api_error", message: e.message }
})

/** Text blocks' text (a string as it is). */
const textOf = (content: unknown, where: string) => {
  if (typeof content === "string") return Effect.succeed(content)
  if (Array.isArray(content) && content.every((b) => RequestBody.isJson(b) && b["type"] === "text")) {
    return Effect.succeed(content.map((b) => String((b as Json)["text"] ?? "")).join(""))
  }
  return Refusal.fail(`${where} must be a string or a list of text blocks`, 400, "messages")
}

/** One turn's content blocks as chat messages: tool results first (tool messages), then the turn itself. */
const turnMessages = (
  role: "user" | "assistant" | "system",
  content: unknown,
  where: string,
  names: Map<string, string>
) =>
  Effect.gen(function* () {
    if (typeof content === "string") return [{ role, content }] satisfies Array<Message>
    if (!Array.isArray(content)) {
      return yield* Refusal.fail(`${where}.content must be a string or a list of content blocks`, 400, "messages")
    }
    const results: Array<Message> = []
    const texts: Array<string> = []
    const calls: Array<ToolCallWire> = []
    for (const [j, block] of content.entries()) {
      const at = `${where}.content[${j}]`
      const type = RequestBody.isJson(block) ? block["type"] : undefined
      if (type === "text" && typeof (block as Json)["text"] === "string") texts.push((block as Json)["text"] as string)
      else if (type === "tool_use" && role === "assistant") {
        const { id, name, input } = block as Json
        if (typeof id !== "string" || typeof name !== "string" || !RequestBody.isJson(input)) {
          return yield* Refusal.fail(`${at}: a tool_use block needs id, name and an input object`, 400, "messages")
        }
        names.set(id, name)
        calls.push({ id, type: "function", function: { name, arguments: ToolCallParser.pythonJson(input) } })
      } else if (type === "tool_result" && role === "user") {
        const id = (block as Json)["tool_use_id"]
        if (typeof id !== "string")
          return yield* Refusal.fail(`${at}: a tool_result needs tool_use_id`, 400, "messages")
        const name = names.get(id)
        const text = yield* textOf((block as Json)["content"] ?? "", `${at}.content`)
        results.push({ role: "tool", content: text, tool_call_id: id, ...(name === undefined ? {} : { name }) })
      } else if (type !== "thinking" && type !== "redacted_thinking") {
        return yield* Refusal.fail(
          `${at}: ${String(type)} blocks are not served in ${role} turns (text, tool_use, tool_result)`,
          400,
          "messages"
        )
      }
    }
    const text = texts.join("")
    const turn: Array<Message> =
      calls.length > 0
        ? [{ role, content: text, tool_calls: calls }]
        : texts.length > 0 || results.length === 0
          ? [{ role, content: text }]
          : []
    return [...results, ...turn]
  })

/** `system` and `messages` as chat messages. */
const messagesOf = (body: Json) =>
  Effect.gen(function* () {
    const system = body["system"]
    const out: Array<Message> =
      system === undefined || system === null ? [] : [{ role: "system", content: yield* textOf(system, "system") }]
    const messages = body["messages"]
    if (!Array.isArray(messages) || messages.length === 0) {
      return yield* Refusal.fail(`messages: a non-empty list of messages is required`, 400, "messages")
    }
    const names = new Map<string, string>()
    for (const [i, m] of messages.entries()) {
      const role = RequestBody.isJson(m) ? m["role"] : undefined
      if (role !== "user" && role !== "assistant" && role !== "system") {
        return yield* Refusal.fail(`messages[${i}].role must be user or assistant`, 400, "messages")
      }
      out.push(...(yield* turnMessages(role, (m as Json)["content"], `messages[${i}]`, names)))
    }
    return out
  })

/** Custom tools in the chat route's shape. */
const toolsOf = (tools: unknown) =>
  Effect.gen(function* () {
    if (tools === undefined || tools === null) return [] as Array<ToolDefinition>
    if (!Array.isArray(tools)) return yield* Refusal.fail(`tools must be a list`, 400, "tools")
    const out: Array<ToolDefinition> = []
    for (const [i, tool] of tools.entries()) {
      const custom =
        RequestBody.isJson(tool) && (tool["type"] === undefined || tool["type"] === null || tool["type"] === "custom")
      if (!custom || typeof tool["name"] !== "string") {
        return yield* Refusal.fail(
          `tools.${i}: only custom tools with a name are served (no server tools)`,
          400,
          "tools"
        )
      }
      const { name, description, input_schema } = tool
      out.push({
        type: "function",
        function: {
          name,
          ...(typeof description === "string" ? { description } : {}),
          ...(input_schema === undefined || input_schema === null ? {} : { parameters: input_schema })
        }
      })
    }
    return out
  })

/** `tool_choice` as the chat route's `tool_choice` and `parallel_tool_calls`. */
const toolChoiceOf = (choice: unknown) => {
  if (choice === undefined || choice === null) return Effect.succeed({})
  if (!RequestBody.isJson(choice)) return Refusal.fail(`tool_choice must be an object with a type`, 400, "tool_choice")
  const parallel = choice["disable_parallel_tool_use"] === true ? { parallel_tool_calls: false } : {}
  switch (choice["type"]) {
    case "auto":
    case "none":
      return Effect.succeed({ tool_choice: choice["type"], ...parallel })
    case "any":
      return Effect.succeed({ tool_choice: "required", ...parallel })
    case "tool":
      return typeof choice["name"] === "string"
        ? Effect.succeed({ tool_choice: { type: "function", function: { name: choice["name"] } }, ...parallel })
        : Refusal.fail(`tool_choice.name is required with type tool`, 400, "tool_choice")
    default:
      return Refusal.fail(`tool_choice.type must be auto, any, tool or none`, 400, "tool_choice")
  }
}

/** The request as a chat turn. */
const chatInput = (body: Json) =>
  Effect.gen(function* () {
    if (body["max_tokens"] === undefined || body["max_tokens"] === null) {
      return yield* Refusal.fail(`max_tokens: Field required`, 400, "max_tokens")
    }
    const pass = ["model", "stream", "max_tokens", "temperature", "top_p", "top_k", "seed"]
    const chatBody: Json = {
      ...Object.fromEntries(pass.filter((k) => body[k] !== undefined).map((k) => [k, body[k]])),
      ...(body["stop_sequences"] === undefined ? {} : { stop: body["stop_sequences"] }),
      ...(yield* toolChoiceOf(body["tool_choice"]))
    }
    return {
      body: chatBody,
      messages: yield* messagesOf(body),
      tools: yield* toolsOf(body["tools"]),
      idPrefix: "msg"
    }
  })

/** The reply's content blocks and why it stopped. */
const contentOf = (chat: ChatCompletions.Chat, body: Json, result: GenerateResult) => {
  const { message } = chat.replies()[0]!
  const text = typeof message["content"] === "string" ? message["content"] : ""
  const calls = (message["tool_calls"] as ReadonlyArray<ToolCallWire> | undefined) ?? []
  const stops = Array.isArray(body["stop_sequences"]) ? (body["stop_sequences"] as Array<string>) : []
  const stopSequence =
    result.finishReason === "stop" && !chat.eos.has(result.tokens.at(-1) ?? -1)
      ? (stops.find((s) => s !== "" && text.includes(s)) ?? null)
      : null
  const stopReason =
    calls.length > 0
      ? "tool_use"
      : result.finishReason === "length"
        ? "max_tokens"
        : stopSequence !== null
          ? "stop_sequence"
          : "end_turn"
  const toolBlocks = calls.map((call) => ({
    type: "tool_use",
    id: call.id,
    name: call.function.name,
    input: JSON.parse(call.function.arguments) as unknown
  }))
  const textBlock = text === "" ? undefined : { type: "text", text, citations: null }
  return { text, textBlock, toolBlocks, stopReason, stopSequence }
}

const usageOf = (chat: ChatCompletions.Chat, results: ReadonlyArray<GenerateResult>) => {
  const usage = chat.usageOf(results)
  return {
    input_tokens: usage.prompt_tokens,
    output_tokens: usage.completion_tokens,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: 0
  }
}

/** The message object: `message_start`'s (no content yet) and the answer's. */
const messageOf = (chat: ChatCompletions.Chat, fields: Json) => ({
  id: chat.id,
  type: "message",
  role: "assistant",
  model: chat.name,
  content: [] as ReadonlyArray<unknown>,
  stop_reason: null as string | null,
  stop_sequence: null as string | null,
  stop_details: null,
  container: null,
  ...fields
})

/** The route's handler. */
export const handler =
  (server: Served.Served, toolPrompt: ChatCompletions.ToolPrompt) => (request: HttpServerRequest.HttpServerRequest) =>
    Refusal.handle(
      Streaming.requestScoped((keep) =>
        Effect.gen(function* () {
          const body = yield* RequestBody.readJsonBody(request, server.maxRequestBytes)
          const chat = yield* ChatCompletions.prepare(yield* chatInput(body), server, toolPrompt)
          if (chat.stream) return Streaming.liveStream(streamPlan(chat, server, body), keep())
          const results = yield* chat.generate(chat.requests)
          const out = contentOf(chat, body, results[0]!)
          return HttpServerResponse.jsonUnsafe(
            messageOf(chat, {
              content: [...(out.textBlock === undefined ? [] : [out.textBlock]), ...out.toolBlocks],
              stop_reason: out.stopReason,
              stop_sequence: out.stopSequence,
              usage: usageOf(chat, results)
            })
          )
        })
      ),
      errorBody
    )

/** The streamed answer's events (the module header lists them). */
const streamPlan = (chat: ChatCompletions.Chat, { tokenizer }: Served.Served, body: Json): Streaming.StreamPlan => {
  const holdBack = chat.callsOnly ? () => "" : chat.toolsOn ? ChatReply.beforeCalls : undefined
  const text = Streaming.textDeltas(tokenizer, holdBack)
  let opened = false
  const delta = (piece: string) => {
    if (piece === "") return []
    const start = opened
      ? []
      : [{ type: "content_block_start", index: 0, content_block: { type: "text", text: "", citations: null } }]
    opened = true
    return [...start, { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: piece } }]
  }
  const promptTokens = chat.promptIds.length
  return {
    requests: chat.requests,
    generate: chat.generate,
    framing: Streaming.namedEvents(errorBody),
    start: [
      {
        type: "message_start",
        message: messageOf(chat, {
          usage: {
            input_tokens: promptTokens,
            output_tokens: 0,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0
          }
        })
      }
    ],
    token: (_index, _t, e) => {
      const last = e.finishReason !== undefined
      return delta(text.add(last && chat.eos.has(e.token) ? undefined : e.token, last))
    },
    end: (results) => {
      const out = contentOf(chat, body, results[0]!)
      const textEvents =
        out.textBlock === undefined
          ? []
          : [
              ...delta(ChatReply.unsent(out.text, text.sent(), out.toolBlocks.length > 0)),
              { type: "content_block_stop", index: 0 }
            ]
      const first = out.textBlock === undefined ? 0 : 1
      const toolEvents = out.toolBlocks.flatMap((block, j) => [
        { type: "content_block_start", index: first + j, content_block: { ...block, input: {} } },
        {
          type: "content_block_delta",
          index: first + j,
          delta: { type: "input_json_delta", partial_json: JSON.stringify(block.input) }
        },
        { type: "content_block_stop", index: first + j }
      ])
      const usage = usageOf(chat, results)
      return [
        ...textEvents,
        ...toolEvents,
        {
          type: "message_delta",
          delta: { stop_reason: out.stopReason, stop_sequence: out.stopSequence },
          usage: { output_tokens: usage.output_tokens, input_tokens: usage.input_tokens }
        },
        { type: "message_stop" }
      ]
    }
  }
}
