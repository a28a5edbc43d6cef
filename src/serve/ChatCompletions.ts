/**
 * `POST /v1/chat/completions` of the OpenAI-compatible server (OpenAiServer.ts composes the routes), in vLLM's wire
 * conventions: renders the chat template (with `tools`), samples, and reads tool calls out of the text
 * (serve/ChatReply.ts has the calls and `tool_choice`).
 *
 * - The response carries vLLM's `return_token_ids` fields (always: `prompt_token_ids` at the top level, the prompt
 *   as rendered; `choices[i].token_ids`) and, with `logprobs: true`, `choices[i].logprobs.content` of `{token,
 *   logprob, bytes, top_logprobs}` per sampled token (`token` reads `token_id:<id>` with
 *   `return_tokens_as_token_ids`; `top_logprobs: k` (0..20) lists the k most likely tokens, serve/LogprobShapes.ts).
 *   Shapes as vLLM's `ChatCompletionResponse` in vllm/entrypoints/openai/chat_completion/protocol.py
 *   (002032ee2b18e1f7bd924ec47b62504ba3866063).
 *   How the tools reach the prompt is `toolPrompt` (layers/Serve.ts: as the served run was trained).
 * - `stream: true` (serve/Streaming.ts): `delta.role` for every choice first, then one chunk per token
 *   (`delta.content`, `logprobs.content`, `token_ids`), then per choice the content not sent yet, OpenAI's
 *   `delta.tool_calls` pair per call (`{index, id, type, function: {name, arguments: ""}}`, then `{index, function:
 *   {arguments}}`) and a chunk with `finish_reason`. With tools offered the tool parser reads the whole reply, so the
 *   calls are sent once the generation ended, and the text that may start a call is held back until then
 *   (ChatReply.ts `beforeCalls`; all of it under `tool_choice` `required` or a named function, where the reply is
 *   nothing but calls). Alternatives (`top_logprobs` > 0, computed after sampling) are sent only once the generation
 *   ended, replayed in the same chunks. Chunk fields pinned from vLLM's
 *   `ChatCompletionResponseStreamChoice` / `ChatCompletionStreamResponse` (vllm/entrypoints/openai/chat_completion/
 *   protocol.py).
 * - `tool_choice` `required` or a named function constrains decoding to calls (serve/ToolCallGrammar.ts) in the
 *   format the tool prompt teaches (`ToolPrompt`'s `format`); `response_format` then constrains nothing, as in vLLM
 *   where the tools' schema replaces it. A reply cut short (`max_tokens`, a `stop` string) is answered as it is, its
 *   text as content (`finish_reason` `length` / `stop`), as without tools.
 */
import { Clock, Effect, Random } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import type * as ToolCallParser from "../env/ToolCallParser.ts"
import type { GenerateRequest, GenerateResult } from "../inference/InferenceEngine.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"
import * as ChatReply from "./ChatReply.ts"
import * as EngineRequests from "./EngineRequests.ts"
import * as LogprobShapes from "./LogprobShapes.ts"
import * as Refusal from "./Refusal.ts"
import * as RequestBody from "./RequestBody.ts"
import * as Served from "./Served.ts"
import * as Streaming from "./Streaming.ts"
import * as ToolCallGrammar from "./ToolCallGrammar.ts"

/**
 * How the tools a chat request offers are put in front of the model: the messages to render, the tools the chat
 * template is given (none: the template adds no tool prompt) and the call format the model was taught (default
 * `hermes`, the chat templates' `<tool_call>`), which `tool_choice` `required` / a named function constrains decoding
 * to. `serve` picks one from the served run's `environment.tool_prompt` and `tool_call_format` (layers/Serve.ts), so
 * the policy sees the tools as it saw them in training.
 */
export type ToolPrompt = (
  messages: ReadonlyArray<Message>,
  tools: ReadonlyArray<ToolDefinition>
) => {
  readonly messages: ReadonlyArray<Message>
  readonly tools: ReadonlyArray<ToolDefinition>
  readonly format?: ToolCallParser.WriteFormat
}

/** The chat template renders the tools (its own tool system prompt): `tool_prompt: template`, and vLLM's way. */
export const templateTools: ToolPrompt = (messages, tools) => ({ messages, tools })

