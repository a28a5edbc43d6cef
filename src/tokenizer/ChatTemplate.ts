/**
 * Chat templates: jinja sources rendered with @huggingface/jinja the way transformers' `apply_chat_template` does,
 * and the incremental path the agent loop uses to append turns without re-tokenising the conversation.
 *
 * Rendering follows transformers: the variables are `messages`, `tools` (None when absent), `documents`,
 * `add_generation_prompt`, the special-token strings (`bos_token`, `eos_token`, `pad_token`, `unk_token`) and any
 * extra keyword (`enable_thinking`, ...). `raise_exception` and `strftime_now` come with @huggingface/jinja.
 * Tool-call arguments arrive as JSON strings (the OpenAI wire form, domain/Message.ts); templates that test
 * `arguments is string` get them as written, the others get parsed objects, as vLLM does before rendering.
 */
import { Template } from "@huggingface/jinja"
import type { Message } from "../domain/Message.ts"
import { ChatTemplatePrefixError, TokenizerError } from "./TokenizerErrors.ts"

/** One tool in the OpenAI `tools` form, which is what chat templates render into the system prompt. */
export interface ToolDefinition {
  readonly type: "function"
  readonly function: {
    readonly name: string
    readonly description?: string
    readonly parameters?: unknown
  }
}

export interface ChatTemplateOptions {
  /** end with the header of a new assistant turn (`<|im_start|>assistant\n`) */
  readonly addGenerationPrompt: boolean
  readonly tools?: ReadonlyArray<ToolDefinition>
  /** any other template variable, under the name the template uses: `enable_thinking`, `documents`, ... */
  readonly [variable: string]: unknown
}

/** What to append after the policy's last sampled token: the text and its ids. */
export interface Continuation {
  readonly text: string
  readonly ids: Array<number>
}

/**
 * How tool-call arguments (JSON strings on the wire) are handed to the template. `auto`: as strings when the
 * template tests `arguments is string` (it prints them verbatim), else parsed to objects (it applies `tojson`).
 */
export type ToolArguments = "auto" | "object" | "string"

export interface Renderer {
  readonly source: string
  /** @throws TokenizerError (reason `Template`) */
  readonly render: (messages: ReadonlyArray<Message>, options: ChatTemplateOptions) => string
}

/**
 * Compiles a template once. `variables` are the tokenizer's special-token strings (`bos_token`, ...).
 * @throws TokenizerError (reason `Template`) when the source does not parse
 */
export const make = (
  source: string,
  variables: Readonly<Record<string, unknown>>,
  options?: { readonly toolArguments?: ToolArguments }
): Renderer => {
  let template: Template
  try {
    template = new Template(source)
  } catch (cause) {
    throw new TokenizerError({ reason: "Template", message: `chat template does not parse: ${describe(cause)}`, cause })
  }
  const mode = options?.toolArguments ?? "auto"
  const argumentsAsString = mode === "string" || (mode === "auto" && /arguments\s+is\s+string/.test(source))
  const render = (messages: ReadonlyArray<Message>, renderOptions: ChatTemplateOptions): string => {
    const { addGenerationPrompt, tools, ...extra } = renderOptions
    try {
      return template.render({
        documents: null,
        ...variables,
        ...extra,
        messages: messages.map((message) => toTemplateMessage(message, argumentsAsString)),
        tools: tools === undefined ? null : tools.map((tool) => structuredClone(tool)),
        add_generation_prompt: addGenerationPrompt
      })
    } catch (cause) {
      throw new TokenizerError({ reason: "Template", message: `chat template failed: ${describe(cause)}`, cause })
    }
  }
  return { source, render }
}

const describe = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

