/**
 * One server's connection policy, over the live connections it opens one after another:
 * - The connection is opened on first use and again after its server died (a crashed stdio server is restarted on
 *   the next call, under a lock, so concurrent callers share one restart); the tool list is re-read on each open.
 * - The server's stderr goes to the Effect logs at Debug level, annotated with `mcp_server`; its last lines are
 *   logged as a warning when it dies.
 * - Every call has a timeout (`timeout_ms`) and its result text is capped at `maxResultChars` (truncation is marked).
 * - A failed call is sent again under the retry rule of Retry.ts, and every SDK failure leaves as a `ToolCallError`.
 * - Closing the scope closes the live connection.
 */

import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js"
import { StreamableHTTPClientTransport, StreamableHTTPError } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import type { Tool } from "@modelcontextprotocol/sdk/types.js"
import { Effect, Queue, Scope, Semaphore } from "effect"
import type { McpServerConfig } from "../config/EnvironmentConfig.ts"
import { type HeadlessOAuthProvider, makeOAuthProvider } from "./Auth.ts"
import type { CallCancel } from "./CallCancel.ts"
import {
  classify,
  classifyErrorText,
  describeCause,
  isRefused,
  type McpConnectError,
  ToolCallError,
  type ToolCallErrorReason
} from "./Errors.ts"
import * as LiveConnection from "./LiveConnection.ts"
import { resultText, truncate } from "./ResultText.ts"
import { backoff, backoffStart, type CallFailure, crashed, mayRetry, RetryBudget } from "./Retry.ts"
import { ChildStdioTransport } from "./StdioTransport.ts"
import type { ToolResult } from "./Types.ts"

type Live = LiveConnection.Live

/** Completes an `Effect.callback`. */
export type Resume = (effect: Effect.Effect<ToolResult, ToolCallError>) => void

export interface Connection {
  readonly config: McpServerConfig
  readonly tools: () => ReadonlyArray<Tool>
  /** Starts one call (the body of an `Effect.callback`): a session's call is one Effect primitive in all. */
  readonly start: (tool: string, args: Readonly<Record<string, unknown>>, resume: Resume, cancel: CallCancel) => void
  readonly pid: () => number | undefined
}

/** Counted over every connection of a client (`McpClient.stats`). */
export interface Counters {
  calls: number
  errors: number
  retries: number
  restarts: number
  connects: number
}

export interface ConnectionOptions {
  readonly maxResultChars: number
  readonly retries: number
  readonly counters: Counters
  readonly elicitation: "accept_defaults" | undefined
}

// ---- one call's outcome -------------------------------------------------------------------------------------------

type Outcome = { readonly ok: true; readonly value: ToolResult } | { readonly ok: false; readonly failure: CallFailure }

const failed = (
  server: string,
  tool: string,
  reason: ToolCallErrorReason,
  message: string,
  delivered: boolean,
  share = 1
): Outcome => ({
  ok: false,
  failure: { error: new ToolCallError({ tool, server, reason, message }), delivered, share }
})

/** A `tools/call` result as an outcome: `isError` results are failures, with the server's text. */
const settle = (server: string, maxResultChars: number, tool: string, result: Record<string, unknown>): Outcome => {
  if (!("content" in result) && !("structuredContent" in result)) {
    return failed(server, tool, "ServerError", "malformed tools/call result", true)
  }
  const { text, truncated } = truncate(
    resultText(result as { content?: unknown; structuredContent?: unknown }),
    maxResultChars
  )
  if (result["isError"] === true) return failed(server, tool, classifyErrorText(text), text, true)
  const structured = result["structuredContent"]
  return {
    ok: true,
    value: structured === undefined ? { server, text, truncated } : { server, text, truncated, structured }
  }
}

/** A `tools/call` the SDK rejected, as an outcome. */
const rejected = (config: McpServerConfig, conn: Live, tool: string, cause: unknown): Outcome => {
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
  const share = notDelivered ? 0 : reason === "Disconnected" && conn.closed && conn.suspects > 1 ? 1 / conn.suspects : 1
  return failed(config.name, tool, reason, message, !notDelivered, share)
}

/**
 * A call refused for its token (401 after expiry, 403 insufficient_scope step-up): the SDK already ran the
 * authorization again; exchange the new code, then the call is sent again (it was refused, so it never ran).
 */
