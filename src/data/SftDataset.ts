/**
 * Supervised fine-tuning data: chat rows tokenized with the model's chat template and a per-token loss mask.
 *
 * Row shapes (JSON array, JSONL or Parquet, read by Dataset.readRaw):
 * - `{ messages: [...], tools?: [...] }`, the chat form of TRL / OpenAI fine-tuning files;
 * - a SkyRL row: `prompt` (messages) followed by one assistant turn taken from `response`, `extra_info.response`
 *   or `extra_info.answer` (the first found).
 *
 * The loss mask is computed token-exactly by rendering the template incrementally. For assistant message i:
 *
 *   start_i = |render(messages[<i], add_generation_prompt)|     the text the policy is prompted with
 *   end_i   = |render(messages[≤i])|                            that turn written out, template suffix included
 *
 * The prompt render must be a prefix of render(messages) (else the template rewrites history and no exact mask
 * exists: the row fails). The turn render may not be one when the template writes the LAST assistant turn
 * differently (Qwen3 adds an empty `<think></think>` block only there): then the turn ends at its first end-of-turn
 * token in render(messages), i.e. the span is what the full rendering holds. The text is cut at these offsets and each piece
 * is encoded on its own, which is how the policy meets the same text at sampling time: the prompt is encoded, the
 * assistant tokens are sampled after it, and the next turn is appended as its own encoding (ChatTemplate.continuation).
 * Mask = 1 on an assistant piece up to and including its last end-of-turn token (`<|im_end|>`): the policy emits
 * that token to stop; what follows it (ChatML's `\n`) is template, never sampled, so 0. Position 0 is always 0:
 * nothing predicts the first token (LogProbs aligns log p(ids[t] | ids[<t]) at t).
 */
import { type Cause, Console, Effect, type FileSystem, Schema, SchemaIssue, Stream } from "effect"
import { DatasetError } from "../domain/Errors.ts"
import { Message } from "../domain/Message.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"
import { Tokenizer, type TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import * as Dataset from "./Dataset.ts"

export type LossOn = "assistant" | "all"

/** One conversation to learn from. */
export interface Conversation {
  readonly messages: ReadonlyArray<Message>
  readonly tools?: ReadonlyArray<ToolDefinition>
}

/** A tokenized conversation: ids and a loss mask aligned with them (1 = the loss scores this token). */
export interface Example {
  readonly ids: ReadonlyArray<number>
  readonly lossMask: ReadonlyArray<0 | 1>
  readonly source: string // `file#row`
}

export interface Loaded {
  readonly examples: ReadonlyArray<Example>
  readonly rows: number
  readonly truncated: number // rows cut at max_length
  readonly dropped: number // rows with no loss token left after the cut
  readonly tokens: number
  readonly lossTokens: number
}

const MessagesRow = Schema.Struct({
  messages: Schema.Array(Message).check(Schema.isMinLength(1)),
  tools: Schema.optionalKey(Schema.Array(Schema.Unknown))
})

const PromptRow = Schema.Struct({
  prompt: Schema.Array(Message).check(Schema.isMinLength(1)),
  response: Schema.optionalKey(Schema.String),
  extra_info: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown)),
  tools: Schema.optionalKey(Schema.Array(Schema.Unknown))
})

const decodeMessagesRow = Schema.decodeUnknownExit(MessagesRow)
const decodePromptRow = Schema.decodeUnknownExit(PromptRow)

const firstIssue = (cause: Cause.Cause<Schema.SchemaError>, file: string, row: number): DatasetError => {
  const failure = cause.reasons.find((r) => r._tag === "Fail")
  const issue =
    failure !== undefined && failure._tag === "Fail"
      ? SchemaIssue.makeFormatterStandardSchemaV1()(failure.error.issue).issues[0]
      : undefined
  return new DatasetError({
    file,
    row,
    path: (issue?.path ?? []).map((p) => String(typeof p === "object" ? p.key : p)).join("."),
    detail: issue?.message ?? "invalid row"
  })
}