const readMessages = (body: RequestBody.Json) => {
  const messages = body["messages"]
  if (!Array.isArray(messages) || messages.length === 0) {
    return Refusal.fail(`"messages" must be a non-empty list`, 400, "messages")
  }
  const out: Array<Message> = []
  for (const [i, m] of messages.entries()) {
    if (typeof m !== "object" || m === null) return Refusal.fail(`messages[${i}] must be an object`, 400, "messages")
    const { role, content, tool_calls, tool_call_id, name } = m as RequestBody.Json
    if (role !== "system" && role !== "user" && role !== "assistant" && role !== "tool") {
      return Refusal.fail(`messages[${i}].role must be system, user, assistant or tool`, 400, "messages")
    }
    // content: a string, null (an assistant turn with only tool calls) or OpenAI's list of text parts
    const text =
      typeof content === "string"
        ? content
        : content === null || content === undefined
          ? ""
          : Array.isArray(content)
            ? content.map((part) => (typeof part?.text === "string" ? part.text : "")).join("")
            : undefined
    if (text === undefined) {
      return Refusal.fail(`messages[${i}].content must be a string or a list of text parts`, 400, "messages")
    }
    out.push({
      role,
      content: text,
      ...(Array.isArray(tool_calls) ? { tool_calls: tool_calls as Array<ToolCallWire> } : {}),
      ...(typeof tool_call_id === "string" ? { tool_call_id } : {}),
      ...(typeof name === "string" ? { name } : {})
    })
  }
  return Effect.succeed(out)
}

/** One chat request, read and checked: what its answer, streamed or whole, is built from. */
export interface Chat {
  /** The model that answers (`model`). */
  readonly name: string
  readonly id: string
  readonly created: number
  readonly stream: boolean
  readonly includeUsage: boolean
  /** The prompt as rendered (the same for every choice). */
  readonly promptIds: ReadonlyArray<number>
  readonly requests: ReadonlyArray<GenerateRequest>
  readonly wantLogprobs: boolean
  /** `top_logprobs`: the alternatives per sampled token. */
  readonly topK: number
  readonly toolChoice: ChatReply.ToolChoice
  /** Decoding is constrained to tool calls (`tool_choice` `required` or a named function). */
  readonly callsOnly: boolean
  /** Tool calls are read out of the replies (`tool_choice` other than `none`). */
  readonly toolsOn: boolean
  /** The end-of-turn ids: the one that ends a reply is markup, not content. */
  readonly eos: ReadonlySet<number>
  readonly usageOf: (results: ReadonlyArray<GenerateResult>) => ReturnType<typeof EngineRequests.usage>
  /** The generation, with the alternatives and the replies read (`replies()` once it ended). */
  readonly generate: Streaming.StreamPlan["generate"]
  readonly replies: () => ReadonlyArray<ReturnType<typeof ChatReply.chatMessage>>
  /** Choice `index`'s `logprobs.content` for `tokens`, its tokens from `from` on. */
  readonly logprobsOf: (
    index: number,
    tokens: ReadonlyArray<number>,
    logprobs: ReadonlyArray<number>,
    from: number
  ) => ReturnType<typeof LogprobShapes.chatLogprobs>
}

/** The route's handler: `toolPrompt` puts the request's tools in front of the model. */
export const handler =
  (server: Served.Served, toolPrompt: ToolPrompt) => (request: HttpServerRequest.HttpServerRequest) =>
    Refusal.handle(
      Streaming.requestScoped((keep) =>
        Effect.gen(function* () {
          const body = yield* RequestBody.readJsonBody(request, server.maxRequestBytes)
          const messages = yield* readMessages(body)
          const tools = Array.isArray(body["tools"]) ? (body["tools"] as ReadonlyArray<ToolDefinition>) : []
          const chat = yield* prepare({ body, messages, tools, idPrefix: "chatcmpl" }, server, toolPrompt)
          if (!chat.stream) return yield* answer(chat)
          const plan = streamPlan(chat, server)
          // alternatives are computed after sampling: the answer is then sent once the generation ended
          return chat.topK > 0 ? yield* Streaming.bufferedStream(plan) : Streaming.liveStream(plan, keep())
        })
      )
    )

/**
 * A chat turn to answer: the conversation and the tools offered, and the request's other fields in the chat route's
 * names (`model`, `stream`, `tool_choice`, `parallel_tool_calls`, sampling, `response_format`, …). The responses and
 * messages routes (serve/Responses.ts, serve/Messages.ts) translate their requests into one.
 */
export interface ChatInput {
  readonly body: RequestBody.Json
  readonly messages: ReadonlyArray<Message>
  readonly tools: ReadonlyArray<ToolDefinition>
  /** The answer's id starts with it (`chatcmpl`, `resp`, `msg`). */
  readonly idPrefix: string
}

