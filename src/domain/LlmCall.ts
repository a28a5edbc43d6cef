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

/**
 * How an LLM judge scored one group (`reward_spec.method: judge`), kept with the group in the episode log: the
 * scores it paid, every call it made (the replay source), the answers it rejected, and what the calls cost.
 */
export const GroupJudgement = Schema.Struct({
  model: Schema.String,
  scores: Schema.Array(Schema.Finite), // one per trajectory, in sample order: what each trajectory was paid
  calls: Schema.Array(LlmCallRecord), // in call order; empty on a cache hit
  cacheHit: Schema.Boolean,
  malformed: Schema.Int, // answers that were not the JSON asked for
  outOfRange: Schema.Int, // answers with a score outside [0, 1] (or not a number)
  missing: Schema.Int, // answers missing a trajectory or scoring one that does not exist
  // set when no valid answer came within the attempts (or the endpoint failed): the scores are the fallback
  failed: Schema.optionalKey(Schema.String),
  promptTokens: Schema.Int,
  completionTokens: Schema.Int,
  cost: Schema.Finite
})
export type GroupJudgement = typeof GroupJudgement.Type
