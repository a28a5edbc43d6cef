/**
 * The tokenizer of the tiny models we train from scratch: ids 0–255 are the UTF-8 bytes, named special tokens
 * follow (`<|pad|>` = 256, `<|endoftext|>` = 257, …), and reserved tokens pad the vocabulary to a multiple of 64
 * (320 with the default list), the width a model's embedding is allocated with.
 *
 * Special-token strings in the text are encoded as their single id (as HF tokenizers do with
 * `split_special_tokens: false`), so a template's `<|im_start|>` or a model's `<tool_call>` is one token.
 * Control tokens (`<|…|>`) are `special` (dropped by `skipSpecialTokens`); markup tokens (`<tool_call>`, `<think>`,
 * …) are not, as in Qwen's tokenizer, so decoded text keeps them for the tool-call parser.
 *
 * It saves itself as a standard byte-level BPE tokenizer.json with no merges (vocab = the 256 GPT-2 byte
 * characters, id = byte) plus tokenizer_config.json with the chat template, so any HF tokenizer implementation
 * loads a checkpoint's tokenizer and encodes the same ids; `fromHfFiles` recognises that shape and loads it back.
 */
import { Layer } from "effect"
import * as ChatTemplate from "./ChatTemplate.ts"
import {
  type AddedToken,
  type DecodeOptions,
  endOfTurnTokens,
  fromImpl,
  type HfFiles,
  Tokenizer,
  TokenizerError,
  type TokenizerImpl
} from "./Tokenizer.ts"

export const defaultSpecialTokens: ReadonlyArray<string> = [
  "<|pad|>",
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<tool_call>",
  "</tool_call>",
  "<tool_response>",
  "</tool_response>",
  "<think>",
  "</think>",
  "<answer>",
  "</answer>"
]

export interface ByteTokenizerOptions {
  /** named tokens after the 256 bytes, in id order; default `defaultSpecialTokens` */
  readonly specialTokens?: ReadonlyArray<string>
  /** the vocabulary is padded with `<|reserved_special_token_k|>` to a multiple of this; default 64 */
  readonly vocabMultiple?: number
  /** jinja source; default `ChatTemplate.chatMl` */
  readonly chatTemplate?: string
}

/** Control tokens are written `<|name|>`; anything else (`<tool_call>`) is markup the model writes as text. */
const isControl = (token: string): boolean => token.startsWith("<|") && token.endsWith("|>")

export const make = (options?: ByteTokenizerOptions): TokenizerImpl => {
  const named = options?.specialTokens ?? defaultSpecialTokens
  const multiple = options?.vocabMultiple ?? 64
  const vocabSize = Math.ceil((256 + named.length) / multiple) * multiple
  const reserved = Array.from({ length: vocabSize - 256 - named.length }, (_, k) => `<|reserved_special_token_${k}|>`)
  return build(
    [...named, ...reserved].map((content) => ({ content, special: isControl(content) })),
    options?.chatTemplate ?? ChatTemplate.chatMl
  )
}

const build = (
  added: ReadonlyArray<{ readonly content: string; readonly special: boolean }>,
  chatTemplate: string
): TokenizerImpl => {
  const addedTokens: ReadonlyArray<AddedToken> = added.map((token, i) => ({ id: 256 + i, ...token }))
  const idOf = new Map(addedTokens.map((token) => [token.content, token.id]))
  if (idOf.size !== addedTokens.length) {
    throw new TokenizerError({ reason: "BadFile", message: "byte tokenizer: special tokens are not unique" })
  }
  const vocabSize = 256 + addedTokens.length
  const has = (token: string) => idOf.has(token)
  const eosToken = ["<|im_end|>", "<|endoftext|>"].find(has) ?? addedTokens[0]?.content
  const eosIds = [...new Set([eosToken, ...endOfTurnTokens.filter(has)])].flatMap((token) =>
    token === undefined ? [] : [idOf.get(token)!]
  )
  const padToken = has("<|pad|>") ? "<|pad|>" : eosToken
  const padId = padToken === undefined ? 0 : idOf.get(padToken)!

  // longest first, so that a token that is a prefix of another never wins
  const pattern =
    addedTokens.length === 0
      ? undefined
      : new RegExp(
          [...addedTokens]
            .sort((a, b) => b.content.length - a.content.length)
            .map((t) => escapeRegExp(t.content))
            .join("|"),
          "g"
        )
  const utf8 = new TextEncoder()
  const encode = (text: string): Array<number> => {
    const ids: Array<number> = []
    const pushBytes = (segment: string) => {
      for (const byte of utf8.encode(segment)) ids.push(byte)
    }
    if (pattern === undefined) {
      pushBytes(text)
      return ids
    }
    let last = 0
    for (const match of text.matchAll(pattern)) {
      pushBytes(text.slice(last, match.index))
      ids.push(idOf.get(match[0])!)
      last = match.index + match[0].length
    }
    pushBytes(text.slice(last))
    return ids
  }

  const decode = (ids: ReadonlyArray<number>, options?: DecodeOptions): string => {
    const skip = options?.skipSpecialTokens === true
    const utf8Decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true })
    let out = ""
    let bytes: Array<number> = []
    const flush = () => {
      if (bytes.length > 0) out += utf8Decoder.decode(Uint8Array.from(bytes))
      bytes = []
    }
    for (const id of ids) {
      if (id >= 0 && id < 256) bytes.push(id)
      else {
        const token = addedTokens[id - 256]
        if (token === undefined || (skip && token.special)) continue
        flush()
        out += token.content
      }
    }
    flush()
    return out
  }

  const tokenToId = (token: string): number | undefined => {
    const id = idOf.get(token)
    if (id !== undefined) return id
    const byte = byteOfChar.get(token)
    return byte
  }
  const idToToken = (id: number): string | undefined =>
    id >= 0 && id < 256 ? byteChars[id] : addedTokens[id - 256]?.content

  const variables = {
    eos_token: eosToken ?? null,
    pad_token: padToken ?? null,
    bos_token: null,
    unk_token: null
  }
  const renderer = ChatTemplate.make(chatTemplate, variables)

  const hfFiles = (): HfFiles => hfFilesOf(addedTokens, chatTemplate, eosToken, padToken)

  return {
    kind: "byte",
    vocabSize,
    eosIds,
    padId,
    addedTokens,
    chatTemplate,
    encode,
    decode,
    tokenToId,
    idToToken,
    applyChatTemplate: renderer.render,
    applyChatTemplateIds: (messages, options) => encode(renderer.render(messages, options)),
    hfFiles
  }
}

