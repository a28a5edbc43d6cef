/**
 * McpClient: the one seam between effect-rl and MCP servers (the only file importing the MCP SDK's client side).
 * It owns the servers' lifetimes and translates every SDK failure into a typed error.
 *
 * - Transports: stdio (we spawn the server ourselves, in its own process group, with an explicit environment: the
 *   config's `env` plus PATH and HOME, nothing else inherited) and Streamable HTTP (`url` + `headers`, or `oauth`:
 *   a headless OAuth client for pre-approved clients). An HTTP session the server forgot is reopened.
 * - `tools/list` is fetched on connect and cached; a restart or a `tools/list_changed` notification re-lists.
 *   `allowed_tools` filters by the server's own names. With several servers mounted, tools are `server__tool`.
 * - Isolation: a `shared` server is one connection for every trajectory; a `per_trajectory` server gets a fresh
 *   connection (a fresh process for stdio) per `session`, closed with the session's scope.
 * - Every call has a timeout (`timeout_ms`) and its result text is capped at `maxResultChars` (truncation is marked).
 * - A crashed stdio server is restarted on the next call; its stderr goes to the Effect logs at Debug level,
 *   annotated with `mcp_server`, and its last lines are logged as a warning when it dies.
 * - No orphans: closing the scope closes stdin, then SIGTERMs and SIGKILLs the process group; a process `exit`
 *   hook SIGKILLs every group still alive if the run ends without closing its scopes.
 *
 * Retry rule (never re-drive a stateful call twice): a failed call is sent again only when
 *   1. it certainly never reached the server (connecting or restarting failed, or the transport refused the write:
 *      process already gone, connection refused), or
 *   2. it failed with a retryable reason (Timeout, Disconnected) on a `shared` server and the server declared the tool
 *      `readOnlyHint` or `idempotentHint`, so a second delivery cannot change any state.
 * Everything else (a tool error, bad arguments, a timeout on a tool that may write) is returned to the caller once.
 *
 * `retries` counts a call's own failed deliveries, not its attempts:
 *   - A crash takes down every call in flight on the server, though at most one of them caused it: each of the N
 *     calls it took down is charged 1/N of a delivery. Without this, one crash spent a retry of every call in flight,
 *     and with a few concurrent callers a crashing server's disconnects reached the policy almost every time.
 *   - Calls re-driven after a crash go to the restarted server one at a time: sent all at once, the next crash would
 *     take them all down again, and a call that crashes the server on every delivery would never be told apart from
 *     the calls it takes down with it.
 *   - An attempt that never reached a server (the restart failed, e.g. the server died during the handshake) is not
 *     a delivery; at most `retries` of those in a row.
 * A call fails once more than `retries` deliveries are charged to it. Retries wait 25 ms, then 50 ms · 2^n (jittered,
 * at most 1 s); a call that succeeds first time never enters the retry machinery.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { type OAuthClientProvider, UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StreamableHTTPClientTransport, StreamableHTTPError } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import type {
  OAuthClientInformationMixed,
  OAuthClientMetadata,
  OAuthTokens
} from "@modelcontextprotocol/sdk/shared/auth.js"
import { serializeMessage } from "@modelcontextprotocol/sdk/shared/stdio.js"
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import {
  ElicitRequestSchema,
  ErrorCode,
  type JSONRPCMessage,
  McpError,
  type Tool
} from "@modelcontextprotocol/sdk/types.js"
import { Config, Context, Effect, Layer, Queue, Redacted, Schedule, Schema, Scope, Semaphore } from "effect"
import type { EnvironmentConfig, McpOAuthConfig, McpServerConfig } from "../config/EnvironmentConfig.ts"
import * as ProcessReaper from "../mcp/ProcessReaper.ts"

// ---- errors -----------------------------------------------------------------------------------------------------

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

// ---- data -------------------------------------------------------------------------------------------------------

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
>()("rl/env/McpClient") {}

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

// ---- result text ------------------------------------------------------------------------------------------------

type Content = { readonly type: string; readonly [key: string]: unknown }

const contentText = (item: Content): string => {
  switch (item.type) {
    case "text":
      return String(item["text"] ?? "")
    case "resource": {
      const r = item["resource"] as { uri?: string; text?: string } | undefined
      return r?.text ?? `[resource ${r?.uri ?? ""}]`
    }
    case "resource_link":
      return `[resource ${String(item["uri"] ?? "")}]`
    default:
      return `[${item.type}${item["mimeType"] === undefined ? "" : ` ${String(item["mimeType"])}`}]`
  }
}

/** The text a model is shown for a result: its content joined by newlines, else its structured content as JSON. */
export const resultText = (result: { readonly content?: unknown; readonly structuredContent?: unknown }): string => {
  const content = Array.isArray(result.content) ? (result.content as ReadonlyArray<Content>) : []
  if (content.length === 0 && result.structuredContent !== undefined) return JSON.stringify(result.structuredContent)
  return content.length === 1 ? contentText(content[0]!) : content.map(contentText).join("\n")
}

