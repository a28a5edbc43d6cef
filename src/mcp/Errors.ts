/**
 * The MCP seam's errors, and how the SDK's failures map to them. Nothing the SDK throws leaves src/mcp/ as itself:
 * a server that cannot be started, reached or listed is an `McpConnectError`, a failed tool call a `ToolCallError`,
 * each with a reason its caller acts on.
 */

import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js"
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js"
import { Schema } from "effect"

/** A server could not be started, reached, initialised or listed. */
export class McpConnectError extends Schema.TaggedError<McpConnectError>()("McpConnectError", {
  server: Schema.String,
  reason: Schema.Literals(["Spawn", "Unreachable", "Handshake", "ListTools", "Unauthorized"]),
  message: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {}

export const ToolCallErrorReason = Schema.Literals([
  "UnknownTool",
  "BadArguments",
  "ToolFailed",
  "Timeout",
  "Disconnected",
  "ServerError"
])
export type ToolCallErrorReason = typeof ToolCallErrorReason.Type

/**
 * One tool call failed. `ToolFailed` is the tool's own `isError` result (its text is `message`); `BadArguments` and
 * `UnknownTool` are the caller's fault; `Timeout` and `Disconnected` are transport failures and retryable.
 */
export class ToolCallError extends Schema.TaggedError<ToolCallError>()("ToolCallError", {
  tool: Schema.String,
  server: Schema.String,
  reason: ToolCallErrorReason,
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return this.reason === "Timeout" || this.reason === "Disconnected"
  }
}

/** The write was refused before anything reached the server: safe to send again. */
export class NotDelivered extends Error {}

/** A URL without credentials or query (tokens hide there): what error messages may show. */
export const redactUrl = (url: string): string => {
  try {
    const u = new URL(url)
    return `${u.protocol}//${u.host}${u.pathname}`
  } catch {
    return "<invalid url>"
  }
}

export const describeCause = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

/** The request certainly never reached the server: the process was gone, or the connection refused. */
export const isRefused = (cause: unknown): boolean => {
  if (cause instanceof NotDelivered) return true
  if (cause instanceof Error && cause.message === "Not connected") return true
  const code = (cause as { cause?: { code?: string } } | undefined)?.cause?.code
  return code === "ECONNREFUSED"
}

/** Maps whatever the SDK threw for a `tools/call` to a reason. Timeouts and cancellations share -32001. */
export const classify = (cause: unknown): ToolCallErrorReason => {
  if (cause instanceof McpError) {
    if (cause.code === ErrorCode.RequestTimeout) return "Timeout"
    if (cause.code === ErrorCode.ConnectionClosed) return "Disconnected"
    if (cause.code === ErrorCode.InvalidParams) {
      if (/output schema|structured content|Invalid tools\/call result/i.test(cause.message)) return "ServerError"
      return /Tool \S+ (not found|disabled)/.test(cause.message) ? "UnknownTool" : "BadArguments"
    }
    return "ServerError"
  }
  if (isRefused(cause)) return "Disconnected"
  if (cause instanceof TypeError && /fetch failed/.test(cause.message)) return "Disconnected"
  return "ServerError"
}

/** An `isError` result's reason: the SDK server reports unknown tools and schema failures as text. */
export const classifyErrorText = (text: string): ToolCallErrorReason => {
  if (!text.startsWith("MCP error -32602: ")) return "ToolFailed"
  if (/^MCP error -32602: Tool \S+ (not found|disabled)/.test(text)) return "UnknownTool"
  // the server's own result failed its validation: not the caller's fault
  if (/Invalid tools\/call result|output schema/.test(text)) return "ServerError"
  return "BadArguments"
}

/** Maps whatever connecting threw to a reason. */
export const connectReason = (cause: unknown): McpConnectError["reason"] =>
  (cause as { code?: string }).code === "ENOENT" || (cause as { code?: string }).code === "EACCES"
    ? "Spawn"
    : cause instanceof UnauthorizedError
      ? "Unauthorized"
      : isRefused(cause) || cause instanceof TypeError
        ? "Unreachable"
        : "Handshake"
