/**
 * Real MCP servers for the env tests: the bundled toolbox, the reference servers installed from npm, and the
 * faulty and chaos fixtures. Each returns a decoded `McpServerConfig`.
 */

import { spawn } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { Schema } from "effect"
import { McpServerConfig } from "../../src/config/EnvironmentConfig.ts"

const root = resolve(import.meta.dirname, "../..")
const pkg = (name: string) => join(root, "node_modules/@modelcontextprotocol", name, "dist/index.js")

export const config = (raw: Record<string, unknown>): McpServerConfig => Schema.decodeUnknownSync(McpServerConfig)(raw)

export const toolboxScript = join(root, "src/toolbox/server.ts")
export const mcpClientModule = join(root, "src/mcp/McpClient.ts")
export const faultyScript = join(root, "test/fixtures/FaultyMcpServer.ts")
export const toolbox = (extra: Record<string, unknown> = {}) =>
  config({ name: "toolbox", command: "node", args: [toolboxScript], ...extra })
export const everything = (extra: Record<string, unknown> = {}) =>
  config({ name: "everything", command: "node", args: [pkg("server-everything"), "stdio"], ...extra })
export const memory = (file: string, extra: Record<string, unknown> = {}) =>
  config({ name: "memory", command: "node", args: [pkg("server-memory")], env: { MEMORY_FILE_PATH: file }, ...extra })
export const filesystem = (dir: string, extra: Record<string, unknown> = {}) =>
  config({ name: "fs", command: "node", args: [pkg("server-filesystem"), dir], ...extra })
/** The faulty fixture, counting deliveries in `dir`/calls.log; `extra.env` adds to its environment. */
export const faulty = (dir: string, extra: Record<string, unknown> = {}) =>
  config({
    name: "faulty",
    command: "node",
    args: [faultyScript],
    timeout_ms: 400,
    ...extra,
    env: {
      FAULTY_COUNT_FILE: join(dir, "calls.log"),
      FAULTY_STATE_DIR: dir,
      ...(extra["env"] as Record<string, string> | undefined)
    }
  })

export const chaosScript = join(root, "test/fixtures/ChaosMcpServer.ts")
/** The chaos fixture (the toolbox's tools with injected faults); `env` sets its CHAOS_* rates. */
export const chaos = (env: Record<string, string>, extra: Record<string, unknown> = {}) =>
  config({ name: "chaos", command: "node", args: [chaosScript], env, ...extra })

export const cancelProbeScript = join(root, "test/env/CancelProbeServer.ts")
/** `wait` answers only when cancelled, and logs `started` / `cancelled` to `log`. */
export const cancelProbe = (log: string, extra: Record<string, unknown> = {}) =>
  config({ name: "probe", command: "node", args: [cancelProbeScript], env: { CANCEL_PROBE_LOG: log }, ...extra })

export const readProbeScript = join(root, "test/env/ReadProbeServer.ts")
/** `reads` answers how many stdin chunks the server has read; `echo` answers `n`. */
export const readProbe = (extra: Record<string, unknown> = {}) =>
  config({ name: "probe", command: "node", args: [readProbeScript], ...extra })

export const tempDir = (prefix: string) => mkdtempSync(join(tmpdir(), `effect-rl-${prefix}-`))

export const freePort = (): Promise<number> =>
  new Promise((ok, fail) => {
    const s = createServer()
    s.once("error", fail)
    s.listen(0, "127.0.0.1", () => {
      const address = s.address()
      s.close(() => ok(typeof address === "object" && address !== null ? address.port : 0))
    })
  })

/** Starts server-everything's Streamable HTTP mode on a free loopback port; resolves its URL and a stop function. */
export const startEverythingHttp = async (
  atPort?: number
): Promise<{ url: string; port: number; pid: number; stop: () => Promise<void> }> => {
  const port = atPort ?? (await freePort())
  const child = spawn(process.execPath, [pkg("server-everything"), "streamableHttp"], {
    env: { PATH: process.env["PATH"] ?? "", PORT: String(port) },
    stdio: ["ignore", "ignore", "pipe"]
  })
  await new Promise<void>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error("server-everything did not start")), 20_000)
    child.stderr?.on("data", (b: Buffer) => {
      if (b.toString().includes("listening")) {
        clearTimeout(timer)
        ok()
      }
    })
    child.once("exit", (code) => fail(new Error(`server-everything exited ${code}`)))
  })
  const stop = () =>
    new Promise<void>((ok) => {
      if (child.exitCode !== null) return ok()
      child.once("exit", () => ok())
      child.kill("SIGKILL")
    })
  return { url: `http://127.0.0.1:${port}/mcp`, port, pid: child.pid ?? 0, stop }
}

/** Starts the toolbox in HTTP mode on a free port. */
export const startToolboxHttp = async (): Promise<{ url: string; stop: () => Promise<void> }> => {
  const child = spawn(process.execPath, [toolboxScript, "--http", "0"], {
    env: { PATH: process.env["PATH"] ?? "" },
    stdio: ["ignore", "ignore", "pipe"]
  })
  const url = await new Promise<string>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error("toolbox did not start")), 20_000)
    child.stderr?.on("data", (b: Buffer) => {
      const m = /listening on (\S+)/.exec(b.toString())
      if (m !== null) {
        clearTimeout(timer)
        ok(m[1]!)
      }
    })
  })
  const stop = () =>
    new Promise<void>((ok) => {
      if (child.exitCode !== null) return ok()
      child.once("exit", () => ok())
      child.kill("SIGKILL")
    })
  return { url, stop }
}

/**
 * True while a process with this pid runs: `kill(pid, 0)` succeeds and it is not a zombie (a killed grandchild is
 * re-parented to PID 1, which may reap it late; a zombie runs nothing).
 */
export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
  } catch {
    return false
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z"
  } catch {
    return true // no /proc (macOS): kill(0) is all we can know
  }
}

/** The pids of the live processes in process group `pgid` (Linux: read from /proc; elsewhere none are found). */
export const groupMembers = (pgid: number): ReadonlyArray<number> => {
  let entries: Array<string>
  try {
    entries = readdirSync("/proc").filter((e) => /^\d+$/.test(e))
  } catch {
    return []
  }
  return entries.flatMap((e) => {
    try {
      const stat = readFileSync(`/proc/${e}/stat`, "utf8")
      // after the command's ")": state ppid pgrp ...
      const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
      return Number(pgrp) === pgid && state !== "Z" ? [Number(e)] : []
    } catch {
      return [] // gone while we looked
    }
  })
}

/** The lines of a text file; none when it does not exist yet. */
export const readLines = (file: string): ReadonlyArray<string> => {
  try {
    return readFileSync(file, "utf8")
      .split("\n")
      .filter((l) => l.length > 0)
  } catch {
    return []
  }
}

/** Polls until the process is gone (a SIGKILL is delivered asynchronously); true when it died within `ms`. */
export const diesWithin = (pid: number, ms: number): boolean => {
  const deadline = Date.now() + ms
  while (alive(pid)) {
    if (Date.now() > deadline) return false
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20)
  }
  return true
}