/** The assistant answer of a SkyRL row: `response`, else `extra_info.response`, else `extra_info.answer`. */
const answerOf = (row: typeof PromptRow.Type): string | undefined => {
  if (row.response !== undefined) return row.response
  for (const key of ["response", "answer"]) {
    const value = row.extra_info?.[key]
    if (typeof value === "string") return value
    if (typeof value === "number") return String(value)
  }
  return undefined
}

/** Decode one raw row (either shape) into a conversation; `file` and `row` (1-based) label errors. */
export const toConversation = (raw: unknown, file: string, row: number): Effect.Effect<Conversation, DatasetError> => {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    return Effect.fail(new DatasetError({ file, row, detail: "a row must be a JSON object" }))
  }
  const withTools = (messages: ReadonlyArray<Message>, tools: ReadonlyArray<unknown> | undefined): Conversation =>
    tools === undefined || tools.length === 0
      ? { messages }
      : { messages, tools: tools as ReadonlyArray<ToolDefinition> }
  if ("messages" in raw) {
    const exit = decodeMessagesRow(raw, { errors: "all" })
    if (exit._tag === "Failure") return Effect.fail(firstIssue(exit.cause, file, row))
    if (!exit.value.messages.some((m) => m.role === "assistant")) {
      return Effect.fail(new DatasetError({ file, row, path: "messages", detail: "no assistant message to learn" }))
    }
    return Effect.succeed(withTools(exit.value.messages, exit.value.tools))
  }
  if ("prompt" in raw) {
    const exit = decodePromptRow(raw, { errors: "all" })
    if (exit._tag === "Failure") return Effect.fail(firstIssue(exit.cause, file, row))
    const answer = answerOf(exit.value)
    if (answer === undefined) {
      return Effect.fail(
        new DatasetError({
          file,
          row,
          detail: "a prompt row needs its assistant turn in response, extra_info.response or extra_info.answer"
        })
      )
    }
    return Effect.succeed(withTools([...exit.value.prompt, { role: "assistant", content: answer }], exit.value.tools))
  }
  return Effect.fail(
    new DatasetError({ file, row, detail: "expected { messages: [...] } or a SkyRL row with prompt + response" })
  )
}

/**
 * Token ids of a conversation and its loss mask (see the module header).
 * @throws TokenizerError when the template fails; Error when the template rewrites earlier turns.
 */
export const tokenize = (
  tokenizer: TokenizerImpl,
  conversation: Conversation,
  lossOn: LossOn = "assistant"
): { readonly ids: Array<number>; readonly lossMask: Array<0 | 1> } => {
  const { messages } = conversation
  const render = (upTo: number, addGenerationPrompt: boolean) =>
    tokenizer.applyChatTemplate(
      messages.slice(0, upTo),
      conversation.tools === undefined ? { addGenerationPrompt } : { addGenerationPrompt, tools: conversation.tools }
    )
  const full = render(messages.length, false)
  const eos = new Set(tokenizer.eosIds)
  const eosTexts = tokenizer.eosIds.flatMap((id) => {
    const token = tokenizer.idToToken(id)
    return token === undefined || token === "" ? [] : [token]
  })
  /** Just past the first end-of-turn token at or after `from` in `text`. */
  const turnEnd = (text: string, from: number): number | undefined => {
    const ends = eosTexts.map((t) => [text.indexOf(t, from), t.length] as const).filter(([at]) => at >= 0)
    return ends.length === 0 ? undefined : Math.min(...ends.map(([at, length]) => at + length))
  }
  const ids: Array<number> = []
  const lossMask: Array<0 | 1> = []
  const append = (text: string, assistant: boolean) => {
    const piece = tokenizer.encode(text)
    let cut = 0
    if (assistant) {
      let lastEos = -1
      for (let k = piece.length - 1; k >= 0 && lastEos < 0; k--) if (eos.has(piece[k]!)) lastEos = k
      cut = lastEos >= 0 ? lastEos + 1 : piece.length
    }
    for (const [k, id] of piece.entries()) {
      ids.push(id)
      lossMask.push(k < cut ? 1 : 0)
    }
  }
  let cursor = 0
  for (const [i, message] of messages.entries()) {
    if (message.role !== "assistant") continue
    const prompt = render(i, true)
    if (!full.startsWith(prompt)) {
      throw new Error(
        `the chat template renders the conversation before assistant message ${i} differently once later turns ` +
          "follow, so its tokens cannot be masked exactly"
      )
    }
    if (prompt.length < cursor) throw new Error(`assistant message ${i} overlaps the previous one in the template`)
    const written = render(i + 1, false)
    const end =
      full.startsWith(written) && written.length >= prompt.length ? written.length : turnEnd(full, prompt.length)
    if (end === undefined) {
      throw new Error(`assistant message ${i} renders differently once later turns follow and has no end-of-turn token`)
    }
    append(full.slice(cursor, prompt.length), false)
    append(full.slice(prompt.length, end), true)
    cursor = end
  }
  append(full.slice(cursor), false)
  if (lossOn === "all") lossMask.fill(1)
  if (lossMask.length > 0) lossMask[0] = 0
  return { ids, lossMask }
}

