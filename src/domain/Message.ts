/**
 * Chat messages in the OpenAI / SkyRL dataset shape. A dataset row's `prompt` is an array of these; environments
 * answer with them; chat templates render them. Tool calls on an assistant message use the OpenAI wire form
 * (`function.arguments` is a JSON string), because that is what datasets and remote engines carry.
 */
import { Schema } from "effect"

export const Role = Schema.Literals(["system", "user", "assistant", "tool"])
export type Role = typeof Role.Type

/** OpenAI wire form of one tool call on an assistant message. */
export const ToolCallWire = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("function"),
  function: Schema.Struct({
    name: Schema.String,
    arguments: Schema.String // JSON text, exactly as the model or the dataset wrote it
  })
})
export type ToolCallWire = typeof ToolCallWire.Type

export const Message = Schema.Struct({
  role: Role,
  content: Schema.String,
  tool_calls: Schema.optionalKey(Schema.Array(ToolCallWire)),
  tool_call_id: Schema.optionalKey(Schema.String),
  name: Schema.optionalKey(Schema.String)
})
export type Message = typeof Message.Type

export const system = (content: string): Message => ({ role: "system", content })
export const user = (content: string): Message => ({ role: "user", content })
export const assistant = (content: string): Message => ({ role: "assistant", content })
export const tool = (content: string, toolCallId?: string): Message =>
  toolCallId === undefined ? { role: "tool", content } : { role: "tool", content, tool_call_id: toolCallId }