/** A chat turn checked (in the order its refusals are given) and rendered. */
export const prepare = (input: ChatInput, server: Served.Served, toolPrompt: ToolPrompt) =>
  Effect.gen(function* () {
    const { tools, idPrefix } = input
    const body = server.gateway?.rewrite(input.body) ?? input.body
    const messages = server.gateway?.messages(input.messages) ?? input.messages
    const { tokenizer } = server
    const { name, served } = yield* Served.servedFor(body, server)
    const { stream, includeUsage } = yield* Streaming.streamingOf(body)
    const toolChoice = yield* ChatReply.toolChoiceOf(body, tools)
    const parallel = yield* ChatReply.parallelOf(body)
    const wantLogprobs = body["logprobs"] === true
    const topK = (yield* RequestBody.optionalInt(body, "top_logprobs", 0, LogprobShapes.maxTopLogprobs)) ?? 0
    if (topK > 0 && !wantLogprobs) {
      return yield* Refusal.fail("when using `top_logprobs`, `logprobs` must be set to true.", 400, "top_logprobs")
    }
    // the tools reach the prompt as the served policy was trained to see them (`toolPrompt`)
    const prompt = tools.length > 0 ? toolPrompt(messages, tools) : { messages, tools: [] }
    const promptIds = yield* Effect.try({
      try: () =>
        tokenizer.applyChatTemplateIds(prompt.messages, {
          addGenerationPrompt: true,
          ...(prompt.tools.length > 0 ? { tools: prompt.tools } : {}),
          ...(typeof body["chat_template_kwargs"] === "object" && body["chat_template_kwargs"] !== null
            ? (body["chat_template_kwargs"] as RequestBody.Json)
            : {})
        }),
      catch: (cause) => new Refusal.BadRequest(cause instanceof Error ? cause.message : "chat template failed")
    })
    const sampling = yield* EngineRequests.samplingOf(
      body,
      tokenizer,
      ["max_tokens", "max_completion_tokens"],
      server.maxN
    )
    // behind a gateway, a reply may take the room the prompt leaves (the generator's rule), not more
    const room = server.maxModelLen - promptIds.length
    const fitted =
      server.gateway !== undefined && room > 0 && (sampling.maxTokens ?? room) > room
        ? { ...sampling, maxTokens: room }
        : sampling
    const unconstrained = yield* EngineRequests.requestsOf([promptIds], fitted, server.maxModelLen)
    const callsOnly = toolChoice.kind === "required" || toolChoice.kind === "named"
    const requests = callsOnly
      ? yield* ToolCallGrammar.constrained(unconstrained, {
          tools,
          allowed: new Set(toolChoice.kind === "named" ? [toolChoice.name] : tools.map((t) => t.function?.name)),
          parallel,
          format: prompt.format ?? "hermes",
          tokenizer
        })
      : yield* EngineRequests.constrained(body, tokenizer, unconstrained)
    const created = yield* Served.secondsNow
    const nonce = ((yield* Random.nextInt) >>> 0).toString(16)
    const id = `${idPrefix}-${created}-${nonce}`
    const eos = new Set(tokenizer.eosIds)
    const tokensAsIds = body["return_tokens_as_token_ids"] === true
    const toolsOn = toolChoice.kind !== "none"
    const usageOf = (results: ReadonlyArray<GenerateResult>) =>
      EngineRequests.usage(
        promptIds.length * requests.length,
        results.reduce((n, r) => n + r.tokens.length, 0)
      )
    let alternatives: LogprobShapes.Alternatives | undefined
    let replies: ReadonlyArray<ReturnType<typeof ChatReply.chatMessage>> = []
    const generate = (rs: ReadonlyArray<GenerateRequest>) =>
      Effect.gen(function* () {
        const started = yield* Clock.currentTimeMillis
        const results = yield* EngineRequests.generateAll(served.engine, rs)
        const llmMs = (yield* Clock.currentTimeMillis) - started
        alternatives = wantLogprobs ? yield* LogprobShapes.alternativesOf(served, rs, results, topK) : undefined
        replies = results.map((r, index) => {
          // the end-of-turn token is markup, not content (vLLM's skip_special_tokens)
          const visible = r.tokens.filter((id, i) => !(i === r.tokens.length - 1 && eos.has(id)))
          return ChatReply.chatMessage(
            tokenizer.decode(visible),
            toolsOn,
            toolChoice.kind === "named" ? toolChoice.name : undefined,
            parallel,
            // unique per response, as OpenAI's and vLLM's are: agent SDKs match results to calls by id
            (k) => `call_${created}${nonce}_${index}_${k}`
          )
        })
        server.gateway?.observe({
          messages,
          promptIds,
          results,
          replies: replies.map((r) => r.message),
          llmMs
        })
        return results
      })
    const logprobsOf = (index: number, tokens: ReadonlyArray<number>, logprobs: ReadonlyArray<number>, from: number) =>
      LogprobShapes.chatLogprobs(
        tokenizer,
        tokens,
        logprobs,
        tokensAsIds,
        alternatives?.[index]?.slice(from, from + tokens.length)
      )
    return {
      name,
      id,
      created,
      stream,
      includeUsage,
      promptIds,
      requests,
      wantLogprobs,
      topK,
      toolChoice,
      callsOnly,
      toolsOn,
      eos,
      usageOf,
      generate,
      replies: () => replies,
      logprobsOf
    } satisfies Chat
  })

