/**
 * A tool call as the environment executes it (parsed from model text or received from a remote engine), and the
 * record of one executed call with its raw I/O, which the episode log keeps so a rollout can be replayed.
 */
import { Schema } from "effect"

export const ToolCall = Schema.Struct({
  id: Schema.String,
  name: Schema.String, // may be namespaced `server__tool` when several MCP servers are mounted
  arguments: Schema.Record(Schema.String, Schema.Unknown)
})
export type ToolCall = typeof ToolCall.Type

/** One executed call: what went in, what came out, how long it took. */
export const ToolCallRecord = Schema.Struct({
  id: Schema.String,
  server: Schema.optionalKey(Schema.String),
  tool: Schema.String,
  arguments: Schema.Unknown,
  result: Schema.String, // the text the model was shown
  isError: Schema.Boolean,
  ms: Schema.Finite
})
export type ToolCallRecord = typeof ToolCallRecord.Type