/** Caps `text` at `max` characters; the cut is marked so the model (and a reader) knows output is missing. */
export const truncate = (text: string, max: number): { readonly text: string; readonly truncated: boolean } =>
  text.length <= max
    ? { text, truncated: false }
    : { text: `${text.slice(0, max)}…[truncated ${text.length - max} chars]`, truncated: true }

// ---- stdio transport: our own spawn, for process groups and an explicit environment ------------------------------

const liveGroups = new Set<number>()
let exitHookInstalled = false
const installExitHook = () => {
  if (exitHookInstalled) return
  exitHookInstalled = true
  process.on("exit", () => {
    for (const pid of liveGroups) killGroup(pid, "SIGKILL")
  })
}
const killGroup = (pid: number, signal: NodeJS.Signals) => {
  try {
    process.kill(-pid, signal)
  } catch {
    // ESRCH: the group is already gone
  }
}

/**
 * Cancels one call: the part of `AbortSignal` that the SDK's `Protocol.request` reads (`throwIfAborted`, `aborted`,
 * `reason`, an `abort` listener, which sends `notifications/cancelled`). An `AbortController` per call, with the
 * listener the SDK adds to it, costs microseconds of EventTarget bookkeeping on every call (measured by the
 * mcp-latency bench); a cancelled call is rare. Interrupting the calling fiber aborts it.
 */
export class CallCancel {
  aborted = false
  reason: unknown = undefined
  private listener: (() => void) | undefined = undefined
  private more: Array<() => void> | undefined = undefined
  throwIfAborted(): void {
    if (this.aborted) throw this.reason
  }
  addEventListener(type: string, listener: () => void): void {
    if (type !== "abort") return
    if (this.listener === undefined) this.listener = listener
    else if (this.more === undefined) this.more = [listener]
    else this.more.push(listener)
  }
  removeEventListener(type: string, listener: () => void): void {
    if (type !== "abort") return
    if (this.listener === listener) this.listener = undefined
    else if (this.more !== undefined) this.more = this.more.filter((l) => l !== listener)
  }
  abort(reason: unknown): void {
    if (this.aborted) return
    this.aborted = true
    this.reason = reason
    this.listener?.()
    for (const l of this.more ?? []) l()
  }
  /** As the SDK's RequestOptions type it. */
  get signal(): AbortSignal {
    return this as unknown as AbortSignal
  }
}

/** The write was refused before anything reached the server: safe to send again. */
class NotDelivered extends Error {}

interface ExitInfo {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

class ChildStdioTransport implements Transport {
  onclose?: () => void
  onerror?: (error: Error) => void
  onmessage?: (message: JSONRPCMessage) => void
  child: ChildProcess | undefined
  exit: ExitInfo | undefined
  readonly command: string
  readonly args: ReadonlyArray<string>
  readonly env: Record<string, string>
  readonly cwd: string | undefined
  readonly onStderr: (line: string) => void
  stdoutRest = ""
  stderrRest = ""

  constructor(config: McpServerConfig, onStderr: (line: string) => void) {
    this.command = config.command === "node" ? process.execPath : (config.command ?? "")
    this.args = config.args
    const base: Record<string, string> = {}
    if (process.env["PATH"] !== undefined) base["PATH"] = process.env["PATH"]
    if (process.env["HOME"] !== undefined) base["HOME"] = process.env["HOME"]
    this.env = { ...base, ...config.env }
    this.cwd = config.cwd
    this.onStderr = onStderr
  }