const reauthorize = async (
  server: string,
  oauth: HeadlessOAuthProvider | undefined,
  conn: Live,
  tool: string,
  cause: UnauthorizedError
): Promise<Outcome> => {
  const code = oauth?.takeCode()
  if (code === undefined || !(conn.transport instanceof StreamableHTTPClientTransport)) {
    return failed(server, tool, "ServerError", `unauthorized: ${describeCause(cause)}`, true)
  }
  try {
    await conn.transport.finishAuth(code)
    return failed(server, tool, "Disconnected", "re-authorized; sending again", false, 0)
  } catch (error) {
    return failed(server, tool, "ServerError", `re-authorization failed: ${describeCause(error)}`, true)
  }
}

const fromOutcome = (o: Outcome): Effect.Effect<ToolResult, CallFailure> =>
  o.ok ? Effect.succeed(o.value) : Effect.fail(o.failure)

// ---- the connection -----------------------------------------------------------------------------------------------

/** The server's stderr: logged at Debug as it comes, its last 20 lines kept for the warning when the server dies. */
const stderrLog = Effect.fnUntraced(function* (config: McpServerConfig, scope: Scope.Scope) {
  const lines = yield* Queue.sliding<string>(1024)
  const recent: Array<string> = []
  yield* Queue.take(lines).pipe(
    Effect.flatMap((line) => Effect.logDebug(line)),
    Effect.forever,
    Effect.annotateLogs({ mcp_server: config.name }),
    Effect.forkIn(scope)
  )
  const onStderr = (line: string) => {
    recent.push(line)
    if (recent.length > 20) recent.shift()
    Queue.offerUnsafe(lines, line)
  }
  return { onStderr, recent }
})

/**
 * A connection to one server, opened on its first call (or by `ensure`); `initialTools` is the tool list until then
 * (a per-trajectory connection starts with its server's listing). The scope closes it.
 */
// biome-ignore lint/complexity/noExcessiveLinesPerFunction: a make closure is its service's class (400 lines at most)
export const make = Effect.fnUntraced(function* (
  config: McpServerConfig,
  options: ConnectionOptions,
  initialTools?: ReadonlyArray<Tool>
) {
  const scope = yield* Scope.Scope
  const lock = yield* Semaphore.make(1)
  const redrives = yield* Semaphore.make(1) // calls re-driven after a crash go one at a time
  const counters = options.counters
  const { onStderr, recent } = yield* stderrLog(config, scope)

  let live: Live | undefined
  let tools: ReadonlyArray<Tool> = initialTools ?? []
  let everConnected = false
  // made on first connect (its secret is read then) and kept across reconnects: tokens outlive a session
  let oauth: HeadlessOAuthProvider | undefined

  const open: Effect.Effect<Live, McpConnectError> = Effect.gen(function* () {
    counters.connects++
    if (oauth === undefined && config.transport === "http" && config.oauth !== undefined) {
      oauth = yield* makeOAuthProvider(config, config.oauth)
    }
    const opened = yield* LiveConnection.open(config, {
      elicitation: options.elicitation,
      oauth,
      onStderr,
      onToolsChanged: (list) => {
        tools = list
      }
    })
    tools = opened.tools
    return opened.live
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
          yield* LiveConnection.close(dead)
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

  /** Rule 2's conditions on the server and the tool (see Retry.ts). */
  const reDrivable = (tool: string) => () => {
    const a = tools.find((t) => t.name === tool)?.annotations
    return config.isolation === "shared" && (a?.readOnlyHint === true || a?.idempotentHint === true)
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
          return settle(config.name, options.maxResultChars, tool, result)
        },
        (cause: unknown) => {
          conn.inFlight--
          return cause instanceof UnauthorizedError
            ? reauthorize(config.name, oauth, conn, tool, cause)
            : rejected(config, conn, tool, cause)
        }
      )
  }

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

  const countError = (f: CallFailure) => {
    counters.errors++
    return f.error
  }

  /** After a first failure: sent again under the retry rule (see Retry.ts), else the error, counted. */
  const recover = (
    tool: string,
    args: Readonly<Record<string, unknown>>,
    first: CallFailure
  ): Effect.Effect<ToolResult, ToolCallError> => {
    const budget = new RetryBudget(options.retries)
    const retryable = (f: CallFailure) => mayRetry(f, reDrivable(tool)) && budget.spend(f)
    if (options.retries === 0 || !retryable(first)) return Effect.fail(countError(first))
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
          return retryable(f)
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
            o = settle(config.name, options.maxResultChars, tool, result)
          } catch (defect) {
            return die(defect)
          }
          done(o)
        },
        (cause: unknown) => {
          conn.inFlight--
          if (cause instanceof UnauthorizedError) reauthorize(config.name, oauth, conn, tool, cause).then(done, die)
          else done(rejected(config, conn, tool, cause))
        }
      )
  }

  yield* Scope.addFinalizer(
    scope,
    Effect.suspend(() => (live === undefined ? Effect.void : LiveConnection.close(live)))
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