/**
 * The files the tokenizer saves itself as: a byte-level BPE tokenizer.json with no merges (vocab = the 256 GPT-2 byte
 * characters) and tokenizer_config.json with the chat template.
 */
const hfFilesOf = (
  addedTokens: ReadonlyArray<AddedToken>,
  chatTemplate: string,
  eosToken: string | undefined,
  padToken: string | undefined
): HfFiles => {
  const addedJson = addedTokens.map((token) => ({
    id: token.id,
    content: token.content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: token.special
  }))
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false }
  return {
    "tokenizer.json": {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: addedJson,
      normalizer: null,
      pre_tokenizer: byteLevel,
      post_processor: null,
      decoder: byteLevel,
      model: {
        type: "BPE",
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: false,
        vocab: Object.fromEntries(byteChars.map((char, byte) => [char, byte])),
        merges: []
      }
    },
    "tokenizer_config.json": {
      added_tokens_decoder: Object.fromEntries(addedJson.map(({ id, ...token }) => [String(id), token])),
      additional_special_tokens: addedTokens.filter((token) => token.special).map((token) => token.content),
      bos_token: null,
      eos_token: eosToken ?? null,
      pad_token: padToken ?? null,
      unk_token: null,
      chat_template: chatTemplate,
      clean_up_tokenization_spaces: false,
      model_max_length: 1_000_000_000,
      split_special_tokens: false,
      tokenizer_class: "PreTrainedTokenizerFast"
    }
  }
}

const escapeRegExp = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/**
 * GPT-2's reversible byte → printable character map (`bytes_to_unicode`), which byte-level BPE vocabularies use:
 * printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards (space → "Ġ", "\n" → "Ċ").
 */
export const byteChars: ReadonlyArray<string> = (() => {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
  let next = 256
  return Array.from({ length: 256 }, (_, b) => String.fromCodePoint(printable(b) ? b : next++))
})()
const byteOfChar = new Map(byteChars.map((char, byte) => [char, byte]))

/**
 * True when `tokenizerJson` is a byte tokenizer's: byte-level BPE with no merges whose vocabulary is exactly the
 * 256 byte characters at their byte ids, with the added tokens right after them.
 */
export const isByteTokenizerJson = (tokenizerJson: unknown): boolean => {
  const json = tokenizerJson as {
    readonly model?: { readonly type?: unknown; readonly vocab?: unknown; readonly merges?: unknown }
    readonly added_tokens?: unknown
    readonly normalizer?: unknown
    readonly pre_tokenizer?: { readonly type?: unknown }
  } | null
  const model = json?.model
  if (model?.type !== "BPE" || !Array.isArray(model.merges) || model.merges.length !== 0) return false
  if (json?.pre_tokenizer?.type !== "ByteLevel" || (json.normalizer ?? null) !== null) return false
  const vocab = model.vocab as Record<string, unknown> | undefined
  if (typeof vocab !== "object" || vocab === null || Object.keys(vocab).length !== 256) return false
  if (!byteChars.every((char, byte) => vocab[char] === byte)) return false
  const added = json.added_tokens
  return (
    Array.isArray(added) &&
    added.every((token: { readonly id?: unknown }, i) => typeof token === "object" && token?.id === 256 + i)
  )
}

/**
 * Loads a byte tokenizer from its HF files (what `hfFiles` wrote, or any file of the same shape).
 * @throws TokenizerError (reason `Unsupported`) when tokenizer.json is not a byte tokenizer's
 */
export const fromHfFiles = (tokenizerJson: unknown, tokenizerConfig: unknown, chatTemplate?: string): TokenizerImpl => {
  if (!isByteTokenizerJson(tokenizerJson)) {
    throw new TokenizerError({
      reason: "Unsupported",
      message: "tokenizer.json is not a byte tokenizer (byte-level BPE, 256 byte tokens, no merges)"
    })
  }
  const added = (tokenizerJson as { readonly added_tokens: ReadonlyArray<{ content: unknown; special: unknown }> })
    .added_tokens
  const template = chatTemplate ?? (tokenizerConfig as { readonly chat_template?: unknown } | null)?.chat_template
  return build(
    added.map((token) => ({ content: String(token.content), special: token.special === true })),
    typeof template === "string" ? template : ChatTemplate.chatMl
  )
}

/** The service over a fresh byte tokenizer. */
export const layer = (options?: ByteTokenizerOptions): Layer.Layer<Tokenizer> =>
  Layer.sync(Tokenizer, () => fromImpl(make(options)))
