/**
 * One live connection to one server: an SDK client over a fresh transport (a spawned process for stdio, a session for
 * Streamable HTTP), opened as a unit (handshake, OAuth rounds, every page of `tools/list`) and closed as a unit. A
 * restart opens a new one; the connection policy (Connection.ts) decides when.
 */

import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import { ElicitRequestSchema, type Tool } from "@modelcontextprotocol/sdk/types.js"
import { Effect } from "effect"
import type { McpServerConfig } from "../config/EnvironmentConfig.ts"
import type { HeadlessOAuthProvider } from "./Auth.ts"
import { connectReason, describeCause, McpConnectError, redactUrl } from "./Errors.ts"
import { ChildStdioTransport } from "./StdioTransport.ts"

export interface Live {
  readonly client: Client
  readonly transport: Transport
  closed: boolean
  /** tools/call requests sent on this connection and not settled yet. */
  inFlight: number
  /** `inFlight` when the connection closed: the calls a crash took down together. */
  suspects: number
}

export interface LiveOptions {
  readonly elicitation: "accept_defaults" | undefined
  /** Made on the server's first connect and kept across reconnects: tokens outlive a session. */
  readonly oauth: HeadlessOAuthProvider | undefined
  readonly onStderr: (line: string) => void
  /** `notifications/tools/list_changed`: the SDK re-listed. */
  readonly onToolsChanged: (tools: ReadonlyArray<Tool>) => void
}

const clientInfo = { name: "effect-rl", version: "0.1.0" }

export const connectError = (config: McpServerConfig, reason: McpConnectError["reason"], cause: unknown) =>
  new McpConnectError({
    server: config.name,
    reason,
    message: `MCP server ${config.name} (${config.transport === "stdio" ? config.command : redactUrl(config.url ?? "")}): ${describeCause(cause)}`,
    cause
  })

/** Ends the HTTP session, then closes the client and its transport (for stdio: the process group). */
export const close = (l: Live) =>
  Effect.promise(async () => {
    l.closed = true
    if (l.transport instanceof StreamableHTTPClientTransport) {
      await l.transport.terminateSession().catch(() => undefined)
    }
    await l.client.close().catch(() => undefined)
  })

/** A client and transport for `config`, not yet connected. */
const make = (config: McpServerConfig, options: LiveOptions): Live => {
  const transport: Transport =
    config.transport === "stdio"
      ? new ChildStdioTransport(config, options.onStderr)
      : new StreamableHTTPClientTransport(new URL(config.url ?? ""), {
          requestInit: { headers: { ...config.headers } },
          ...(options.oauth === undefined ? {} : { authProvider: options.oauth })
        })
  const client = new Client(clientInfo, {
    capabilities: options.elicitation === "accept_defaults" ? { elicitation: { form: { applyDefaults: true } } } : {},
    // notifications/tools/list_changed: the SDK re-lists; the cache follows
    listChanged: {
      tools: {
        onChanged: (error, list) => {
          if (error === null && list !== null) options.onToolsChanged(list)
        }
      }
    }
  })
  if (options.elicitation === "accept_defaults") {
    client.setRequestHandler(ElicitRequestSchema, () => ({ action: "accept", content: {} }))
  }
  const next: Live = { client, transport, closed: false, inFlight: 0, suspects: 0 }
  // the SDK calls this before it fails the pending requests: they read how many went down together
  client.onclose = () => {
    next.closed = true
    next.suspects = next.inFlight
  }
  return next
}

/** Opens a connection to `config` and lists its tools; on failure nothing is left open. */
export const open = (
  config: McpServerConfig,
  options: LiveOptions
): Effect.Effect<{ readonly live: Live; readonly tools: ReadonlyArray<Tool> }, McpConnectError> =>
  Effect.gen(function* () {
    // starting a process (Node, imports) can take longer than a tool call may: give the handshake at least 15 s
    const connectTimeoutMs = Math.max(config.timeout_ms, 15_000)
    const oauth = options.oauth
    let next = make(config, options)
    // OAuth: a 401 sends the SDK through discovery and registration to the authorization URL; its redirect gives a
    // code, exchanged for tokens (finishAuth); then connect again with a fresh transport. A few rounds at most.
    for (let round = 0; ; round++) {
      const current = next
      const attempt = yield* Effect.result(
        Effect.tryPromise({
          try: () => current.client.connect(current.transport, { timeout: connectTimeoutMs }),
          catch: (cause) => cause
        })
      )
      if (attempt._tag === "Success") break
      const code = oauth?.takeCode()
      if (attempt.failure instanceof UnauthorizedError && code !== undefined && round < 3) {
        yield* Effect.tryPromise({
          try: () => (current.transport as StreamableHTTPClientTransport).finishAuth(code),
          catch: (cause) => connectError(config, "Unauthorized", cause)
        }).pipe(Effect.onError(() => close(current)))
        yield* close(current)
        next = make(config, options)
        continue
      }
      yield* close(current)
      return yield* connectError(config, connectReason(attempt.failure), attempt.failure)
    }
    const connected = next
    const listPage = (cursor: string | undefined) =>
      Effect.tryPromise({
        try: () => connected.client.listTools(cursor === undefined ? {} : { cursor }, { timeout: connectTimeoutMs }),
        catch: (cause) => cause
      })
    const listed: Array<Tool> = []
    let cursor: string | undefined
    for (let round = 0; ; ) {
      const page = yield* Effect.result(listPage(cursor))
      if (page._tag === "Success") {
        listed.push(...page.success.tools)
        cursor = page.success.nextCursor
        if (cursor === undefined) break
        continue
      }
      // a server may let `initialize` through and ask for a token on tools/list: authorize, then list again
      const code = oauth?.takeCode()
      if (page.failure instanceof UnauthorizedError && code !== undefined && round++ < 3) {
        yield* Effect.tryPromise({
          try: () => (connected.transport as StreamableHTTPClientTransport).finishAuth(code),
          catch: (cause) => connectError(config, "Unauthorized", cause)
        }).pipe(Effect.onError(() => close(connected)))
        continue
      }
      yield* close(connected)
      return yield* connectError(
        config,
        page.failure instanceof UnauthorizedError ? "Unauthorized" : "ListTools",
        page.failure
      )
    }
    return { live: connected, tools: listed }
  })
