/**
 * McpClient against the chaos server (test/fixtures/ChaosMcpServer.ts: the toolbox's tools, with faults injected on
 * more than half of the calls): every call ends as the toolbox's answer or a typed error in bounded time, and no
 * process outlives the client.
 */
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Cause, Duration, Effect, Exit, References } from "effect"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as Servers from "./McpServers.ts"

const rates = {
  CHAOS_CRASH: "0.08",
  CHAOS_HANG: "0.05",
  CHAOS_MALFORMED: "0.10",
  CHAOS_ERROR: "0.10",
  CHAOS_LONG: "0.15",
  CHAOS_BAD_UTF8: "0.10"
}
const calls = 200
const timeoutMs = 500
const maxResultChars = 4096
// A call may wait for other calls' restarts (one start of a Node server is 0.3–1.5 s here) and be re-driven after
// crashes and timeouts: far above one attempt, far below a hang.
const callBound = Duration.seconds(30)

/** The i-th call and the first line of the toolbox's answer to it (a `division by zero` tool error for divide). */
const call = (
  i: number
): { readonly tool: string; readonly args: Record<string, unknown>; readonly answer: string } => {
  switch (i % 4) {
    case 0:
      return { tool: "add", args: { a: i, b: 1 }, answer: String(i + 1) }
    case 1:
      return { tool: "multiply", args: { a: i, b: 2 }, answer: String(i * 2) }
    case 2:
      return { tool: "find_customer", args: { name: "carol evans" }, answer: "C003" }
    default:
      return { tool: "divide", args: { a: i, b: 0 }, answer: "division by zero" }
  }
}

const toolboxTools = [
  "add",
  "subtract",
  "multiply",
  "divide",
  "find_customer",
  "get_orders",
  "get_order",
  "convert_units",
  "date_add",
  "date_diff",
  "day_of_week"
]
const marker = /…\[truncated \d+ chars\]$/

describe("McpClient against the chaos server", () => {
  it.live(
    `${calls} calls, 58% of deliveries faulty: answers or typed errors in bounded time, no process left behind`,
    () =>
      Effect.gen(function* () {
        const dir = Servers.tempDir("chaos")
        const log = join(dir, "chaos.log")
        const server = Servers.chaos({ ...rates, CHAOS_SEED: "20240611", CHAOS_LOG: log }, { timeout_ms: timeoutMs })
        const { outcomes, stats } = yield* Effect.scoped(
          Effect.gen(function* () {
            const client = yield* McpClient.make({ servers: [server], retries: 2, maxResultChars })
            // a stand-in for the toolbox: its tools, read-only as the toolbox declares them
            const tools = yield* client.tools
            assert.deepStrictEqual(
              tools.map((t) => t.name),
              toolboxTools
            )
            assert.isTrue(tools.every((t) => t.readOnly && t.idempotent))
            const outcomes = yield* Effect.forEach(
              Array.from({ length: calls }, (_, i) => i),
              (i) =>
                client.call(call(i).tool, call(i).args).pipe(
                  Effect.exit,
                  Effect.timeoutOrElse({
                    duration: callBound,
                    orElse: () => Effect.die(new Error(`call ${i} ran past ${Duration.format(callBound)}`))
                  })
                ),
              { concurrency: 16 }
            )
            return { outcomes, stats: yield* client.stats }
          })
        )

        const injected = Servers.readLines(log).map((l) => l.split(" ")[0])
        const times = (fault: string) => injected.filter((f) => f === fault).length
        let answered = 0
        let replaced = 0
        let truncated = 0
        const reasons: Record<string, number> = {}
        for (const [i, exit] of outcomes.entries()) {
          const { tool, answer } = call(i)
          if (Exit.isSuccess(exit)) {
            answered++
            const { text } = exit.value
            assert.strictEqual(text.split("\n")[0], answer, `${tool} #${i}`)
            assert.isAtMost(text.length, maxResultChars + " …[truncated 200000 chars]".length)
            assert.strictEqual(exit.value.truncated, marker.test(text))
            if (exit.value.truncated) truncated++
            if (text.includes("\uFFFD")) replaced++
            continue
          }
          assert.isFalse(Cause.hasDies(exit.cause), `call ${i} died: ${Cause.pretty(exit.cause)}`)
          assert.isFalse(Cause.hasInterrupts(exit.cause), `call ${i} was interrupted`)
          const error = Cause.findErrorOption(exit.cause)
          assert.isTrue(error._tag === "Some" && error.value._tag === "ToolCallError", `call ${i}: ${exit.cause}`)
          const e = (error as { value: McpClient.ToolCallError }).value
          reasons[e.reason] = (reasons[e.reason] ?? 0) + 1
          if (e.reason === "ToolFailed") {
            // the toolbox's own refusal (maybe padded by a long-answer fault), or the injected one
            const expected = tool === "divide" ? /^(division by zero|chaos: injected tool error)/ : /^chaos: injected/
            assert.match(e.message, expected)
          } else {
            assert.include(["Timeout", "Disconnected"], e.reason, `call ${i}: ${e.reason} ${e.message}`)
          }
        }
        // every fault happened, and was survived
        for (const fault of ["crash", "hang", "malformed", "error", "long", "bad_utf8"]) {
          assert.isAbove(times(fault), 0, `no ${fault} was injected`)
        }
        assert.isAbove(replaced, 0, "no answer carried replacement characters")
        assert.isAbove(truncated, 0, "no answer was truncated")
        assert.isAbove(answered, calls / 2)
        assert.strictEqual(stats["mcp/errors"], calls - answered)
        // a crash reaches the caller only once the call was charged more than `retries` deliveries (before the charge
        // was shared among the calls a crash took down, most crashes reached every caller in flight)
        const crashes = stats["mcp/restarts"]
        assert.isAbove(crashes, 0)
        assert.isBelow(reasons["Disconnected"] ?? 0, crashes / 2, JSON.stringify({ reasons, stats }))

        // no orphans: every server that started, and the `sleep 600` it left in its process group, is gone
        const starts = Servers.readLines(log)
          .filter((l) => l.startsWith("start "))
          .map((l) => l.split(" ").slice(1).map(Number) as [number, number])
        assert.strictEqual(starts.length, stats["mcp/connects"])
        for (const [pid, grandchild] of starts) {
          assert.isTrue(Servers.diesWithin(pid, 2000), `server ${pid} outlived the client`)
          assert.isTrue(Servers.diesWithin(grandchild, 2000), `grandchild ${grandchild} outlived the client`)
          assert.deepStrictEqual(Servers.groupMembers(pid), [], `process group ${pid} outlived the client`)
        }
      }).pipe(Effect.provideService(References.MinimumLogLevel, "Error")) // dozens of restart warnings
  )
})
