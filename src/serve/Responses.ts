/**
 * `POST /v1/responses`, OpenAI's Responses API (the OpenAI Agents SDK's default model API), answered by the chat
 * route's machinery (serve/ChatCompletions.ts `prepare`): the request becomes one chat turn, its reply becomes output
 * items. Shapes pinned from the `openai` package 5.23.2 (src/resources/responses/responses.ts: `ResponseCreateParams`,
 * `Response`, `ResponseStreamEvent`; src/lib/responses/ResponseStream.ts, how `responses.stream` puts events
 * together).
 *
 * - `input`: a string (one user message) or input items: messages (`{role, content}` with or without
 *   `type: "message"`; roles user, assistant, system, developer (= system); content a string or `input_text` /
 *   `output_text` parts), `function_call` (`{call_id, name, arguments}`: consecutive calls are one assistant turn,
 *   joined to the assistant message before them) and `function_call_output` (`{call_id, output}`: a tool message).
 *   `reasoning` items are skipped; other items, and parts other than text, are 400s naming the item.
 * - `instructions`: a system message first. `previous_response_id`: the conversation of that response (its input and
 *   its output, not its instructions, as OpenAI documents) goes before `input`. The server keeps the conversations
 *   of the newest `maxStored` responses created with `store` on (the default), in memory; an id it does not keep
 *   (never created here, evicted, or the server restarted) is a 400 naming `previous_response_id`.
 * - `tools`: function tools (`{type: "function", name, description, parameters}`), offered as the chat route offers
 *   them (as the served policy was trained to see them); other tool types are 400s. `tool_choice` (`none`, `auto`,
 *   `required`, `{type: "function", name}`) and `parallel_tool_calls` as in chat, so `required` and a named function
 *   constrain decoding to calls (serve/ToolCallGrammar.ts).
 * - `text.format` (`text`, `json_object`, `json_schema` with `name`, `schema`, `strict`) is the chat route's
 *   `response_format`; `max_output_tokens`, `temperature`, `top_p` (and vLLM's `top_k`, `seed`, `stop`) sample.
 * - The answer: `output` holds an assistant `message` (one `output_text` part) when the reply has text, then one
 *   `function_call` item per call; `status` `completed`, or `incomplete` with `incomplete_details.reason`
 *   `max_output_tokens` when the reply was cut at `max_output_tokens`.
 * - `stream: true`: named events (`event: <type>`, serve/Streaming.ts `namedEvents`), each with its
 *   `sequence_number`: `response.created`, `response.in_progress`; the message item's `output_item.added`,
 *   `content_part.added` and `output_text.delta` per piece of text as it is sampled (text that may start a call is
 *   held back, as in chat), then `output_text.done`, `content_part.done`, `output_item.done`; per call
 *   `output_item.added`, `function_call_arguments.delta` and `.done`, `output_item.done`; last `response.completed`
 *   (or `response.incomplete`) with the whole response. A failure after the first event is an `error` event.
 */
import { Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import type { GenerateResult } from "../inference/InferenceEngine.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"
import * as ChatCompletions from "./ChatCompletions.ts"
import * as ChatReply from "./ChatReply.ts"
import * as Refusal from "./Refusal.ts"
import * as RequestBody from "./RequestBody.ts"
import type * as Served from "./Served.ts"
import * as Streaming from "./Streaming.ts"

type Json = RequestBody.Json

/** How many responses' conversations the server keeps for `previous_response_id` by default. */
export const defaultMaxStored = 1024

/** The conversations of the newest responses, for `previous_response_id`; the oldest is forgotten first. */
export class Conversations {
  private readonly kept = new Map<string, ReadonlyArray<Message>>()
  readonly capacity: number
  constructor(capacity: number) {
    this.capacity = capacity
  }
  get = (id: string) => this.kept.get(id)
  put = (id: string, conversation: ReadonlyArray<Message>) => {
    this.kept.set(id, conversation)
    for (const oldest of this.kept.keys()) {
      if (this.kept.size <= this.capacity) break
      this.kept.delete(oldest)
    }
  }
}

/** A message's or a tool output's content: a string or text parts (`input_text`, `output_text`). */
const textOf = (content: unknown, where: string) => {
  if (typeof content === "string") return Effect.succeed(content)
  if (Array.isArray(content)) {
    const texts: Array<string> = []
    for (const part of content) {
      if (!RequestBody.isJson(part) || typeof part["text"] !== "string") {
        const kind = RequestBody.isJson(part) ? String(part["type"]) : typeof part
        return Refusal.fail(`${where}: only text parts are served (input_text, output_text), got ${kind}`, 400, "input")
      }
      texts.push(part["text"])
    }
    return Effect.succeed(texts.join(""))
  }
  return Refusal.fail(`${where}.content must be a string or a list of text parts`, 400, "input")
}

const roles: Record<string, Message["role"]> = {
  user: "user",
  assistant: "assistant",
  system: "system",
  developer: "system"
}

/** `input` as chat messages (the module header lists the items read). */
const inputMessages = (input: unknown) =>
  Effect.gen(function* () {
    if (typeof input === "string") return [{ role: "user", content: input }] satisfies Array<Message>
    if (!Array.isArray(input)) {
      return yield* Refusal.fail(`"input" must be a string or a list of input items`, 400, "input")
    }
    const out: Array<Message> = []
    const names = new Map<string, string>()
    for (const [i, item] of input.entries()) {
      const where = `input[${i}]`
      if (!RequestBody.isJson(item)) return yield* Refusal.fail(`${where} must be an object`, 400, "input")
      const type = item["type"] ?? (item["role"] === undefined ? undefined : "message")
      if (type === "message") {
        const role = roles[String(item["role"])]
        if (role === undefined) {
          return yield* Refusal.fail(`${where}.role must be user, assistant, system or developer`, 400, "input")
        }
        out.push({ role, content: yield* textOf(item["content"], where) })
      } else if (type === "function_call") {
        const { call_id, name, arguments: args } = item
        if (typeof call_id !== "string" || typeof name !== "string" || typeof args !== "string") {
          return yield* Refusal.fail(`${where}: a function_call needs call_id, name and arguments`, 400, "input")
        }
        names.set(call_id, name)
        const call: ToolCallWire = { id: call_id, type: "function", function: { name, arguments: args } }
        // the calls of one reply follow its message: one assistant turn
        const last = out.at(-1)
        if (last?.role === "assistant")
          out[out.length - 1] = { ...last, tool_calls: [...(last.tool_calls ?? []), call] }
        else out.push({ role: "assistant", content: "", tool_calls: [call] })
      } else if (type === "function_call_output") {
        const callId = item["call_id"]
        if (typeof callId !== "string") {
          return yield* Refusal.fail(`${where}: a function_call_output needs call_id`, 400, "input")
        }
        const name = names.get(callId)
        out.push({
          role: "tool",
          content: yield* textOf(item["output"], where),
          tool_call_id: callId,
          ...(name === undefined ? {} : { name })
        })
      } else if (type !== "reasoning") {
        return yield* Refusal.fail(
          `${where}: items of type ${String(type)} are not served (message, function_call, function_call_output)`,
          400,
          "input"
        )
      }
    }
    return out
  })

/** Function tools in the chat route's shape. */
const toolsOf = (tools: unknown) =>
  Effect.gen(function* () {
    if (tools === undefined || tools === null) return [] as Array<ToolDefinition>
    if (!Array.isArray(tools)) return yield* Refusal.fail(`"tools" must be a list`, 400, "tools")
    const out: Array<ToolDefinition> = []
    for (const [i, tool] of tools.entries()) {
      if (!RequestBody.isJson(tool) || tool["type"] !== "function" || typeof tool["name"] !== "string") {
        const kind = RequestBody.isJson(tool) ? String(tool["type"]) : typeof tool
        return yield* Refusal.fail(`tools[${i}]: only function tools with a name are served, got ${kind}`, 400, "tools")
      }
      const { name, description, parameters } = tool
      out.push({
        type: "function",
        function: {
          name,
          ...(typeof description === "string" ? { description } : {}),
          ...(parameters === undefined || parameters === null ? {} : { parameters })
        }
      })
    }
    return out
  })

/** `tool_choice` in the chat route's shape. */
const toolChoiceOf = (choice: unknown) => {
  if (choice === undefined || choice === null || typeof choice === "string") return Effect.succeed(choice)
  if (RequestBody.isJson(choice) && choice["type"] === "function" && typeof choice["name"] === "string") {
    return Effect.succeed({ type: "function", function: { name: choice["name"] } })
  }
  return Refusal.fail(
    `"tool_choice" must be "none", "auto", "required" or {"type": "function", "name": …}`,
    400,
    "tool_choice"
  )
}

/** `text.format` as the chat route's `response_format`. */
const formatOf = (text: unknown) => {
  const format = RequestBody.isJson(text) ? text["format"] : undefined
  if (format === undefined || format === null) return Effect.succeed(undefined)
  if (RequestBody.isJson(format) && (format["type"] === "text" || format["type"] === "json_object")) {
    return Effect.succeed({ type: format["type"] })
  }
  if (RequestBody.isJson(format) && format["type"] === "json_schema") {
    const { name, schema, strict } = format
    return Effect.succeed({
      type: "json_schema",
      json_schema: { name, schema, ...(strict === undefined ? {} : { strict }) }
    })
  }
  return Refusal.fail(`"text.format" must be of type text, json_object or json_schema`, 400, "text")
}

/** The request as a chat turn: its conversation (stored before it, `instructions` first), tools and fields. */
const chatInput = (body: Json, conversations: Conversations) =>
  Effect.gen(function* () {
    const previousId = body["previous_response_id"]
    let previous: ReadonlyArray<Message> = []
    if (previousId !== undefined && previousId !== null) {
      const kept = typeof previousId === "string" ? conversations.get(previousId) : undefined
      if (kept === undefined) {
        return yield* Refusal.fail(
          `Previous response with id '${String(previousId)}' not found: this server keeps the newest ` +
            `${conversations.capacity} responses created with store on, in memory; send the whole conversation as input`,
          400,
          "previous_response_id"
        )
      }
      previous = kept
    }
    const input = yield* inputMessages(body["input"])
    if (previous.length + input.length === 0) return yield* Refusal.fail(`"input" must not be empty`, 400, "input")
    const instructions = body["instructions"]
    const system: Array<Message> =
      typeof instructions === "string" && instructions !== "" ? [{ role: "system", content: instructions }] : []
    const responseFormat = yield* formatOf(body["text"])
    const pass = ["model", "stream", "temperature", "top_p", "top_k", "seed", "stop", "parallel_tool_calls"]
    const chatBody: Json = {
      ...Object.fromEntries(pass.filter((k) => body[k] !== undefined).map((k) => [k, body[k]])),
      ...(body["max_output_tokens"] === undefined ? {} : { max_tokens: body["max_output_tokens"] }),
      tool_choice: yield* toolChoiceOf(body["tool_choice"]),
      ...(responseFormat === undefined ? {} : { response_format: responseFormat })
    }
    return {
      chat: { body: chatBody, messages: [...system, ...previous, ...input], tools: yield* toolsOf(body["tools"]) },
      conversation: [...previous, ...input]
    }
  })

/** The reply's output items: the message (when it has text), then its calls. */
const outputOf = (chat: ChatCompletions.Chat, result: GenerateResult) => {
  const { message } = chat.replies()[0]!
  const content = typeof message["content"] === "string" ? message["content"] : ""
  const calls = (message["tool_calls"] as ReadonlyArray<ToolCallWire> | undefined) ?? []
  const status = result.finishReason === "length" ? "incomplete" : "completed"
  const messageItem =
    content === ""
      ? undefined
      : {
          id: `${chat.id}-msg`,
          type: "message",
          status,
          role: "assistant",
          content: [{ type: "output_text", text: content, annotations: [], logprobs: [] }]
        }
  const callItems = calls.map((call, j) => ({
    id: `${chat.id}-fc${j}`,
    type: "function_call",
    status: "completed",
    call_id: call.id,
    name: call.function.name,
    arguments: call.function.arguments
  }))
  const assistant: Message = { role: "assistant", content, ...(calls.length > 0 ? { tool_calls: calls } : {}) }
  return { status, content, messageItem, callItems, assistant }
}

/** The response object: `response.created`'s (in progress, no output) and the answer's. */
const responseOf = (
  chat: ChatCompletions.Chat,
  body: Json,
  status: string,
  output: ReadonlyArray<unknown>,
  results?: ReadonlyArray<GenerateResult>
) => {
  const usage = results === undefined ? undefined : chat.usageOf(results)
  return {
    id: chat.id,
    object: "response",
    created_at: chat.created,
    status,
    error: null,
    incomplete_details: status === "incomplete" ? { reason: "max_output_tokens" } : null,
    instructions: body["instructions"] ?? null,
    max_output_tokens: body["max_output_tokens"] ?? null,
    model: chat.name,
    output,
    parallel_tool_calls: body["parallel_tool_calls"] ?? true,
    previous_response_id: body["previous_response_id"] ?? null,
    reasoning: { effort: null, summary: null },
    store: body["store"] !== false,
    temperature: body["temperature"] ?? 1,
    text: { format: (RequestBody.isJson(body["text"]) ? body["text"]["format"] : undefined) ?? { type: "text" } },
    tool_choice: body["tool_choice"] ?? "auto",
    tools: body["tools"] ?? [],
    top_p: body["top_p"] ?? 1,
    truncation: "disabled",
    usage:
      usage === undefined
        ? null
        : {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: { cached_tokens: 0 },
            output_tokens: usage.completion_tokens,
            output_tokens_details: { reasoning_tokens: 0 },
            total_tokens: usage.total_tokens
          },
    user: null,
    metadata: body["metadata"] ?? {}
  }
}

/** The route's handler; `maxStored` bounds the conversations kept for `previous_response_id`. */
export const handler = (
  server: Served.Served,
  toolPrompt: ChatCompletions.ToolPrompt,
  maxStored = defaultMaxStored
) => {
  const conversations = new Conversations(maxStored)
  return (request: HttpServerRequest.HttpServerRequest) =>
    Refusal.handle(
      Streaming.requestScoped((keep) =>
        Effect.gen(function* () {
          const body = yield* RequestBody.readJsonBody(request, server.maxRequestBytes)
          const { chat: input, conversation } = yield* chatInput(body, conversations)
          const chat = yield* ChatCompletions.prepare({ ...input, idPrefix: "resp" }, server, toolPrompt)
          const remember = (assistant: Message) => {
            if (body["store"] !== false) conversations.put(chat.id, [...conversation, assistant])
          }
          if (!chat.stream) {
            const results = yield* chat.generate(chat.requests)
            const out = outputOf(chat, results[0]!)
            remember(out.assistant)
            const output = [...(out.messageItem === undefined ? [] : [out.messageItem]), ...out.callItems]
            return HttpServerResponse.jsonUnsafe(responseOf(chat, body, out.status, output, results))
          }
          return Streaming.liveStream(streamPlan(chat, server, body, remember), keep())
        })
      )
    )
}

/** The Responses API's `error` event. */
const errorEvent = (e: Refusal.BadRequest) => ({
  type: "error",
  code: Refusal.errorBody(e).error.type,
  message: e.message,
  param: e.param
})

/** The streamed answer's events (the module header lists them). */
const streamPlan = (
  chat: ChatCompletions.Chat,
  { tokenizer }: Served.Served,
  body: Json,
  remember: (assistant: Message) => void
): Streaming.StreamPlan => {
  let sequence = 0
  const event = (type: string, fields: Json) => ({ type, sequence_number: sequence++, ...fields })
  const itemId = `${chat.id}-msg`
  const at = { item_id: itemId, output_index: 0, content_index: 0 }
  const holdBack = chat.callsOnly ? () => "" : chat.toolsOn ? ChatReply.beforeCalls : undefined
  const text = Streaming.textDeltas(tokenizer, holdBack)
  let opened = false
  const open = () => {
    if (opened) return []
    opened = true
    const item = { id: itemId, type: "message", status: "in_progress", role: "assistant", content: [] }
    const part = { type: "output_text", text: "", annotations: [], logprobs: [] }
    return [
      event("response.output_item.added", { output_index: 0, item }),
      event("response.content_part.added", { ...at, part })
    ]
  }
  const delta = (piece: string) =>
    piece === "" ? [] : [...open(), event("response.output_text.delta", { ...at, delta: piece, logprobs: [] })]
  const created = responseOf(chat, body, "in_progress", [])
  return {
    requests: chat.requests,
    generate: chat.generate,
    framing: Streaming.namedEvents(errorEvent),
    start: [event("response.created", { response: created }), event("response.in_progress", { response: created })],
    token: (_index, _t, e) => {
      const last = e.finishReason !== undefined
      return delta(text.add(last && chat.eos.has(e.token) ? undefined : e.token, last))
    },
    end: (results) => {
      const out = outputOf(chat, results[0]!)
      remember(out.assistant)
      const message = out.messageItem
      const textEvents =
        message === undefined
          ? []
          : [
              ...delta(ChatReply.unsent(out.content, text.sent(), out.callItems.length > 0)),
              event("response.output_text.done", { ...at, text: out.content, logprobs: [] }),
              event("response.content_part.done", { ...at, part: message.content[0] }),
              event("response.output_item.done", { output_index: 0, item: message })
            ]
      const first = message === undefined ? 0 : 1
      const callEvents = out.callItems.flatMap((item, j) => {
        const where = { item_id: item.id, output_index: first + j }
        return [
          event("response.output_item.added", {
            output_index: first + j,
            item: { ...item, status: "in_progress", arguments: "" }
          }),
          event("response.function_call_arguments.delta", { ...where, delta: item.arguments }),
          event("response.function_call_arguments.done", { ...where, name: item.name, arguments: item.arguments }),
          event("response.output_item.done", { output_index: first + j, item })
        ]
      })
      const output = [...(message === undefined ? [] : [message]), ...out.callItems]
      const response = responseOf(chat, body, out.status, output, results)
      const final = out.status === "incomplete" ? "response.incomplete" : "response.completed"
      return [...textEvents, ...callEvents, event(final, { response })]
    }
  }
}
