/**
 * The record one call to an OpenAI-compatible chat endpoint leaves (a judge's verdict, a generated task), kept where
 * the run keeps its other raw I/O so that replay can answer the same request without the endpoint.
 *
 * `request` is the body as sent minus what depends on where it went (no URL, no key): model, messages,
 * response_format and the sampling fields. Its canonical JSON (keys sorted) is the replay key.
 */
import { Schema } from "effect"

export const LlmCallRecord = Schema.Struct({
  request: Schema.Unknown,
  content: Schema.String, // choices[0].message.content as answered
  finishReason: Schema.String,
  promptTokens: Schema.Int, // usage.prompt_tokens (0 when the endpoint reports no usage)
  completionTokens: Schema.Int,
  ms: Schema.Finite // wall time of the call, retries included
})
export type LlmCallRecord = typeof LlmCallRecord.Type
