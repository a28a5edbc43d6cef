/**
 * The reaper kills the process groups a process registered when that process is killed with SIGKILL (no exit code
 * runs), those whose leader had already ended but left a process behind included, and leaves forgotten groups alone.
 */

import { spawn } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"

/** The fields of /proc/PID/stat after the command name (state first, then ppid, pgrp, …); undefined once it is gone. */
const statFields = (pid: number | string): Array<string> | undefined => {
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ")
  } catch {
    return undefined
  }
}

/** Running (a zombie waiting for its parent to reap it counts as gone). */
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
  } catch {
    return false
  }
  const state = statFields(pid)?.[0]
  return state !== undefined && state !== "Z"
}

// a process that starts two `sleep` process groups, registers both, forgets the second, and a third group whose leader
// ends after 0.3 s leaving a `sleep` in it (a crashed server's grandchild); prints the pids and waits
const program = `
import { spawn } from "node:child_process"
import * as ProcessReaper from "./src/mcp/ProcessReaper.ts"
const a = spawn("sleep", ["600"], { detached: true, stdio: "ignore" })
const b = spawn("sleep", ["600"], { detached: true, stdio: "ignore" })
const c = spawn("sh", ["-c", "sleep 600 & sleep 0.3"], { detached: true, stdio: "ignore" })
ProcessReaper.register(a.pid)
ProcessReaper.register(b.pid)
ProcessReaper.register(c.pid)
ProcessReaper.forget(b.pid)
process.stdout.write(JSON.stringify({ a: a.pid, b: b.pid, c: c.pid }) + "\\n")
setInterval(() => {}, 1000)
`

/** The processes of group `pgid` (field 5 of /proc/PID/stat). */
const members = (pgid: number): Array<number> =>
  readdirSync("/proc")
    .filter((d) => /^\d+$/.test(d))
    .filter((d) => statFields(d)?.[2] === String(pgid))
    .map(Number)

describe("ProcessReaper", () => {
  it("kills the registered groups of a process killed with SIGKILL, and only those", async () => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", program], {
      stdio: ["ignore", "pipe", "inherit"]
    })
    const pids = await new Promise<{ a: number; b: number; c: number }>((resolve) =>
      child.stdout.once("data", (chunk) => resolve(JSON.parse(String(chunk)) as { a: number; b: number; c: number }))
    )
    await new Promise((r) => setTimeout(r, 800)) // the lines reach the reaper; c's leader ends
    assert.isTrue(alive(pids.a) && alive(pids.b))
    const left = members(pids.c)
    assert.isFalse(left.includes(pids.c), "c's leader has ended")
    assert.strictEqual(left.length, 1, "c's leader left its sleep behind")
    child.kill("SIGKILL")
    const deadline = Date.now() + 5000
    while ((alive(pids.a) || alive(left[0]!)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50))
    assert.isFalse(alive(pids.a), "the registered group is killed")
    assert.isFalse(alive(left[0]!), "so is what a registered group's ended leader left behind")
    assert.isTrue(alive(pids.b), "a forgotten group is left alone")
    process.kill(-pids.b, "SIGKILL")
  }, 30_000)
})
