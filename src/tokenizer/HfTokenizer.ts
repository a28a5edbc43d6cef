/**
 * A Hugging Face tokenizer from a model directory: `tokenizer.json` (run by @huggingface/tokenizers, the pure-JS
 * implementation of the Rust `tokenizers` pipeline: normalizer, pre-tokenizer regex, byte-level BPE, decoder) and
 * `tokenizer_config.json` (special tokens, the jinja `chat_template`, rendered by ChatTemplate.ts).
 *
 * Also read when present: `chat_template.jinja` (newer transformers save the template there, and it wins over the
 * config's) and `generation_config.json` (its `eos_token_id`, which for Qwen lists both `<|im_end|>` and
 * `<|endoftext|>`). The end-of-turn ids are: `eos_token`, those `eos_token_id`s, and every `endOfTurnTokens` name the
 * vocabulary has as a special token.
 */
import { Tokenizer as HfJsTokenizer } from "@huggingface/tokenizers"
import { Effect, FileSystem, Layer } from "effect"
import * as ChatTemplate from "./ChatTemplate.ts"
import {
  type AddedToken,
  endOfTurnTokens,
  fromImpl,
  type HfFiles,
  Tokenizer,
  TokenizerError,
  type TokenizerImpl
} from "./Tokenizer.ts"

/** The contents of a model directory's tokenizer files, parsed. */
export interface Files {
  readonly tokenizerJson: unknown
  readonly tokenizerConfig: unknown
  readonly generationConfig?: unknown
  /** chat_template.jinja, when the directory has one */
  readonly chatTemplateJinja?: string
}

export interface HfTokenizerOptions {
  /** jinja source replacing the model's template */
  readonly chatTemplate?: string
}

interface TokenizerConfigJson {
  readonly chat_template?: unknown
  readonly bos_token?: unknown
  readonly eos_token?: unknown
  readonly pad_token?: unknown
  readonly unk_token?: unknown
}

const describe = (cause: unknown): string => (cause instanceof Error ? cause.message : "unknown failure")

/** Special tokens appear as a string or as a serialised AddedToken (`{"content": "<s>", ...}`). */
const tokenString = (value: unknown): string | undefined =>
  typeof value === "string"
    ? value
    : typeof value === "object" && value !== null && typeof (value as { content?: unknown }).content === "string"
      ? (value as { content: string }).content
      : undefined

/**
 * The config's template: a string, or a list of named ones (`default`, `tool_use`, …) of which transformers takes
 * `tool_use` when tools are given.
 */
const templatesOf = (config: TokenizerConfigJson): { readonly base?: string; readonly toolUse?: string } => {
  const value = config.chat_template
  if (typeof value === "string") return { base: value }
  if (!Array.isArray(value)) return {}
  const named = new Map<string, string>()
  for (const entry of value as ReadonlyArray<{ readonly name?: unknown; readonly template?: unknown }>) {
    if (typeof entry?.name === "string" && typeof entry.template === "string") named.set(entry.name, entry.template)
  }
  const base = named.get("default")
  const toolUse = named.get("tool_use")
  return { ...(base === undefined ? {} : { base }), ...(toolUse === undefined ? {} : { toolUse }) }
}

/**
 * Builds the tokenizer from parsed files.
 * @throws TokenizerError (reason `BadFile`) when @huggingface/tokenizers rejects the files, or `Template` when the
 * chat template does not parse
 */
