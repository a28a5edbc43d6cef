/**
 * The bundled toolbox MCP server: deterministic tools that multi-step tasks need (arithmetic, a record store with
 * chained lookups, unit conversion, date arithmetic). Outputs are short plain text, because tiny policies read them.
 * A tool that cannot answer returns an MCP `isError` result with a one-line reason ("division by zero"), never a
 * protocol error, so the policy sees it as an observation. `latencyMs` delays every call, to simulate slow tools; with
 * `latencyMaxMs` too, each call waits a uniformly random time in [latencyMs, latencyMaxMs].
 *
 * This file and `server.ts` import the MCP SDK's server side; the client side lives only in `src/env/McpClient.ts`.
 */

import { setTimeout as sleep } from "node:timers/promises"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js"
import * as z from "zod"
import * as Tools from "./Tools.ts"

export interface ToolboxOptions {
  readonly latencyMs?: number
  /** The upper end of a random per-call latency (uniform in [latencyMs, latencyMaxMs]); default latencyMs. */
  readonly latencyMaxMs?: number
}

/** `"50"` → [50, 50]; `"50-200"` → [50, 200]; undefined for anything else (negative, reversed, not a number). */
export const parseLatency = (text: string): readonly [number, number] | undefined => {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(?:-\s*(\d+(?:\.\d+)?)\s*)?$/.exec(text)
  if (m === null) return undefined
  const min = Number(m[1])
  const max = m[2] === undefined ? min : Number(m[2])
  return max >= min ? [min, max] : undefined
}

// ---- the server -------------------------------------------------------------------------------------------------

const readOnly = { readOnlyHint: true, idempotentHint: true, openWorldHint: false } as const

/** A parameter as the zod shape the MCP SDK lists as its JSON schema. */
const zodOf = (p: Tools.Param) => {
  const base = p.type === "number" ? z.number() : z.string()
  return p.description === undefined ? base : base.describe(p.description)
}

/** Builds a fresh toolbox server (one per connection in HTTP mode), serving every tool of Tools.ts. */
export const make = (options: ToolboxOptions = {}): McpServer => {
  const latencyMs = options.latencyMs ?? 0
  const latencyMaxMs = Math.max(latencyMs, options.latencyMaxMs ?? latencyMs)
  const server = new McpServer({ name: "effect-rl-toolbox", version: "0.1.0" })
  for (const tool of Tools.tools) {
    const inputSchema = Object.fromEntries(Object.entries(tool.params).map(([key, p]) => [key, zodOf(p)]))
    server.registerTool(
      tool.name,
      { description: tool.description, inputSchema, annotations: readOnly },
      // the SDK's callback type is generic over zod v3 and v4 shapes; `args` is validated against inputSchema
      (async (args: Record<string, unknown>): Promise<CallToolResult> => {
        const delay = latencyMs + Math.random() * (latencyMaxMs - latencyMs)
        if (delay > 0) await sleep(delay)
        const { text, isError } = Tools.call(tool.name, args)
        return isError ? { content: [{ type: "text", text }], isError: true } : { content: [{ type: "text", text }] }
      }) as never
    )
  }
  return server
}
