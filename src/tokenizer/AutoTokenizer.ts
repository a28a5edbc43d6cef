/**
 * Loads whichever tokenizer a directory holds and saves any tokenizer into one, so that a checkpoint directory
 * describes itself: a byte tokenizer's tokenizer.json is recognised by its shape (ByteTokenizer.isByteTokenizerJson)
 * and loaded as a ByteTokenizer, anything else goes to HfTokenizer. Like transformers' AutoTokenizer, the files
 * choose the implementation; `fromConfig` adds the run config's choice (`tokenizer.kind`, `path`, `chat_template`).
 */
import { Effect, FileSystem, Layer } from "effect"
import type { TokenizerConfig } from "../config/TokenizerConfig.ts"
import * as HfCache from "../model/HfCache.ts"
import * as ByteTokenizer from "./ByteTokenizer.ts"
import * as HfTokenizer from "./HfTokenizer.ts"
import { fromImpl, Tokenizer, TokenizerError, type TokenizerImpl } from "./Tokenizer.ts"

const toError =
  (path: string) =>
  (cause: unknown): TokenizerError =>
    cause instanceof TokenizerError
      ? cause
      : new TokenizerError({
          reason: "BadFile",
          path,
          message: cause instanceof Error ? cause.message : "cannot build the tokenizer",
          cause
        })

/** The tokenizer saved in `dir` (tokenizer.json + tokenizer_config.json), byte or HF. */
export const load = Effect.fnUntraced(function* (dir: string, options?: { readonly chatTemplate?: string }) {
  const files = yield* HfTokenizer.readFiles(dir)
  const chatTemplate = options?.chatTemplate ?? files.chatTemplateJinja
  return yield* Effect.try({
    try: (): TokenizerImpl =>
      ByteTokenizer.isByteTokenizerJson(files.tokenizerJson)
        ? ByteTokenizer.fromHfFiles(files.tokenizerJson, files.tokenizerConfig, chatTemplate)
        : HfTokenizer.fromFiles(files, options),
    catch: toError(dir)
  })
})

/** Writes tokenizer.json and tokenizer_config.json (with the chat template) into `dir`, creating it. */
export const save = Effect.fnUntraced(function* (tokenizer: TokenizerImpl, dir: string) {
  const fs = yield* FileSystem.FileSystem
  const files = tokenizer.hfFiles()
  const write = (name: keyof typeof files) => {
    const path = `${dir}/${name}`
    return fs
      .writeFileString(path, `${JSON.stringify(files[name], null, 2)}\n`)
      .pipe(Effect.mapError((cause) => new TokenizerError({ reason: "NotFound", path, message: cause.message, cause })))
  }
  yield* fs
    .makeDirectory(dir, { recursive: true })
    .pipe(
      Effect.mapError((cause) => new TokenizerError({ reason: "NotFound", path: dir, message: cause.message, cause }))
    )
  yield* write("tokenizer.json")
  yield* write("tokenizer_config.json")
})

/** An inline jinja source, or else the path of a file holding one. */
const resolveTemplate = Effect.fnUntraced(function* (value: string | undefined) {
  if (value === undefined || value.includes("{%") || value.includes("{{")) return value
  const fs = yield* FileSystem.FileSystem
  return yield* fs
    .readFileString(value)
    .pipe(
      Effect.mapError(
        (cause) =>
          new TokenizerError({ reason: "NotFound", path: value, message: `chat_template: ${cause.message}`, cause })
      )
    )
})

/**
 * The tokenizer a run config asks for. `byte` without a `path`: a fresh ByteTokenizer with the default special
 * tokens; otherwise the directory `path`, or the model directory when `path` is absent.
 */
export const fromConfig = Effect.fnUntraced(function* (config: TokenizerConfig, modelDir?: string) {
  const chatTemplate = yield* resolveTemplate(config.chat_template)
  const spec = config.path ?? (config.kind === "hf" ? modelDir : undefined)
  // a directory, or org/name[@revision] from the Hugging Face cache
  const dir =
    spec === undefined
      ? undefined
      : yield* Effect.try({
          try: () => HfCache.resolve(spec),
          catch: (cause) =>
            new TokenizerError({
              reason: "NotFound",
              path: spec,
              message: cause instanceof Error ? cause.message : String(cause)
            })
        })
  if (dir === undefined) {
    if (config.kind === "hf") {
      return yield* new TokenizerError({
        reason: "NotFound",
        message: "tokenizer.kind is hf but neither tokenizer.path nor a model directory is given"
      })
    }
    return yield* Effect.try({
      try: () => ByteTokenizer.make(chatTemplate === undefined ? {} : { chatTemplate }),
      catch: toError("tokenizer")
    })
  }
  return yield* load(dir, chatTemplate === undefined ? {} : { chatTemplate })
})

export const layer = (
  config: TokenizerConfig,
  modelDir?: string
): Layer.Layer<Tokenizer, TokenizerError, FileSystem.FileSystem> =>
  Layer.effect(Tokenizer, Effect.map(fromConfig(config, modelDir), fromImpl))
