import { Schema } from "effect"
import { withDefault } from "./Field.ts"

/**
 * `byte`: one token per byte plus named special tokens (the tiny models we train). `hf`: tokenizer.json +
 * tokenizer_config.json from `path` (default: the model directory). `chat_template` overrides the model's template.
 */
export const TokenizerConfig = Schema.Struct({
  kind: Schema.Literals(["byte", "hf"]).pipe(withDefault("hf")), // byte or hf, as above
  path: Schema.optionalKey(Schema.NonEmptyString), // default: the model directory
  chat_template: Schema.optionalKey(Schema.NonEmptyString) // a Jinja template, inline or a file's path
})
export type TokenizerConfig = typeof TokenizerConfig.Type
