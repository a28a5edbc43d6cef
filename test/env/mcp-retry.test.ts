/**
 * McpClient's retry rule when a server crashes under an idempotent call: the call is re-driven on a restarted server
 * until its own attempts (`retries`) are spent. A crash it only shared with other calls in flight, and a restart that
 * failed before the call was sent, are not its attempts.
 */
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as Servers from "./McpServers.ts"

const tool = "crash_sometimes_idempotent"
const deliveries = (dir: string) => Servers.readLines(join(dir, "calls.log")).filter((l) => l === tool).length
/** The faulty server with the given crash plans (cyclic `x`/`.` patterns over deliveries and over starts). */
const crashing = (dir: string, env: Record<string, string>) => Servers.faulty(dir, { env, timeout_ms: 5_000 })

describe("McpClient re-drives an idempotent call through crashes", () => {
  it.live("two crashes in a row, then an answer: the call succeeds on its third delivery (retries: 2)", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("retry")
      const client = yield* McpClient.make({ servers: [crashing(dir, { FAULTY_CRASH_PLAN: "xx." })], retries: 2 })
      assert.strictEqual((yield* client.call(tool, {})).text, "answered #2")
      assert.strictEqual(deliveries(dir), 3)
      const stats = yield* client.stats
      assert.deepStrictEqual([stats["mcp/retries"], stats["mcp/restarts"], stats["mcp/errors"]], [2, 2, 0])
    }).pipe(Effect.scoped)
  )

  it.live("three crashes in a row spend retries: 2; the call fails once, as Disconnected", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("retry")
      const client = yield* McpClient.make({ servers: [crashing(dir, { FAULTY_CRASH_PLAN: "xxx." })], retries: 2 })
      const error = yield* Effect.flip(client.call(tool, {}))
      assert.strictEqual(error._tag, "ToolCallError")
      assert.strictEqual(error.reason, "Disconnected")
      assert.strictEqual(deliveries(dir), 3)
      assert.strictEqual((yield* client.stats)["mcp/errors"], 1)
      // the server is restarted for the next call, which lands on the plan's `.`
      assert.strictEqual((yield* client.call(tool, {})).text, "answered #3")
    }).pipe(Effect.scoped)
  )

  it.live("restarts that crash during the handshake are not re-drives: the call still gets its second delivery", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("retry")
      // delivery 0 crashes; starts 1 and 2 (the reconnects) die before `initialize`; start 3 answers delivery 1
      const server = crashing(dir, { FAULTY_CRASH_PLAN: "x.", FAULTY_BOOT_PLAN: ".xx." })
      const client = yield* McpClient.make({ servers: [server], retries: 2 })
      assert.strictEqual((yield* client.call(tool, {})).text, "answered #1")
      assert.strictEqual(deliveries(dir), 2)
      const stats = yield* client.stats
      assert.strictEqual(stats["mcp/connects"], 4)
      assert.strictEqual(stats["mcp/errors"], 0)
    }).pipe(Effect.scoped)
  )

  it.live("6 calls at once, each crashing the server on its first delivery: every call succeeds on its second", () =>
    Effect.gen(function* () {
      // One at a time, each call would crash once and then answer. Sent together, each crash also takes down the
      // other calls in flight: those crashes are not theirs, and must not spend their retries.
      const dir = Servers.tempDir("retry")
      const client = yield* McpClient.make({ servers: [crashing(dir, { FAULTY_CRASH_PLAN: "x." })], retries: 2 })
      const keys = ["a", "b", "c", "d", "e", "f"]
      const results = yield* Effect.forEach(keys, (key) => Effect.result(client.call(tool, { key })), {
        concurrency: "unbounded"
      })
      const failures = results.flatMap((r) => (r._tag === "Failure" ? [r.failure.message] : []))
      assert.deepStrictEqual(failures, [])
      assert.deepStrictEqual(
        results.map((r) => (r._tag === "Success" ? r.success.text : "")),
        keys.map(() => "answered #1")
      )
      const stats = yield* client.stats
      assert.strictEqual(stats["mcp/restarts"], keys.length)
      assert.strictEqual(stats["mcp/errors"], 0)
    }).pipe(Effect.scoped)
  )
})
