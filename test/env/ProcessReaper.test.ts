/**
 * The reaper kills the process groups a process registered when that process is killed with SIGKILL (no exit code
 * runs), and leaves forgotten groups alone.
 */
import { spawn } from "node:child_process"
import { assert, describe, it } from "@effect/vitest"

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

// a process that starts two `sleep` process groups, registers both, forgets the second, prints their pids and waits
const program = `
import { spawn } from "node:child_process"
import * as ProcessReaper from "./src/mcp/ProcessReaper.ts"
const a = spawn("sleep", ["600"], { detached: true, stdio: "ignore" })
const b = spawn("sleep", ["600"], { detached: true, stdio: "ignore" })
ProcessReaper.register(a.pid)
ProcessReaper.register(b.pid)
ProcessReaper.forget(b.pid)
process.stdout.write(JSON.stringify({ a: a.pid, b: b.pid }) + "\\n")
setInterval(() => {}, 1000)
`

describe("ProcessReaper", () => {
  it("kills the registered groups of a process killed with SIGKILL, and only those", async () => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", program], {
      stdio: ["ignore", "pipe", "inherit"]
    })
    const pids = await new Promise<{ a: number; b: number }>((resolve) =>
      child.stdout.once("data", (chunk) => resolve(JSON.parse(String(chunk)) as { a: number; b: number }))
    )
    await new Promise((r) => setTimeout(r, 300)) // the lines reach the reaper
    assert.isTrue(alive(pids.a) && alive(pids.b))
    child.kill("SIGKILL")
    const deadline = Date.now() + 5000
    while (alive(pids.a) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50))
    assert.isFalse(alive(pids.a), "the registered group is killed")
    assert.isTrue(alive(pids.b), "a forgotten group is left alone")
    process.kill(-pids.b, "SIGKILL")
  }, 30_000)
})