/** A plain, mutable copy (the jinja runtime reads own enumerable keys); absent optional keys stay absent. */
const toTemplateMessage = (message: Message, argumentsAsString: boolean): Record<string, unknown> => {
  const out: Record<string, unknown> = { ...message }
  if (message.tool_calls !== undefined) {
    out["tool_calls"] = message.tool_calls.map((call) => ({
      id: call.id,
      type: call.type,
      function: {
        name: call.function.name,
        arguments: argumentsAsString ? call.function.arguments : parseArguments(call.function.arguments)
      }
    }))
  }
  return out
}

/** Arguments that are not a JSON object stay the string the model wrote, so the template still shows them. */
const parseArguments = (text: string): unknown => {
  try {
    const value: unknown = JSON.parse(text)
    return typeof value === "object" && value !== null ? value : text
  } catch {
    return text
  }
}

/** What `continuation` reads of a tokenizer (Tokenizer.ts's `TokenizerImpl` has it all). */
export interface TemplateTokenizer {
  /** every end-of-turn / end-of-text id */
  readonly eosIds: ReadonlyArray<number>
  /** the tokens added on top of the base vocabulary: where a tokenizer always splits */
  readonly addedTokens: ReadonlyArray<{ readonly content: string }>
  readonly encode: (text: string) => Array<number>
  readonly idToToken: (id: number) => string | undefined
  /** @throws TokenizerError */
  readonly applyChatTemplate: (messages: ReadonlyArray<Message>, options: ChatTemplateOptions) => string
}

export interface ContinuationOptions {
  /**
   * What to do when the template renders the history differently once new messages follow. `fail` (default):
   * `ChatTemplatePrefixError` (`HistoryRewritten`). `alignByEndOfTurn`: accept it when the history ends with an
   * assistant turn, and cut the new rendering after as many end-of-turn tokens as the history's rendering has. The
   * ids the caller holds are what the policy saw, so only the appended part must be exact; use this for templates
   * such as Qwen3's, which give the last assistant turn an empty `<think>` block. Assumes the rewrite adds or
   * removes no end-of-turn token.
   */
  readonly onHistoryRewrite?: "fail" | "alignByEndOfTurn"
}

/**
 * The ids to append to a conversation whose ids the caller already holds, for `messages` (tool results, a user
 * turn) plus the generation prompt, without re-rendering or re-tokenising the earlier turns.
 *
 * Computed as `render(history + messages) − render(history)` on the strings, then only that suffix is encoded.
 * When `history` ends with an assistant turn, the policy's sampled ids end at its end-of-turn token (one of
 * `eosIds`); whatever the template writes after that token (ChatML's "\n") is part of the returned text.
 *
 * Assumptions, each checked, each failing with `ChatTemplatePrefixError` so the caller can fall back to step-wise
 * mode (re-render the whole conversation):
 * - the template renders a turn the same whatever follows it (else `HistoryRewritten`; Qwen3's template does this
 *   to an assistant turn without reasoning, which gets an empty `<think>` block only while it is the last message;
 *   see `ContinuationOptions.onHistoryRewrite`);
 * - the rendered history ends with an end-of-turn token and whitespace only (else `NoEndOfTurn`);
 * - the suffix starts right after or at a special token, where tokenizers always split, so encoding it alone gives
 *   the ids that encoding the whole conversation would (else `UnsafeBoundary`).
 *
 * @throws ChatTemplatePrefixError, TokenizerError
 */
