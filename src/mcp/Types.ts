/**
 * What the MCP seam hands out: tools as the model sees them, call results, and the per-trajectory session.
 */

import type { Effect } from "effect"
import type { ToolCallError } from "./Errors.ts"

/** A tool as the model sees it. `name` is what the model calls (namespaced when several servers are mounted). */
export interface McpTool {
  readonly name: string
  readonly server: string
  readonly remoteName: string // the name on its own server
  readonly description: string
  readonly inputSchema: Readonly<Record<string, unknown>>
  readonly readOnly: boolean // annotations.readOnlyHint
  readonly idempotent: boolean // annotations.idempotentHint
}

/** A successful call: the text the model is shown (capped), and structured content when the server sent some. */
export interface ToolResult {
  readonly server: string
  readonly text: string
  readonly truncated: boolean
  readonly structured?: unknown
}

/** The tools of one trajectory: shared servers plus this session's own per-trajectory servers. */
export interface McpSession {
  readonly tools: ReadonlyArray<McpTool>
  readonly call: (name: string, args: Readonly<Record<string, unknown>>) => Effect.Effect<ToolResult, ToolCallError>
  /** pids of the stdio servers this session started (empty until a per-trajectory server was first called). */
  readonly processIds: Effect.Effect<ReadonlyArray<number>>
}
