/**
 * McpClient: the one seam between effect-rl and MCP servers. Only src/mcp/ imports the MCP SDK's client side (a lint
 * rule holds every other file of src/ to that); this service owns the servers' lifetimes, and every SDK failure
 * leaves it as a typed error (Errors.ts).
 *
 * - Transports: stdio (StdioTransport.ts: we spawn the server ourselves, in its own process group, with an explicit
 *   environment) and Streamable HTTP (`url` + `headers`, or `oauth`: a headless OAuth client for pre-approved
 *   clients, Auth.ts). An HTTP session the server forgot is reopened.
 * - `tools/list` is fetched on connect and cached; a restart or a `tools/list_changed` notification re-lists.
 *   `allowed_tools` filters by the server's own names. With several servers mounted, tools are `server__tool`.
 * - Isolation: a `shared` server is one connection for every trajectory; a `per_trajectory` server gets a fresh
 *   connection (a fresh process for stdio) per `session`, closed with the session's scope.
 * - Each server's connection (Connection.ts) restarts a dead server, times and caps every call, and sends failed
 *   calls again under the retry rule (Retry.ts).
 */

import type { Tool } from "@modelcontextprotocol/sdk/types.js"
import { Context, Effect, Layer, type Scope } from "effect"
import type { EnvironmentConfig, McpServerConfig } from "../config/EnvironmentConfig.ts"
import { CallCancel } from "./CallCancel.ts"
import * as Connection from "./Connection.ts"
import { McpConnectError, ToolCallError } from "./Errors.ts"
import { backoff } from "./Retry.ts"
import type { McpSession, McpTool, ToolResult } from "./Types.ts"

// the service's errors and data, so that `McpClient.ToolCallError` and `McpClient.McpTool` name them
export { McpConnectError, ToolCallError, ToolCallErrorReason } from "./Errors.ts"
export type { McpSession, McpTool, ToolResult } from "./Types.ts"

export class McpClient extends Context.Service<
  McpClient,
  {
    readonly servers: ReadonlyArray<string>
    /** Every mounted tool, allow-listed and namespaced; from the cache, re-listed after a restart. */
    readonly tools: Effect.Effect<ReadonlyArray<McpTool>>
    /** A call on the client's own session (shared servers + one default instance of each per-trajectory server). */
    readonly call: (name: string, args: Readonly<Record<string, unknown>>) => Effect.Effect<ToolResult, ToolCallError>
    /** A session for one trajectory: per-trajectory servers get fresh connections, closed with the scope. */
    readonly session: Effect.Effect<McpSession, never, Scope.Scope>
    /** Counters over all connections: `mcp/calls`, `mcp/errors`, `mcp/retries`, `mcp/restarts`, `mcp/connects`. */
    readonly stats: Effect.Effect<Record<string, number>>
    /** pids of every stdio server process alive now. */
    readonly processIds: Effect.Effect<ReadonlyArray<number>>
  }
>()("rl/mcp/McpClient") {}

export interface McpClientOptions {
  readonly servers: ReadonlyArray<McpServerConfig>
  readonly maxResultChars?: number // default 4096
  readonly retries?: number // default 2
  /**
   * What to answer a server's `elicitation/create` (a question for the user; nobody is there in a rollout).
   * "accept_defaults": accept with the schema's default values (SEP-1034). Absent: the client declares no
   * elicitation capability, so servers must not ask.
   */
  readonly elicitation?: "accept_defaults"
}

// ---- the client -------------------------------------------------------------------------------------------------

const toMcpTool =
  (config: McpServerConfig, namespaced: boolean) =>
  (tool: Tool): McpTool => ({
    name: namespaced ? `${config.name}__${tool.name}` : tool.name,
    server: config.name,
    remoteName: tool.name,
    description: tool.description ?? "",
    inputSchema: tool.inputSchema as Record<string, unknown>,
    readOnly: tool.annotations?.readOnlyHint === true,
    idempotent: tool.annotations?.idempotentHint === true
  })

const mountedTools = (connections: ReadonlyArray<Connection.Connection>, namespaced: boolean): ReadonlyArray<McpTool> =>
  connections.flatMap((c) =>
    c
      .tools()
      .filter((t) => c.config.allowed_tools === undefined || c.config.allowed_tools.includes(t.name))
      .map(toMcpTool(c.config, namespaced))
  )

