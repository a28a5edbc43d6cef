/**
 * The Tokenizer service: text ⇄ token ids, the special tokens the sampler stops on, and the model's chat template.
 *
 * Two layers of API:
 * - `TokenizerImpl`, a plain object whose methods are synchronous. The generator encodes and decodes every turn, so
 *   the hot path never goes through an Effect. Methods that can fail (chat-template rendering) throw a
 *   `TokenizerError` / `ChatTemplatePrefixError`; encode/decode/tokenToId never throw.
 * - `Tokenizer`, the service: the same sync members plus Effect-returning wrappers for everything that can fail.
 *
 * Implementations: ByteTokenizer.ts (one id per UTF-8 byte, for the tiny models we train), HfTokenizer.ts
 * (tokenizer.json through @huggingface/tokenizers). AutoTokenizer.ts loads either from a checkpoint directory.
 */
import { Context, Effect, Layer } from "effect"
import type { Message } from "../domain/Message.ts"
import * as ChatTemplate from "./ChatTemplate.ts"
import { ChatTemplatePrefixError, TokenizerError } from "./TokenizerErrors.ts"

// the service's errors, defined below ChatTemplate.ts (which throws them) so that neither module imports the other
export { ChatTemplatePrefixError, TokenizerError } from "./TokenizerErrors.ts"

export interface EncodeOptions {
  /** add the tokenizer's own bos/eos decoration (its post-processor); default false, as chat templates write them */
  readonly addSpecialTokens?: boolean
}

export interface DecodeOptions {
  /** drop control tokens (`special: true` in added_tokens, such as `<|im_end|>`); markup such as `<tool_call>` stays */
  readonly skipSpecialTokens?: boolean
}

/** One token added on top of the base vocabulary (the `added_tokens` entries of tokenizer.json). */
export interface AddedToken {
  readonly id: number
  readonly content: string
  /** control token: skipped by `skipSpecialTokens` */
  readonly special: boolean
}

/** The tokenizer as HF files, written into a checkpoint directory so that it describes itself. */
export interface HfFiles {
  readonly "tokenizer.json": unknown
  readonly "tokenizer_config.json": unknown
}

export interface TokenizerImpl {
  readonly kind: "byte" | "hf"
  /** number of ids the tokenizer can produce (highest id + 1); a model's embedding may be larger */
  readonly vocabSize: number
  readonly bosId?: number
  /** every end-of-turn / end-of-text id the sampler stops on */
  readonly eosIds: ReadonlyArray<number>
  readonly padId: number
  readonly addedTokens: ReadonlyArray<AddedToken>
  readonly chatTemplate: string
  readonly encode: (text: string, options?: EncodeOptions) => Array<number>
  /** ids the tokenizer does not know (a padded embedding's extra rows) decode to nothing */
  readonly decode: (ids: ReadonlyArray<number>, options?: DecodeOptions) => string
  readonly tokenToId: (token: string) => number | undefined
  readonly idToToken: (id: number) => string | undefined
  /** @throws TokenizerError (reason `Template`) when the template fails or calls `raise_exception` */
  readonly applyChatTemplate: (messages: ReadonlyArray<Message>, options: ChatTemplate.ChatTemplateOptions) => string
  /** `encode(applyChatTemplate(...))`; @throws TokenizerError */
  readonly applyChatTemplateIds: (
    messages: ReadonlyArray<Message>,
    options: ChatTemplate.ChatTemplateOptions
  ) => Array<number>
  readonly hfFiles: () => HfFiles
}

/**
 * Token names that end a turn or the text in the model families we load. A loaded tokenizer stops on its
 * `eos_token`, on `generation_config.json`'s `eos_token_id` when the directory has one, and on every one of these
 * that it has as a special token (Qwen's generation config stops on both `<|im_end|>` and `<|endoftext|>`).
 */
export const endOfTurnTokens: ReadonlyArray<string> = [
  "<|im_end|>",
  "<|endoftext|>",
  "<|eot_id|>",
  "<|end_of_text|>",
  "<|eom_id|>",
  "<end_of_turn>",
  "<|end|>",
  "<|return|>",
  "</s>"
]

export class Tokenizer extends Context.Service<
  Tokenizer,
  {
    readonly impl: TokenizerImpl
    readonly vocabSize: number
    readonly bosId?: number
    readonly eosIds: ReadonlyArray<number>
    readonly padId: number
    readonly encode: (text: string, options?: EncodeOptions) => Array<number>
    readonly decode: (ids: ReadonlyArray<number>, options?: DecodeOptions) => string
    readonly tokenToId: (token: string) => number | undefined
    readonly applyChatTemplate: (
      messages: ReadonlyArray<Message>,
      options: ChatTemplate.ChatTemplateOptions
    ) => Effect.Effect<string, TokenizerError>
    readonly applyChatTemplateIds: (
      messages: ReadonlyArray<Message>,
      options: ChatTemplate.ChatTemplateOptions
    ) => Effect.Effect<Array<number>, TokenizerError>
    /** see `ChatTemplate.continuation` */
    readonly continuation: (
      history: ReadonlyArray<Message>,
      messages: ReadonlyArray<Message>,
      options: ChatTemplate.ChatTemplateOptions,
      continuationOptions?: ChatTemplate.ContinuationOptions
    ) => Effect.Effect<ChatTemplate.Continuation, TokenizerError | ChatTemplatePrefixError>
  }
>()("rl/tokenizer/Tokenizer") {}

/** Turns whatever a sync tokenizer method threw into its typed error (anything unexpected is a Template failure). */
export const toTokenizerError = (cause: unknown): TokenizerError =>
  cause instanceof TokenizerError
    ? cause
    : new TokenizerError({
        reason: "Template",
        message: cause instanceof Error ? cause.message : "chat template failed",
        cause
      })

/** Wraps a sync implementation as the service. */
export const fromImpl = (impl: TokenizerImpl): Tokenizer["Service"] =>
  Tokenizer.of({
    impl,
    vocabSize: impl.vocabSize,
    ...(impl.bosId === undefined ? {} : { bosId: impl.bosId }),
    eosIds: impl.eosIds,
    padId: impl.padId,
    encode: impl.encode,
    decode: impl.decode,
    tokenToId: impl.tokenToId,
    applyChatTemplate: (messages, options) =>
      Effect.try({ try: () => impl.applyChatTemplate(messages, options), catch: toTokenizerError }),
    applyChatTemplateIds: (messages, options) =>
      Effect.try({ try: () => impl.applyChatTemplateIds(messages, options), catch: toTokenizerError }),
    continuation: (history, messages, options, continuationOptions) =>
      Effect.try({
        try: () => ChatTemplate.continuation(impl, history, messages, options, continuationOptions),
        catch: (cause) => (cause instanceof ChatTemplatePrefixError ? cause : toTokenizerError(cause))
      })
  })

/** The service over an already-built implementation, for callers that built or loaded it themselves. */
export const layerImpl = (impl: TokenizerImpl): Layer.Layer<Tokenizer> => Layer.succeed(Tokenizer, fromImpl(impl))
