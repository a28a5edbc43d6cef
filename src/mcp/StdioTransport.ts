/**
 * The stdio transport: we spawn the server ourselves, for what the SDK's own stdio transport does not give.
 * - Its own process group (`detached`), so a restart or a close kills the server and everything it started; when the
 *   server exits, whatever it left in its group is killed at once.
 * - An explicit environment: the config's `env` plus PATH and HOME, nothing else inherited.
 * - No orphans: closing closes stdin, then SIGTERMs and SIGKILLs the group; a process `exit` hook SIGKILLs every
 *   group still alive if the run ends without closing its scopes, and the ProcessReaper kills them if it is SIGKILLed.
 * - stdout is read as UTF-8 (a character split across chunks is decoded whole; invalid bytes become U+FFFD), one
 *   JSON-RPC message per line; stderr goes line by line to `onStderr`.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { existsSync } from "node:fs"
import * as path from "node:path"
import { serializeMessage } from "@modelcontextprotocol/sdk/shared/stdio.js"
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js"
import type { McpServerConfig } from "../config/EnvironmentConfig.ts"
import { NotDelivered } from "./Errors.ts"
import * as ProcessReaper from "./ProcessReaper.ts"

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

export interface ExitInfo {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

/**
 * The Node that runs a `command: node` server: this process's own, unless the server is a TypeScript file this Node
 * cannot run (Node before 22.18 strips no types: e.g. `node dist/main.js` on a system Node 20 starting
 * `src/toolbox/server.ts`); then the Node 24 that `npm ci` installed (the `node` package), when there is one.
 */
const nodeFor = (args: ReadonlyArray<string>): string => {
  const script = args.find((a) => !a.startsWith("-"))
  const typescript = (process.features as { readonly typescript?: unknown }).typescript
  const stripsTypes = typescript !== undefined && typescript !== false
  if (script === undefined || !/\.[mc]?ts$/.test(script) || stripsTypes) return process.execPath
  for (const root of [
    process.cwd(),
    path.resolve(import.meta.dirname, "..", "..", ".."),
    path.resolve(import.meta.dirname, "..", "..")
  ]) {
    const bundled = path.join(root, "node_modules", "node", "bin", "node")
    if (existsSync(bundled)) return bundled
  }
  return process.execPath
}

export class ChildStdioTransport implements Transport {
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
    this.command = config.command === "node" ? nodeFor(config.args) : (config.command ?? "")
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
      // Registered before anything else runs: the 'spawn' event comes a tick later, after whatever else this tick
      // spawns (envs that open together each fork and exec a server), and a SIGKILL in between left a server the
      // reaper never heard of, with the grandchild it started.
      if (child.pid !== undefined) {
        liveGroups.add(child.pid)
        ProcessReaper.register(child.pid) // killed even if this process is SIGKILLed
      }
      child.once("error", (error) => {
        reject(error)
        this.onerror?.(error)
      })
      child.once("spawn", () => resolve())
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