const makeSession = (connections: ReadonlyArray<Connection.Connection>, namespaced: boolean): McpSession => {
  // the mounted list changes only when a server re-lists (after a restart): recompute then, not per call
  let listed: ReadonlyArray<ReadonlyArray<Tool>> = []
  let mounted: ReadonlyArray<McpTool> = []
  let byName = new Map<string, { readonly tool: McpTool; readonly connection: Connection.Connection }>()
  const current = () => {
    let changed = listed.length !== connections.length
    for (let i = 0; i < connections.length && !changed; i++) changed = connections[i]!.tools() !== listed[i]
    if (changed) {
      listed = connections.map((c) => c.tools())
      mounted = mountedTools(connections, namespaced)
      byName = new Map()
      for (const tool of mounted) {
        if (byName.has(tool.name)) continue // the first of a name answers, as a search would
        byName.set(tool.name, { tool, connection: connections.find((c) => c.config.name === tool.server)! })
      }
    }
    return mounted
  }
  // one Effect primitive per call: the lookup runs when the call starts (a restart may have re-listed the tools)
  const call = (name: string, args: Readonly<Record<string, unknown>>) =>
    Effect.callback<ToolResult, ToolCallError>((resume) => {
      const tools = current()
      const found = byName.get(name)
      if (found === undefined) {
        const server = namespaced ? (name.split("__")[0] ?? "") : (connections[0]?.config.name ?? "")
        return resume(
          Effect.fail(
            new ToolCallError({
              tool: name,
              server,
              reason: "UnknownTool",
              message: `unknown tool ${name}; available: ${tools.map((t) => t.name).join(", ")}`
            })
          )
        )
      }
      const cancel = new CallCancel()
      found.connection.start(found.tool.remoteName, args, resume, cancel)
      return Effect.sync(() => cancel.abort(new Error("interrupted")))
    })
  return {
    get tools() {
      return current()
    },
    call,
    processIds: Effect.sync(() => connections.flatMap((c) => c.pid() ?? []))
  }
}

/**
 * Connects every configured server (eagerly: a bad command fails here, not at the first rollout) and lists tools.
 * The scope owns every process and connection.
 */
export const make = Effect.fn("McpClient.make")(function* (options: McpClientOptions) {
  const names = new Set<string>()
  for (const s of options.servers) {
    if (names.has(s.name)) {
      return yield* new McpConnectError({ server: s.name, reason: "Spawn", message: `duplicate MCP server ${s.name}` })
    }
    names.add(s.name)
  }
  const counters: Connection.Counters = { calls: 0, errors: 0, retries: 0, restarts: 0, connects: 0 }
  const connOptions = {
    maxResultChars: options.maxResultChars ?? 4096,
    retries: options.retries ?? 2,
    counters,
    elicitation: options.elicitation
  }
  const namespaced = options.servers.length > 1
  const defaults = yield* Effect.forEach(
    options.servers,
    (config) =>
      Effect.gen(function* () {
        const { connection, ensure } = yield* Connection.make(config, connOptions)
        yield* ensure.pipe(Effect.retry({ schedule: backoff, times: connOptions.retries }))
        return connection
      }),
    { concurrency: "unbounded" }
  )
  const own = makeSession(defaults, namespaced)
  const sessionPids = new Set<() => Effect.Effect<ReadonlyArray<number>>>()

  const session: Effect.Effect<McpSession, never, Scope.Scope> = Effect.gen(function* () {
    const connections = yield* Effect.forEach(defaults, (c) =>
      c.config.isolation === "shared"
        ? Effect.succeed(c)
        : Connection.make(c.config, connOptions, c.tools()).pipe(Effect.map((x) => x.connection))
    )
    const s = makeSession(connections, namespaced)
    const pids = () => s.processIds
    sessionPids.add(pids)
    yield* Effect.addFinalizer(() => Effect.sync(() => sessionPids.delete(pids)))
    return s
  })

  return McpClient.of({
    servers: options.servers.map((s) => s.name),
    tools: Effect.sync(() => own.tools),
    call: own.call,
    session,
    stats: Effect.sync(() => ({
      "mcp/calls": counters.calls,
      "mcp/errors": counters.errors,
      "mcp/retries": counters.retries,
      "mcp/restarts": counters.restarts,
      "mcp/connects": counters.connects
    })),
    processIds: Effect.gen(function* () {
      const mine = yield* own.processIds
      const others = yield* Effect.forEach([...sessionPids], (f) => f())
      return [...new Set([...mine, ...others.flat()])]
    })
  })
})

export const layer = (options: McpClientOptions): Layer.Layer<McpClient, McpConnectError> =>
  Layer.effect(McpClient, make(options))

/** The client an `environment` config section describes. */
export const layerFromConfig = (env: EnvironmentConfig): Layer.Layer<McpClient, McpConnectError> =>
  layer({ servers: env.mcp_servers, maxResultChars: env.max_result_chars, retries: env.retries })