/**
 * Every row of `files`, tokenized and cut at `maxLength` tokens. A row left with no loss token is dropped and
 * counted; a bad row or template failure fails with the file and row.
 */
export const load = (
  files: ReadonlyArray<string>,
  tokenizer: TokenizerImpl,
  options: { readonly maxLength: number; readonly lossOn: LossOn }
): Effect.Effect<Loaded, DatasetError, FileSystem.FileSystem> =>
  Effect.gen(function* () {
    const examples: Array<Example> = []
    let rows = 0
    let truncated = 0
    let dropped = 0
    for (const file of files) {
      const raws = yield* Stream.runCollect(Dataset.readRaw(file))
      for (const { raw, index } of raws) {
        rows += 1
        const conversation = yield* toConversation(raw, file, index)
        const { ids, lossMask } = yield* Effect.try({
          try: () => tokenize(tokenizer, conversation, options.lossOn),
          catch: (cause) =>
            new DatasetError({
              file,
              row: index,
              detail: `chat template: ${cause instanceof Error ? cause.message : String(cause)}`
            })
        })
        if (ids.length > options.maxLength) truncated += 1
        const cut = lossMask.slice(0, options.maxLength)
        if (!cut.includes(1)) {
          dropped += 1
          continue
        }
        examples.push({ ids: ids.slice(0, options.maxLength), lossMask: cut, source: `${file}#${index}` })
      }
    }
    return {
      examples,
      rows,
      truncated,
      dropped,
      tokens: examples.reduce((n, e) => n + e.ids.length, 0),
      lossTokens: examples.reduce((n, e) => n + e.lossMask.reduce<number>((a, b) => a + b, 0), 0)
    }
  })

/**
 * The training and held-out examples of an `sft` run, tokenized with the run's Tokenizer (`load` on each list of
 * files); rows cut at `maxLength` or dropped are counted on stderr.
 */
export const loadSplits = Effect.fn("SftDataset.loadSplits")(function* (
  files: { readonly train: ReadonlyArray<string>; readonly eval: ReadonlyArray<string> },
  options: { readonly maxLength: number; readonly lossOn: LossOn }
) {
  const { impl } = yield* Tokenizer
  const train = yield* load(files.train, impl, options)
  const held = yield* load(files.eval, impl, options)
  for (const [name, loaded] of [
    ["train", train],
    ["eval", held]
  ] as const) {
    if (loaded.truncated > 0 || loaded.dropped > 0) {
      yield* Console.error(
        `sft ${name}: ${loaded.truncated} of ${loaded.rows} rows cut at max_length ${options.maxLength}, ` +
          `${loaded.dropped} dropped (no loss token left)`
      )
    }
  }
  return { train: train.examples, eval: held.examples }
})