  start(): Promise<void> {
    installExitHook()
    return new Promise((resolve, reject) => {
      const child = spawn(this.command, [...this.args], {
        env: this.env,
        ...(this.cwd === undefined ? {} : { cwd: this.cwd }),
        stdio: ["pipe", "pipe", "pipe"],
        detached: true // own process group: close() can kill the server and everything it started
      })
      this.child = child
      child.once("error", (error) => {
        reject(error)
        this.onerror?.(error)
      })
      child.once("spawn", () => {
        if (child.pid !== undefined) {
          liveGroups.add(child.pid)
          ProcessReaper.register(child.pid) // killed even if this process is SIGKILLed
        }
        resolve()
      })
      child.once("exit", (code, signal) => {
        this.exit = { code, signal }
        if (child.pid !== undefined) {
          liveGroups.delete(child.pid)
          killGroup(child.pid, "SIGKILL") // whatever the server left behind in its group
          ProcessReaper.forget(child.pid)
        }
      })
      child.once("close", () => this.onclose?.())
      child.stdout?.setEncoding("utf8") // a character split across chunks is decoded whole
      child.stdout?.on("data", (chunk: string) => {
        const text = this.stdoutRest === "" ? chunk : this.stdoutRest + chunk
        let start = 0
        for (let end = text.indexOf("\n"); end !== -1; end = text.indexOf("\n", start)) {
          this.receive(text.charCodeAt(end - 1) === 13 ? text.slice(start, end - 1) : text.slice(start, end))
          start = end + 1
        }
        this.stdoutRest = start === 0 ? text : text.slice(start)
      })
      child.stderr?.on("data", (chunk: Buffer) => {
        const lines = (this.stderrRest + chunk.toString("utf8")).split("\n")
        this.stderrRest = lines.pop() ?? ""
        for (const line of lines) if (line.length > 0) this.onStderr(line)
      })
      child.stdin?.on("error", (error) => this.onerror?.(error))
    })
  }

  /**
   * One line of the server's stdout. Only the envelope is checked here (`JSON.parse`, an object with `jsonrpc: "2.0"`):
   * the SDK's Protocol classifies every message with its own schemas next, so the SDK's ReadBuffer parse of the whole
   * JSON-RPC union (microseconds per message) would be done twice.
   */
  receive(line: string): void {
    let message: unknown
    try {
      message = JSON.parse(line)
    } catch (error) {
      // a line that is not JSON: the line is consumed; report it and read on
      this.onStderr(`[not JSON-RPC on stdout] ${error instanceof Error ? error.message.slice(0, 200) : ""}`)
      return
    }
    if (typeof message !== "object" || message === null || (message as { jsonrpc?: unknown }).jsonrpc !== "2.0") {
      this.onStderr(`[not JSON-RPC on stdout] ${line.slice(0, 200)}`)
      return
    }
    this.onmessage?.(message as JSONRPCMessage)
  }

  get alive(): boolean {
    return this.child !== undefined && this.exit === undefined
  }

  /**
   * Messages sent together go out in one `writev`: the pipe is corked at the first and uncorked by `process.nextTick`,
   * so whatever is written before the tick queue next runs (the rest of the current callback, or of the current
   * cascade of microtasks) shares the syscall. 64 envs whose calls were answered in one read call their next tools
   * in the same cascade of microtasks; written one by one, each write woke the server again (a wake-up is
   * microseconds of the writer's syscall on a VM), and the env's client CPU per call in the mcp-latency bench was
   * 25–32 µs against the bare SDK's 19–24; corked, 19–20 against 18. (f5cadd4 tried a flush on a microtask: it runs
   * before the rest of the cascade has written, so it averaged 4 messages per write, and was reverted.)
   */
  send(message: JSONRPCMessage): Promise<void> {
    const stdin = this.child?.stdin
    if (!this.alive || stdin === undefined || stdin === null || stdin.destroyed) {
      return Promise.reject(new NotDelivered("server process is not running"))
    }
    if (!this.corked) {
      this.corked = true
      stdin.cork()
      process.nextTick(this.uncork)
    }
    return new Promise((resolve) => {
      if (stdin.write(serializeMessage(message))) resolve()
      else stdin.once("drain", resolve)
    })
  }

  corked = false
  /** Ends the tick's batch (a bound field: one closure per transport, not per message). */
  readonly uncork = (): void => {
    this.corked = false
    this.child?.stdin?.uncork()
  }