/** The whole answer (`stream` off). */
const answer = (chat: Chat) =>
  Effect.gen(function* () {
    const results = yield* chat.generate(chat.requests)
    const replies = chat.replies()
    const choices = results.map((r, index) => {
      const { message, finishReason } = replies[index]!
      return {
        index,
        message,
        logprobs: chat.wantLogprobs ? { content: chat.logprobsOf(index, r.tokens, r.logprobs, 0) } : null,
        finish_reason: finishReason ?? r.finishReason,
        stop_reason: null,
        token_ids: [...r.tokens],
        policy_version_first: r.policyVersionFirst,
        policy_version_last: r.policyVersionLast
      }
    })
    return HttpServerResponse.jsonUnsafe({
      id: chat.id,
      object: "chat.completion",
      created: chat.created,
      model: chat.name,
      choices,
      prompt_token_ids: chat.promptIds,
      usage: chat.usageOf(results)
    })
  })

/**
 * vLLM's ChatCompletionStreamResponse: `token_ids` per choice chunk, `prompt_token_ids` on the first chunk
 * (vllm/entrypoints/openai/chat_completion/protocol.py, `ChatCompletionResponseStreamChoice`).
 */
const streamPlan = (chat: Chat, { tokenizer }: Served.Served): Streaming.StreamPlan => {
  const { requests, includeUsage, eos } = chat
  const chunk = Streaming.chunkOf(
    { id: chat.id, object: "chat.completion.chunk", created: chat.created, model: chat.name },
    includeUsage
  )
  const choice = (index: number, delta: RequestBody.Json, more: RequestBody.Json = {}) => ({
    index,
    delta,
    logprobs: null,
    finish_reason: null,
    ...more
  })
  // with tools offered, text that may be the start of a call is held back until the reply is parsed (all of it when
  // the reply is nothing but calls)
  const holdBack = chat.callsOnly ? () => "" : chat.toolsOn ? ChatReply.beforeCalls : undefined
  const texts = requests.map(() => Streaming.textDeltas(tokenizer, holdBack))
  return {
    requests,
    generate: chat.generate,
    start: requests.map((_, index) =>
      chunk(
        [choice(index, { role: "assistant", content: "" })],
        index === 0 ? { prompt_token_ids: chat.promptIds } : {}
      )
    ),
    token: (index, t, event) => {
      const last = event.finishReason !== undefined
      const visible = !(last && eos.has(event.token))
      return [
        chunk([
          choice(
            index,
            { content: texts[index]!.add(visible ? event.token : undefined, last) },
            {
              logprobs: chat.wantLogprobs
                ? { content: chat.logprobsOf(index, [event.token], [event.logprob], t) }
                : null,
              token_ids: [event.token]
            }
          )
        ])
      ]
    },
    end: (results) => [
      ...results.flatMap((r, index) => {
        const { message, finishReason } = chat.replies()[index]!
        const calls = message["tool_calls"] as ReadonlyArray<ToolCallWire> | undefined
        const content = typeof message["content"] === "string" ? message["content"] : ""
        const rest = ChatReply.unsent(content, texts[index]!.sent(), calls !== undefined)
        return [
          ...(rest === "" ? [] : [chunk([choice(index, { content: rest })])]),
          // OpenAI's tool-call deltas, each call's head (id, name) and then its arguments
          ...(calls ?? []).flatMap((call, j) => [
            chunk([
              choice(index, {
                tool_calls: [
                  { index: j, id: call.id, type: "function", function: { name: call.function.name, arguments: "" } }
                ]
              })
            ]),
            chunk([choice(index, { tool_calls: [{ index: j, function: { arguments: call.function.arguments } }] })])
          ]),
          chunk([
            choice(
              index,
              {},
              {
                finish_reason: finishReason ?? r.finishReason,
                stop_reason: null,
                policy_version_first: r.policyVersionFirst,
                policy_version_last: r.policyVersionLast
              }
            )
          ])
        ]
      }),
      ...(includeUsage ? [chunk([], { usage: chat.usageOf(results) })] : [])
    ]
  }
}