export const fromFiles = (files: Files, options?: HfTokenizerOptions): TokenizerImpl => {
  const config = (files.tokenizerConfig ?? {}) as TokenizerConfigJson
  let hf: HfJsTokenizer
  try {
    hf = new HfJsTokenizer(files.tokenizerJson as object, config)
  } catch (cause) {
    throw new TokenizerError({
      reason: "BadFile",
      path: "tokenizer.json",
      message: `@huggingface/tokenizers cannot load tokenizer.json: ${describe(cause)}`,
      cause
    })
  }
  const vocab = hf.get_vocab(true)
  let vocabSize = 0
  for (const id of vocab.values()) vocabSize = Math.max(vocabSize, id + 1)
  const addedTokens: ReadonlyArray<AddedToken> = [...hf.get_added_tokens_decoder().values()]
    .map((token) => ({ id: token.id, content: token.content, special: token.special }))
    .sort((a, b) => a.id - b.id)
  const specialIds = new Set(addedTokens.filter((token) => token.special).map((token) => token.id))
  const idOf = (token: string | undefined) => (token === undefined ? undefined : hf.token_to_id(token))

  const eosToken = tokenString(config.eos_token)
  const bosToken = tokenString(config.bos_token)
  const padToken = tokenString(config.pad_token)
  const unkToken = tokenString(config.unk_token)
  const generationEos = (files.generationConfig as { readonly eos_token_id?: unknown } | undefined)?.eos_token_id
  const eosCandidates = [
    idOf(eosToken),
    ...(Array.isArray(generationEos) ? generationEos : [generationEos]),
    ...endOfTurnTokens.map(idOf).filter((id) => id !== undefined && specialIds.has(id))
  ]
  const eosIds = [...new Set(eosCandidates.filter((id): id is number => Number.isInteger(id)))]
  const bosId = idOf(bosToken)
  const padId = idOf(padToken) ?? eosIds[0] ?? 0

  const overridden = options?.chatTemplate !== undefined || files.chatTemplateJinja !== undefined
  const templates =
    options?.chatTemplate !== undefined
      ? { base: options.chatTemplate }
      : files.chatTemplateJinja !== undefined
        ? { base: files.chatTemplateJinja }
        : templatesOf(config)
  const variables = {
    bos_token: bosToken ?? null,
    eos_token: eosToken ?? null,
    pad_token: padToken ?? null,
    unk_token: unkToken ?? null
  }
  const base = templates.base === undefined ? undefined : ChatTemplate.make(templates.base, variables)
  const toolUse = templates.toolUse === undefined ? undefined : ChatTemplate.make(templates.toolUse, variables)
  const applyChatTemplate: TokenizerImpl["applyChatTemplate"] = (messages, renderOptions) => {
    const renderer = renderOptions.tools !== undefined && toolUse !== undefined ? toolUse : (base ?? toolUse)
    if (renderer === undefined) {
      throw new TokenizerError({ reason: "Template", message: "the tokenizer has no chat template" })
    }
    return renderer.render(messages, renderOptions)
  }

  const encode = (text: string, encodeOptions?: { readonly addSpecialTokens?: boolean }): Array<number> =>
    hf.encode(text, { add_special_tokens: encodeOptions?.addSpecialTokens === true }).ids
  const decode = (ids: ReadonlyArray<number>, decodeOptions?: { readonly skipSpecialTokens?: boolean }): string => {
    const known = ids.filter((id) => Number.isInteger(id) && id >= 0 && hf.id_to_token(id) !== undefined)
    if (known.length === 0) return ""
    return hf.decode(known, { skip_special_tokens: decodeOptions?.skipSpecialTokens === true })
  }
  const chatTemplate = base?.source ?? toolUse?.source ?? ""
  const hfFiles = (): HfFiles => ({
    "tokenizer.json": files.tokenizerJson,
    "tokenizer_config.json": overridden ? { ...config, chat_template: chatTemplate } : config
  })

  return {
    kind: "hf",
    vocabSize,
    ...(bosId === undefined ? {} : { bosId }),
    eosIds,
    padId,
    addedTokens,
    chatTemplate,
    encode,
    decode,
    tokenToId: (token) => hf.token_to_id(token),
    idToToken: (id) => hf.id_to_token(id),
    applyChatTemplate,
    applyChatTemplateIds: (messages, renderOptions) => encode(applyChatTemplate(messages, renderOptions)),
    hfFiles
  }
}

/** Reads a model directory's tokenizer files (tokenizer.json and tokenizer_config.json required). */
export const readFiles = Effect.fnUntraced(function* (dir: string) {
  const fs = yield* FileSystem.FileSystem
  const readJson = (name: string, required: boolean) =>
    Effect.gen(function* () {
      const path = `${dir}/${name}`
      const exists = yield* fs.exists(path).pipe(Effect.orElseSucceed(() => false))
      if (!exists) {
        if (!required) return undefined
        return yield* new TokenizerError({ reason: "NotFound", path, message: `${path} does not exist` })
      }
      const text = yield* fs
        .readFileString(path)
        .pipe(
          Effect.mapError((cause) => new TokenizerError({ reason: "NotFound", path, message: cause.message, cause }))
        )
      return yield* Effect.try({
        try: (): unknown => JSON.parse(text),
        catch: (cause) => new TokenizerError({ reason: "BadFile", path, message: `${path} is not JSON`, cause })
      })
    })
  const tokenizerJson = yield* readJson("tokenizer.json", true)
  const tokenizerConfig = yield* readJson("tokenizer_config.json", true)
  const generationConfig = yield* readJson("generation_config.json", false)
  const jinjaPath = `${dir}/chat_template.jinja`
  const chatTemplateJinja = (yield* fs.exists(jinjaPath).pipe(Effect.orElseSucceed(() => false)))
    ? yield* fs
        .readFileString(jinjaPath)
        .pipe(
          Effect.mapError(
            (cause) => new TokenizerError({ reason: "NotFound", path: jinjaPath, message: cause.message, cause })
          )
        )
    : undefined
  const files: Files = {
    tokenizerJson,
    tokenizerConfig,
    ...(generationConfig === undefined ? {} : { generationConfig }),
    ...(chatTemplateJinja === undefined ? {} : { chatTemplateJinja })
  }
  return files
})

/** Loads the tokenizer of a model directory. */
export const load = Effect.fnUntraced(function* (dir: string, options?: HfTokenizerOptions) {
  const files = yield* readFiles(dir)
  return yield* Effect.try({
    try: () => fromFiles(files, options),
    catch: (cause) =>
      cause instanceof TokenizerError
        ? cause
        : new TokenizerError({ reason: "BadFile", path: dir, message: describe(cause), cause })
  })
})

export const layer = (
  dir: string,
  options?: HfTokenizerOptions
): Layer.Layer<Tokenizer, TokenizerError, FileSystem.FileSystem> =>
  Layer.effect(Tokenizer, Effect.map(load(dir, options), fromImpl))