  async close(): Promise<void> {
    const child = this.child
    if (child === undefined || child.pid === undefined) return
    const pid = child.pid
    const exited = (ms: number) =>
      this.exit !== undefined
        ? Promise.resolve(true)
        : new Promise<boolean>((resolve) => {
            const timer = setTimeout(() => resolve(false), ms)
            child.once("exit", () => {
              clearTimeout(timer)
              resolve(true)
            })
          })
    child.stdin?.end()
    if (!(await exited(500))) {
      killGroup(pid, "SIGTERM")
      if (!(await exited(1000))) {
        killGroup(pid, "SIGKILL")
        await exited(1000)
      }
    }
    killGroup(pid, "SIGKILL")
    liveGroups.delete(pid)
  }
}

// ---- OAuth for HTTP servers --------------------------------------------------------------------------------------

/**
 * A headless OAuth client (the SDK runs discovery, registration, PKCE and token exchange; this keeps the state).
 * "Redirecting the user" means requesting the authorization URL and reading the code from the redirect it answers
 * with: that works for pre-approved clients, which is all an unattended training run can use.
 */
class HeadlessOAuthProvider implements OAuthClientProvider {
  readonly redirect: string
  readonly metadata: OAuthClientMetadata
  clientMetadataUrl?: string
  readonly preRegistered: OAuthClientInformationMixed | undefined
  info: OAuthClientInformationMixed | undefined
  saved: OAuthTokens | undefined
  verifier: string | undefined
  pendingCode: string | undefined

