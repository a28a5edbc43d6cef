/**
 * The tokenizer's typed errors, at the bottom of tokenizer/: Tokenizer.ts (the service, which re-exports them) and
 * ChatTemplate.ts (which throws them) both import this module, and it imports neither.
 */
import { Schema } from "effect"

/** Loading or rendering failed. `path` is the file (or directory) involved, when there is one. */
export class TokenizerError extends Schema.TaggedError<TokenizerError>()("TokenizerError", {
  reason: Schema.Literals(["NotFound", "BadFile", "Unsupported", "Template"]),
  path: Schema.optionalKey(Schema.String),
  message: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {}

/**
 * The incremental chat-template path (`ChatTemplate.continuation`) cannot append tokens to an already-rendered
 * conversation token-exactly. The caller falls back to step-wise mode (re-render the whole conversation).
 * - `HistoryRewritten`: rendering [history + new] does not start with rendering [history]: the template renders an
 *   earlier turn differently once more turns follow (Qwen3 drops or adds `<think>` blocks, for example).
 * - `NoEndOfTurn`: the rendered history does not end with an end-of-turn (eos) token and whitespace, so the place
 *   where the policy's sampled ids stopped cannot be found in the rendered text.
 * - `UnsafeBoundary`: the appended text does not start at a special token, so encoding it on its own might merge
 *   differently than encoding the whole conversation.
 */
export class ChatTemplatePrefixError extends Schema.TaggedError<ChatTemplatePrefixError>()("ChatTemplatePrefixError", {
  reason: Schema.Literals(["HistoryRewritten", "NoEndOfTurn", "UnsafeBoundary"]),
  /** character offset in the rendered history where the problem is */
  offset: Schema.Int,
  message: Schema.String
}) {}