export const continuation = (
  tokenizer: TemplateTokenizer,
  history: ReadonlyArray<Message>,
  messages: ReadonlyArray<Message>,
  options: ChatTemplateOptions,
  continuationOptions?: ContinuationOptions
): Continuation => {
  const before = tokenizer.applyChatTemplate(history, { ...options, addGenerationPrompt: false })
  const after = tokenizer.applyChatTemplate([...history, ...messages], options)
  const rewritten = () => {
    const offset = commonPrefixLength(before, after)
    return new ChatTemplatePrefixError({
      reason: "HistoryRewritten",
      offset,
      message:
        `the template renders the history differently once new messages follow, from character ${offset}: ` +
        `${JSON.stringify(before.slice(offset, offset + 40))} became ${JSON.stringify(after.slice(offset, offset + 40))}`
    })
  }
  if (history.at(-1)?.role === "assistant") {
    const eosStrings = tokenizer.eosIds.flatMap((id) => {
      const token = tokenizer.idToToken(id)
      return token === undefined ? [] : [token]
    })
    const endsBefore = endOfTurnEnds(before, eosStrings)
    const end = endsBefore.at(-1) ?? -1
    if (end < 0 || before.slice(end).trim() !== "") {
      throw new ChatTemplatePrefixError({
        reason: "NoEndOfTurn",
        offset: Math.max(end, 0),
        message: `the rendered history does not end with an end-of-turn token (${eosStrings.join(", ")}) and whitespace`
      })
    }
    let cut = end
    if (!after.startsWith(before)) {
      const aligned = endOfTurnEnds(after, eosStrings)[endsBefore.length - 1]
      if (continuationOptions?.onHistoryRewrite !== "alignByEndOfTurn" || aligned === undefined) throw rewritten()
      cut = aligned
    }
    const text = after.slice(cut)
    return { text, ids: tokenizer.encode(text) }
  }
  if (!after.startsWith(before)) throw rewritten()
  const appended = after.slice(before.length)
  const safe = tokenizer.addedTokens.some(
    (token) => before.endsWith(token.content) || appended.startsWith(token.content)
  )
  if (before.length > 0 && appended.length > 0 && !safe) {
    throw new ChatTemplatePrefixError({
      reason: "UnsafeBoundary",
      offset: before.length,
      message: `the appended text starts mid-text (${JSON.stringify(appended.slice(0, 40))}), not at a special token`
    })
  }
  return { text: appended, ids: tokenizer.encode(appended) }
}

/** The offsets just after each end-of-turn token in `text`, in order. */
const endOfTurnEnds = (text: string, eosStrings: ReadonlyArray<string>): Array<number> => {
  if (eosStrings.length === 0) return []
  const pattern = new RegExp(eosStrings.map((token) => token.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|"), "g")
  return [...text.matchAll(pattern)].map((match) => match.index + match[0].length)
}

const commonPrefixLength = (a: string, b: string): number => {
  let i = 0
  while (i < a.length && i < b.length && a.charCodeAt(i) === b.charCodeAt(i)) i++
  return i
}

/**
 * ChatML as Qwen writes it, for the tokenizers we train ourselves (ByteTokenizer's default). Tools go into the
 * system message as in Qwen2.5/Qwen3 (`# Tools` with one JSON signature per line inside `<tools>`); an assistant
 * turn's tool calls are `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`; consecutive tool results are
 * one user turn of `<tool_response>` blocks. Unlike Qwen3 it never rewrites earlier turns (no `<think>` stripping),
 * so `continuation` always applies.
 */
export const chatMl = [
  "{%- if tools %}",
  "{{- '<|im_start|>system\\n' }}",
  "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}",
  "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}",
  "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}",
  "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}",
  "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within " +
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": ' +
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}",
  "{%- elif messages[0].role == 'system' %}",
  "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
  "{%- endif %}",
  "{%- for message in messages %}",
  "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}",
  "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
  "{%- elif message.role == 'assistant' %}",
  "{{- '<|im_start|>assistant\\n' + message.content }}",
  "{%- if message.tool_calls %}",
  "{%- for tool_call in message.tool_calls %}",
  "{%- if (loop.first and message.content) or (not loop.first) %}{{- '\\n' }}{%- endif %}",
  "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}",
  '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}',
  "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}" +
    "{%- endif %}",
  "{{- '}\\n</tool_call>' }}",
  "{%- endfor %}",
  "{%- endif %}",
  "{{- '<|im_end|>\\n' }}",
  "{%- elif message.role == 'tool' %}",
  "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}",
  "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}",
  "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}",
  "{%- endif %}",
  "{%- endfor %}",
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
].join("\n")