  constructor(oauth: McpOAuthConfig, clientSecret: string | undefined) {
    this.redirect = oauth.redirect_url
    this.metadata = {
      client_name: oauth.client_name,
      redirect_uris: [oauth.redirect_url],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      ...(oauth.scope === undefined ? {} : { scope: oauth.scope })
    }
    if (oauth.client_metadata_url !== undefined) this.clientMetadataUrl = oauth.client_metadata_url
    this.preRegistered =
      oauth.client_id === undefined
        ? undefined
        : { client_id: oauth.client_id, ...(clientSecret === undefined ? {} : { client_secret: clientSecret }) }
    this.info = this.preRegistered
  }
  get redirectUrl(): string {
    return this.redirect
  }
  get clientMetadata(): OAuthClientMetadata {
    return this.metadata
  }
  clientInformation() {
    return this.info
  }
  saveClientInformation(info: OAuthClientInformationMixed) {
    this.info = info
  }
  tokens() {
    return this.saved
  }
  saveTokens(tokens: OAuthTokens) {
    this.saved = tokens
  }
  saveCodeVerifier(verifier: string) {
    this.verifier = verifier
  }
  codeVerifier(): string {
    if (this.verifier === undefined) throw new Error("no PKCE code verifier saved")
    return this.verifier
  }
  async redirectToAuthorization(url: URL): Promise<void> {
    const response = await fetch(url, { redirect: "manual" })
    const location = response.headers.get("location")
    const code = location === null ? null : new URL(location, url).searchParams.get("code")
    if (code === null) {
      throw new Error(`authorization at ${redactUrl(url.toString())} wants a user (no redirect with a code)`)
    }
    this.pendingCode = code
  }
  invalidateCredentials(scope: "all" | "client" | "tokens" | "verifier" | "discovery") {
    if (scope === "all" || scope === "tokens") this.saved = undefined
    if (scope === "all" || scope === "client") this.info = this.preRegistered
    if (scope === "all" || scope === "verifier") this.verifier = undefined
  }
  /** The code the last authorization redirect carried, once. */
  takeCode(): string | undefined {
    const code = this.pendingCode
    this.pendingCode = undefined
    return code
  }
}

const makeOAuthProvider = (config: McpServerConfig, oauth: McpOAuthConfig) =>
  Effect.gen(function* () {
    const secret =
      oauth.client_secret === undefined
        ? undefined
        : Redacted.value(
            yield* Config.Redacted(oauth.client_secret.env).pipe(
              Effect.mapError(
                () =>
                  new McpConnectError({
                    server: config.name,
                    reason: "Unauthorized",
                    message: `MCP server ${config.name}: oauth.client_secret names env ${oauth.client_secret?.env}, which is not set`
                  })
              )
            )
          )
    return new HeadlessOAuthProvider(oauth, secret)
  })

// ---- one connection to one server -------------------------------------------------------------------------------

interface Live {
  readonly client: Client
  readonly transport: Transport
  closed: boolean
  /** tools/call requests sent on this connection and not settled yet. */
  inFlight: number
  /** `inFlight` when the connection closed: the calls a crash took down together. */
  suspects: number
}

interface CallFailure {
  readonly error: ToolCallError
  readonly delivered: boolean
  /** The part of this failure charged to the call: 1, 1/N for a crash that took N calls down, 0 if never delivered. */
  readonly share: number
}

/**
 * What a call's failures have cost it, under the retry rule in the header: deliveries are charged their share,
 * attempts that never reached a server are counted in a row. `spend` answers whether the call may be sent again.
 */
class RetryBudget {
  charged = 0
  refused = 0
  readonly retries: number
  constructor(retries: number) {
    this.retries = retries
  }
  spend(f: CallFailure): boolean {
    if (f.delivered) {
      this.charged += f.share
      this.refused = 0
    } else {
      this.refused++
    }
    // a little slack: three crashes shared by three calls charge each 1/3 + 1/3 + 1/3, which may round past 1
    return this.charged <= this.retries + 1e-9 && this.refused <= this.retries
  }
}

/** Completes an `Effect.callback`. */
type Resume = (effect: Effect.Effect<ToolResult, ToolCallError>) => void

interface Connection {
  readonly config: McpServerConfig
  readonly tools: () => ReadonlyArray<Tool>
  /** Starts one call (the body of an `Effect.callback`): a session's call is one Effect primitive in all. */
  readonly start: (tool: string, args: Readonly<Record<string, unknown>>, resume: Resume, cancel: CallCancel) => void
  readonly pid: () => number | undefined
}

interface Counters {
  calls: number
  errors: number
  retries: number
  restarts: number
  connects: number
}

const clientInfo = { name: "effect-rl", version: "0.1.0" }

const backoffStart = "25 millis"
// capped: a call whose crashes were shared with other calls may be re-driven more than `retries` times
const backoff = Schedule.min([
  Schedule.exponential("50 millis", 2).pipe(Schedule.jittered),
  Schedule.spaced("1 second")
])

/** A URL without credentials or query (tokens hide there): what error messages may show. */
export const redactUrl = (url: string): string => {
  try {
    const u = new URL(url)
    return `${u.protocol}//${u.host}${u.pathname}`
  } catch {
    return "<invalid url>"
  }
}

const describeCause = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

const isRefused = (cause: unknown): boolean => {
  if (cause instanceof NotDelivered) return true
  if (cause instanceof Error && cause.message === "Not connected") return true
  const code = (cause as { cause?: { code?: string } } | undefined)?.cause?.code
  return code === "ECONNREFUSED"
}

/** Maps whatever the SDK threw for a `tools/call` to a reason. Timeouts and cancellations share -32001. */
const classify = (cause: unknown): ToolCallErrorReason => {
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
const classifyErrorText = (text: string): ToolCallErrorReason => {
  if (!text.startsWith("MCP error -32602: ")) return "ToolFailed"
  if (/^MCP error -32602: Tool \S+ (not found|disabled)/.test(text)) return "UnknownTool"
  // the server's own result failed its validation: not the caller's fault
  if (/Invalid tools\/call result|output schema/.test(text)) return "ServerError"
  return "BadArguments"
}

const makeConnection = Effect.fnUntraced(function* (
  config: McpServerConfig,
  options: {
    readonly maxResultChars: number
    readonly retries: number
    readonly counters: Counters
    readonly elicitation: "accept_defaults" | undefined
  },
  initialTools?: ReadonlyArray<Tool>
) {
  const scope = yield* Scope.Scope
  const lock = yield* Semaphore.make(1)
  const redrives = yield* Semaphore.make(1) // calls re-driven after a crash go one at a time
  const counters = options.counters
  const stderr = yield* Queue.sliding<string>(1024)
  const recent: Array<string> = []
  yield* Queue.take(stderr).pipe(
    Effect.flatMap((line) => Effect.logDebug(line)),
    Effect.forever,
    Effect.annotateLogs({ mcp_server: config.name }),
    Effect.forkIn(scope)
  )
  const onStderr = (line: string) => {
    recent.push(line)
    if (recent.length > 20) recent.shift()
    Queue.offerUnsafe(stderr, line)
  }

  // starting a process (Node, imports) can take longer than a tool call may: give the handshake at least 15 s
  const connectTimeoutMs = Math.max(config.timeout_ms, 15_000)
  let live: Live | undefined
  let tools: ReadonlyArray<Tool> = initialTools ?? []
  let everConnected = false

  const connectError = (reason: McpConnectError["reason"], cause: unknown) =>
    new McpConnectError({
      server: config.name,
      reason,
      message: `MCP server ${config.name} (${config.transport === "stdio" ? config.command : redactUrl(config.url ?? "")}): ${describeCause(cause)}`,
      cause
    })

  const closeLive = (l: Live) =>
    Effect.promise(async () => {
      l.closed = true
      if (l.transport instanceof StreamableHTTPClientTransport) {
        await l.transport.terminateSession().catch(() => undefined)
      }
      await l.client.close().catch(() => undefined)
    })

  // made on first connect (its secret is read then) and kept across reconnects: tokens outlive a session
  let oauth: HeadlessOAuthProvider | undefined

  const newLive = (): Live => {
    const transport: Transport =
      config.transport === "stdio"
        ? new ChildStdioTransport(config, onStderr)
        : new StreamableHTTPClientTransport(new URL(config.url ?? ""), {
            requestInit: { headers: { ...config.headers } },
            ...(oauth === undefined ? {} : { authProvider: oauth })
          })
    const client = new Client(clientInfo, {
      capabilities: options.elicitation === "accept_defaults" ? { elicitation: { form: { applyDefaults: true } } } : {},
      // notifications/tools/list_changed: the SDK re-lists; the cache follows
      listChanged: {
        tools: {
          onChanged: (error, list) => {
            if (error === null && list !== null) tools = list
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

  const connectReason = (cause: unknown): McpConnectError["reason"] =>
    (cause as { code?: string }).code === "ENOENT" || (cause as { code?: string }).code === "EACCES"
      ? "Spawn"
      : cause instanceof UnauthorizedError
        ? "Unauthorized"
        : isRefused(cause) || cause instanceof TypeError
          ? "Unreachable"
          : "Handshake"

  const open: Effect.Effect<Live, McpConnectError> = Effect.gen(function* () {
    counters.connects++
    if (oauth === undefined && config.transport === "http" && config.oauth !== undefined) {
      oauth = yield* makeOAuthProvider(config, config.oauth)
    }
    let next = newLive()
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
          catch: (cause) => connectError("Unauthorized", cause)
        }).pipe(Effect.onError(() => closeLive(current)))
        yield* closeLive(current)
        next = newLive()
        continue
      }
      yield* closeLive(current)
      return yield* connectError(connectReason(attempt.failure), attempt.failure)
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
          catch: (cause) => connectError("Unauthorized", cause)
        }).pipe(Effect.onError(() => closeLive(connected)))
        continue
      }
      yield* closeLive(connected)
      return yield* connectError(page.failure instanceof UnauthorizedError ? "Unauthorized" : "ListTools", page.failure)
    }
    tools = listed
    return connected
  })

  const restart: Effect.Effect<Live, McpConnectError> = lock.withPermits(1)(
    Effect.suspend(() => {
      if (live !== undefined && !live.closed) return Effect.succeed(live) // another fiber restarted it
      const dead = live
      return Effect.gen(function* () {
        if (dead !== undefined) {
          live = undefined
          const exit = dead.transport instanceof ChildStdioTransport ? dead.transport.exit : undefined
          yield* Effect.logWarning("MCP server connection lost; restarting").pipe(
            Effect.annotateLogs({
              mcp_server: config.name,
              exit_code: String(exit?.code ?? ""),
              signal: String(exit?.signal ?? ""),
              stderr_tail: recent.slice(-5).join("\n")
            })
          )
          yield* closeLive(dead)
        }
        const next = yield* open
        if (everConnected) counters.restarts++
        everConnected = true
        live = next
        return next
      })
    })
  )

  /** The live connection; (re)started under the lock when there is none or its server died. */
  const ensure: Effect.Effect<Live, McpConnectError> = Effect.suspend(() =>
    live !== undefined && !live.closed ? Effect.succeed(live) : restart
  )

  const annotationsOf = (tool: string) => tools.find((t) => t.name === tool)?.annotations
  const reDrivable = (tool: string) => {
    const a = annotationsOf(tool)
    return config.isolation === "shared" && (a?.readOnlyHint === true || a?.idempotentHint === true)
  }

  type Outcome =
    | { readonly ok: true; readonly value: ToolResult }
    | { readonly ok: false; readonly failure: CallFailure }
  const failed = (
    tool: string,
    reason: ToolCallErrorReason,
    message: string,
    delivered: boolean,
    share = 1
  ): Outcome => ({
    ok: false,
    failure: { error: new ToolCallError({ tool, server: config.name, reason, message }), delivered, share }
  })

  /** A `tools/call` result as an outcome: `isError` results are failures, with the server's text. */
  const settle = (tool: string, result: Record<string, unknown>): Outcome => {
    if (!("content" in result) && !("structuredContent" in result)) {
      return failed(tool, "ServerError", "malformed tools/call result", true)
    }
    const { text, truncated } = truncate(
      resultText(result as { content?: unknown; structuredContent?: unknown }),
      options.maxResultChars
    )
    if (result["isError"] === true) return failed(tool, classifyErrorText(text), text, true)
    const structured = result["structuredContent"]
    return {
      ok: true,
      value:
        structured === undefined
          ? { server: config.name, text, truncated }
          : { server: config.name, text, truncated, structured }
    }
  }

  const rejected = (conn: Live, tool: string, cause: unknown): Outcome => {
    // An HTTP server that forgot our session (404, e.g. it restarted) or refuses connections did not run the call;
    // drop the connection so the next attempt opens a new session.
    // (the spec says 404; some servers, server-everything among them, answer 400 "No valid session ID")
    const sessionLost =
      cause instanceof StreamableHTTPError &&
      (cause.code === 404 || (cause.code === 400 && /session/i.test(cause.message)))
    const notDelivered = isRefused(cause) || sessionLost
    if (notDelivered && conn.transport instanceof StreamableHTTPClientTransport) conn.closed = true
    const reason = sessionLost ? "Disconnected" : classify(cause)
    const message = reason === "Timeout" ? `${tool} timed out after ${config.timeout_ms} ms` : describeCause(cause)
    // a crash (the connection closed under the call) is shared among the calls it took down
    const share = notDelivered
      ? 0
      : reason === "Disconnected" && conn.closed && conn.suspects > 1
        ? 1 / conn.suspects
        : 1
    return failed(tool, reason, message, !notDelivered, share)
  }

  /**
   * A call refused for its token (401 after expiry, 403 insufficient_scope step-up): the SDK already ran the
   * authorization again; exchange the new code, then the call is sent again (it was refused, so it never ran).
   */
  const reauthorize = async (conn: Live, tool: string, cause: UnauthorizedError): Promise<Outcome> => {
    const code = oauth?.takeCode()
    if (code === undefined || !(conn.transport instanceof StreamableHTTPClientTransport)) {
      return failed(tool, "ServerError", `unauthorized: ${describeCause(cause)}`, true)
    }
    try {
      await conn.transport.finishAuth(code)
      return failed(tool, "Disconnected", "re-authorized; sending again", false, 0)
    } catch (error) {
      return failed(tool, "ServerError", `re-authorization failed: ${describeCause(error)}`, true)
    }
  }

  /** One `tools/call` on `conn`, settled into an Outcome (the promise never rejects). */
  const send = (
    conn: Live,
    tool: string,
    args: Readonly<Record<string, unknown>>,
    signal: AbortSignal
  ): Promise<Outcome> => {
    conn.inFlight++
    return conn.client
      .callTool({ name: tool, arguments: { ...args } }, undefined, { timeout: config.timeout_ms, signal })
      .then(
        (result) => {
          conn.inFlight--
          return settle(tool, result)
        },
        (cause: unknown) => {
          conn.inFlight--
          return cause instanceof UnauthorizedError ? reauthorize(conn, tool, cause) : rejected(conn, tool, cause)
        }
      )
  }

  const fromOutcome = (o: Outcome): Effect.Effect<ToolResult, CallFailure> =>
    o.ok ? Effect.succeed(o.value) : Effect.fail(o.failure)

  const callOnce = (tool: string, args: Readonly<Record<string, unknown>>): Effect.Effect<ToolResult, CallFailure> =>
    Effect.flatMap(
      Effect.suspend(() =>
        live !== undefined && !live.closed
          ? Effect.succeed(live)
          : restart.pipe(
              Effect.mapError(
                (e): CallFailure => ({
                  error: new ToolCallError({ tool, server: config.name, reason: "Disconnected", message: e.message }),
                  delivered: false,
                  share: 0
                })
              )
            )
      ),
      (conn) =>
        Effect.flatMap(
          Effect.promise((signal) => send(conn, tool, args, signal)),
          fromOutcome
        )
    )

  const mayRetry = (tool: string) => (f: CallFailure) => !f.delivered || (f.error.isRetryable && reDrivable(tool))

  const countError = (f: CallFailure) => {
    counters.errors++
    return f.error
  }

  /** A failure of a call that reached the server and lost it: a crash, or a kill from outside. */
  const crashed = (f: CallFailure) => f.delivered && f.error.reason === "Disconnected"

  /** After a first failure: sent again under the retry rule (see the header), else the error, counted. */
  const recover = (
    tool: string,
    args: Readonly<Record<string, unknown>>,
    first: CallFailure
  ): Effect.Effect<ToolResult, ToolCallError> => {
    const budget = new RetryBudget(options.retries)
    if (options.retries === 0 || !mayRetry(tool)(first) || !budget.spend(first)) return Effect.fail(countError(first))
    let last = first
    return Effect.suspend(() => {
      counters.calls++
      counters.retries++
      return crashed(last) ? redrives.withPermits(1)(callOnce(tool, args)) : callOnce(tool, args)
    }).pipe(
      Effect.delay(backoffStart),
      Effect.retry({
        schedule: backoff,
        while: (f) => {
          last = f
          return mayRetry(tool)(f) && budget.spend(f)
        }
      }),
      Effect.mapError(countError)
    )
  }

  const first = (tool: string, args: Readonly<Record<string, unknown>>): Effect.Effect<ToolResult, ToolCallError> =>
    Effect.catch(callOnce(tool, args), (f) => recover(tool, args, f))

  // The hot path (a live connection) is one Effect primitive around the SDK's promise: the SDK's own `timeout` and
  // `signal` carry the per-call timeout and interruption, and the retry machinery is entered only after a failure.
  // Per-call Effect overhead is what the mcp-latency bench measures against the bare SDK.
  const start = (tool: string, args: Readonly<Record<string, unknown>>, resume: Resume, cancel: CallCancel) => {
    counters.calls++
    const conn = live
    if (conn === undefined || conn.closed) return resume(first(tool, args)) // (re)start the server first
    const done = (o: Outcome) => resume(o.ok ? Effect.succeed(o.value) : recover(tool, args, o.failure))
    const die = (defect: unknown) => resume(Effect.die(defect))
    // settled in the SDK promise's own callbacks: no second promise per call
    conn.inFlight++
    conn.client
      .callTool({ name: tool, arguments: { ...args } }, undefined, {
        timeout: config.timeout_ms,
        signal: cancel.signal
      })
      .then(
        (result) => {
          conn.inFlight--
          let o: Outcome
          try {
            o = settle(tool, result)
          } catch (defect) {
            return die(defect)
          }
          done(o)
        },
        (cause: unknown) => {
          conn.inFlight--
          if (cause instanceof UnauthorizedError) reauthorize(conn, tool, cause).then(done, die)
          else done(rejected(conn, tool, cause))
        }
      )
  }

  yield* Scope.addFinalizer(
    scope,
    Effect.suspend(() => (live === undefined ? Effect.void : closeLive(live)))
  )

  const connection: Connection = {
    config,
    tools: () => tools,
    start,
    pid: () => {
      const t = live?.transport
      return t instanceof ChildStdioTransport && t.alive ? t.child?.pid : undefined
    }
  }
  return { connection, ensure }
})

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

const mountedTools = (connections: ReadonlyArray<Connection>, namespaced: boolean): ReadonlyArray<McpTool> =>
  connections.flatMap((c) =>
    c
      .tools()
      .filter((t) => c.config.allowed_tools === undefined || c.config.allowed_tools.includes(t.name))
      .map(toMcpTool(c.config, namespaced))
  )

const makeSession = (connections: ReadonlyArray<Connection>, namespaced: boolean): McpSession => {
  // the mounted list changes only when a server re-lists (after a restart): recompute then, not per call
  let listed: ReadonlyArray<ReadonlyArray<Tool>> = []
  let mounted: ReadonlyArray<McpTool> = []
  let byName = new Map<string, { readonly tool: McpTool; readonly connection: Connection }>()
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
  const counters: Counters = { calls: 0, errors: 0, retries: 0, restarts: 0, connects: 0 }
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
        const { connection, ensure } = yield* makeConnection(config, connOptions)
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
        : makeConnection(c.config, connOptions, c.tools()).pipe(Effect.map((x) => x.connection))
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
