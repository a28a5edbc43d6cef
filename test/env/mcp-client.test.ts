import { spawnSync } from "node:child_process"
import { mkdirSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Exit, Fiber, Logger, References } from "effect"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as Servers from "./McpServers.ts"

const flipCall = (c: McpClient.McpClient["Service"], name: string, args: Record<string, unknown>) =>
  Effect.flip(c.call(name, args))

layer(McpClient.layer({ servers: [Servers.toolbox()] }), { excludeTestServices: true })(
  "McpClient over stdio (toolbox)",
  (it) => {
    it.effect("lists the toolbox tools once, un-namespaced when one server is mounted", () =>
      Effect.gen(function* () {
        const client = yield* McpClient.McpClient
        const tools = yield* client.tools
        assert.deepStrictEqual(tools.map((t) => t.name).slice(0, 4), ["add", "subtract", "multiply", "divide"])
        const add = tools.find((t) => t.name === "add")!
        assert.strictEqual(add.server, "toolbox")
        assert.isTrue(add.readOnly)
        assert.deepStrictEqual(Object.keys(add.inputSchema["properties"] as object), ["a", "b"])
        assert.strictEqual((yield* client.stats)["mcp/connects"], 1)
      })
    )

    it.effect("chained record lookups: Carol Evans → C003 → 3 orders → pen ×10 at 3", () =>
      Effect.gen(function* () {
        const client = yield* McpClient.McpClient
        assert.strictEqual((yield* client.call("find_customer", { name: "carol evans" })).text, "C003")
        assert.strictEqual((yield* client.call("get_orders", { customer_id: "C003" })).text, "O1004,O1005,O1006")
        assert.deepStrictEqual(JSON.parse((yield* client.call("get_order", { order_id: "O1004" })).text), {
          item: "pen",
          price: 3,
          qty: 10
        })
        assert.strictEqual((yield* client.call("convert_units", { value: 100, from: "c", to: "f" })).text, "212")
        assert.strictEqual((yield* client.call("date_add", { date: "2024-02-28", days: 2 })).text, "2024-03-01")
        assert.strictEqual((yield* client.call("add", { a: 0.1, b: 0.2 })).text, "0.3")
        assert.strictEqual((yield* client.call("date_diff", { start: "2024-01-01", end: "2024-03-01" })).text, "60")
        assert.strictEqual((yield* client.call("day_of_week", { date: "2024-03-01" })).text, "Friday")
        const units = yield* flipCall(client, "convert_units", { value: 1, from: "kg", to: "m" })
        assert.strictEqual(units.message, "cannot convert mass to length")
        const date = yield* flipCall(client, "date_add", { date: "2024-02-30", days: 1 })
        assert.strictEqual(date.message, "bad date: 2024-02-30 (want YYYY-MM-DD)")
      })
    )

    it.effect("tool failures are typed: ToolFailed, BadArguments, UnknownTool (no round trip)", () =>
      Effect.gen(function* () {
        const client = yield* McpClient.McpClient
        const div = yield* flipCall(client, "divide", { a: 1, b: 0 })
        assert.strictEqual(div.reason, "ToolFailed")
        assert.strictEqual(div.message, "division by zero")
        assert.isFalse(div.isRetryable)
        const bad = yield* flipCall(client, "add", { a: "x", b: 1 })
        assert.strictEqual(bad.reason, "BadArguments")
        assert.match(bad.message, /expected number/)
        const unknown = yield* flipCall(client, "sqrt", { x: 4 })
        assert.strictEqual(unknown.reason, "UnknownTool")
        assert.match(unknown.message, /available: add, subtract/)
      })
    )

    it.effect("64 concurrent calls on one shared connection all answer correctly", () =>
      Effect.gen(function* () {
        const client = yield* McpClient.McpClient
        const results = yield* Effect.forEach(
          Array.from({ length: 64 }, (_, i) => i),
          (i) => client.call("multiply", { a: i, b: 3 }),
          { concurrency: "unbounded" }
        )
        assert.deepStrictEqual(
          results.map((r) => r.text),
          Array.from({ length: 64 }, (_, i) => String(i * 3))
        )
      })
    )
  }
)

layer(McpClient.layer({ servers: [Servers.readProbe()] }), { excludeTestServices: true })(
  "McpClient over stdio: requests sent together share a pipe write",
  (it) => {
    it.effect("64 calls started at once reach the server in one or two reads, not 64", () =>
      Effect.gen(function* () {
        const client = yield* McpClient.McpClient
        const reads = client.call("reads", {}).pipe(Effect.map((r) => Number(r.text)))
        const before = yield* reads
        const echoed = yield* Effect.forEach(
          Array.from({ length: 64 }, (_, i) => i),
          (i) => client.call("echo", { n: i }),
          { concurrency: "unbounded" }
        )
        assert.deepStrictEqual(
          echoed.map((r) => r.text),
          Array.from({ length: 64 }, (_, i) => String(i))
        )
        const after = yield* reads
        // the burst's reads: `after` also counts the read of its own request
        const burst = after - before - 1
        assert.isAtLeast(burst, 1)
        assert.isAtMost(burst, 2, `the server read the 64 requests in ${burst} chunks`)
      })
    )
  }
)

describe("McpClient with the reference servers", () => {
  it.live("the toolbox simulates slow tools: TOOLBOX_LATENCY_MS=150 delays every call by 150 ms", () =>
    Effect.gen(function* () {
      const client = yield* McpClient.make({ servers: [Servers.toolbox({ env: { TOOLBOX_LATENCY_MS: "150" } })] })
      const start = performance.now()
      assert.strictEqual((yield* client.call("add", { a: 1, b: 1 })).text, "2")
      assert.isAtLeast(performance.now() - start, 150)
    })
  )

  it.live("server-everything: env is only the config's plus PATH/HOME; results are capped and marked", () =>
    Effect.gen(function* () {
      const client = yield* McpClient.make({
        servers: [Servers.everything({ env: { MY_SETTING: "on" } })],
        maxResultChars: 40
      })
      const env = yield* client.call("get-env", {})
      assert.isTrue(env.truncated)
      assert.match(env.text, /…\[truncated \d+ chars\]$/)
      const wide = yield* McpClient.make({ servers: [Servers.everything({ env: { MY_SETTING: "on" } })] })
      const vars = JSON.parse((yield* wide.call("get-env", {})).text) as Record<string, string>
      assert.strictEqual(vars["MY_SETTING"], "on")
      const unexpected = Object.keys(vars).filter((k) => !["MY_SETTING", "PATH", "HOME"].includes(k))
      assert.deepStrictEqual(unexpected, [])
      assert.strictEqual((yield* wide.call("get-sum", { a: 2, b: 40 })).text, "The sum of 2 and 40 is 42.")
    })
  )

  it.live("server-memory (stateful, shared): an entity created by one call is read by the next", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("memory")
      const client = yield* McpClient.make({ servers: [Servers.memory(join(dir, "memory.jsonl"))] })
      yield* client.call("create_entities", {
        entities: [{ name: "Ada", entityType: "person", observations: ["wrote the first program"] }]
      })
      const graph = yield* client.call("read_graph", {})
      assert.match(graph.text, /wrote the first program/)
    })
  )

  it.live("two servers: tools are namespaced server__tool and allow-listed per server", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("fs")
      writeFileSync(join(dir, "note.txt"), "hello from disk")
      const client = yield* McpClient.make({
        servers: [
          Servers.toolbox({ allowed_tools: ["add"] }),
          Servers.filesystem(dir, { allowed_tools: ["read_text_file"] })
        ]
      })
      const names = (yield* client.tools).map((t) => t.name)
      assert.deepStrictEqual(names, ["toolbox__add", "fs__read_text_file"])
      assert.strictEqual((yield* client.call("toolbox__add", { a: 1, b: 2 })).text, "3")
      assert.strictEqual(
        (yield* client.call("fs__read_text_file", { path: join(dir, "note.txt") })).text,
        "hello from disk"
      )
      const hidden = yield* flipCall(client, "toolbox__divide", { a: 1, b: 1 })
      assert.strictEqual(hidden.reason, "UnknownTool")
    })
  )

  it.live("a command that does not exist fails to connect with McpConnectError(Spawn)", () =>
    Effect.gen(function* () {
      const exit = yield* Effect.exit(
        McpClient.make({ servers: [Servers.config({ name: "ghost", command: "/nonexistent/mcp-server" })], retries: 1 })
      )
      assert.isTrue(Exit.isFailure(exit))
      const error = yield* Effect.flip(
        McpClient.make({ servers: [Servers.config({ name: "ghost", command: "/nonexistent/mcp-server" })], retries: 1 })
      )
      assert.strictEqual(error._tag, "McpConnectError")
      assert.strictEqual(error.reason, "Spawn")
      assert.strictEqual(error.server, "ghost")
    })
  )
})

describe("McpClient over Streamable HTTP", () => {
  it.live("server-everything streamableHttp: list and call over a session; the session is closed with the scope", () =>
    Effect.gen(function* () {
      const server = yield* Effect.acquireRelease(
        Effect.promise(() => Servers.startEverythingHttp()),
        (s) => Effect.promise(() => s.stop())
      )
      const client = yield* McpClient.make({
        servers: [
          Servers.config({ name: "everything", transport: "http", url: server.url, headers: { "x-test": "1" } })
        ]
      })
      const names = (yield* client.tools).map((t) => t.name)
      assert.include(names, "echo")
      assert.strictEqual((yield* client.call("echo", { message: "over http" })).text, "Echo: over http")
      assert.deepStrictEqual(yield* client.processIds, []) // nothing spawned by the client
    })
  )

  it.live("toolbox --http: stateless server; a refused connection is McpConnectError(Unreachable)", () =>
    Effect.gen(function* () {
      const server = yield* Effect.acquireRelease(
        Effect.promise(() => Servers.startToolboxHttp()),
        (s) => Effect.promise(() => s.stop())
      )
      const client = yield* McpClient.make({
        servers: [Servers.config({ name: "toolbox", transport: "http", url: server.url })]
      })
      assert.strictEqual((yield* client.call("subtract", { a: 10, b: 4 })).text, "6")
      const port = yield* Effect.promise(() => Servers.freePort())
      const refused = yield* Effect.flip(
        McpClient.make({
          servers: [Servers.config({ name: "down", transport: "http", url: `http://127.0.0.1:${port}/mcp` })],
          retries: 1
        })
      )
      assert.strictEqual(refused.reason, "Unreachable")
    })
  )
})

describe("McpClient recovers an HTTP session", () => {
  it.live("a server restarted on the same port forgot the session (404): the call reconnects and succeeds once", () =>
    Effect.gen(function* () {
      const first = yield* Effect.promise(() => Servers.startEverythingHttp())
      const client = yield* McpClient.make({
        servers: [Servers.config({ name: "everything", transport: "http", url: first.url })]
      })
      assert.strictEqual((yield* client.call("echo", { message: "one" })).text, "Echo: one")
      yield* Effect.promise(() => first.stop())
      const second = yield* Effect.acquireRelease(
        Effect.promise(() => Servers.startEverythingHttp(first.port)),
        (s) => Effect.promise(() => s.stop())
      )
      assert.strictEqual(second.port, first.port)
      assert.strictEqual((yield* client.call("echo", { message: "two" })).text, "Echo: two")
      const stats = yield* client.stats
      assert.strictEqual(stats["mcp/restarts"], 1)
      assert.strictEqual(stats["mcp/retries"], 1)
    })
  )
})

describe("McpClient against a faulty server", () => {
  const countOf = (dir: string, tool: string) =>
    Servers.readLines(join(dir, "calls.log")).filter((l) => l === tool).length

  it.live(
    "a crash mid-call of a stateful tool is Disconnected, never re-driven; the next call restarts the server",
    () =>
      Effect.gen(function* () {
        const dir = Servers.tempDir("faulty")
        const client = yield* McpClient.make({ servers: [Servers.faulty(dir)] })
        assert.strictEqual((yield* client.call("incr", {})).text, "1")
        const crash = yield* flipCall(client, "crash_once", {})
        assert.strictEqual(crash.reason, "Disconnected")
        assert.isTrue(crash.isRetryable)
        assert.strictEqual(countOf(dir, "crash_once"), 1) // delivered once, not re-sent
        // restarted: a fresh process, so the counter starts again
        assert.strictEqual((yield* client.call("incr", {})).text, "1")
        assert.strictEqual((yield* client.call("crash_once", {})).text, "survived")
        const stats = yield* client.stats
        assert.strictEqual(stats["mcp/restarts"], 1)
        assert.strictEqual(stats["mcp/retries"], 0)
      })
  )

  it.live("a read-only tool on a shared server is re-driven after a crash and after a timeout", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("faulty")
      const client = yield* McpClient.make({ servers: [Servers.faulty(dir)] })
      assert.strictEqual((yield* client.call("crash_once_readonly", {})).text, "survived")
      assert.strictEqual(countOf(dir, "crash_once_readonly"), 2)
      assert.strictEqual((yield* client.call("hang_once_readonly", {})).text, "late but fine")
      assert.strictEqual(countOf(dir, "hang_once_readonly"), 2)
      const stats = yield* client.stats
      assert.strictEqual(stats["mcp/retries"], 2)
      assert.strictEqual(stats["mcp/restarts"], 1)
    })
  )

  const logs: Array<string> = []
  it.live("a hanging stateful tool times out once (Timeout, not re-sent); garbage and bad results are typed", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("faulty")
      const client = yield* McpClient.make({ servers: [Servers.faulty(dir)] })
      const hang = yield* flipCall(client, "hang", {})
      assert.strictEqual(hang.reason, "Timeout")
      assert.match(hang.message, /timed out after 400 ms/)
      assert.strictEqual(countOf(dir, "hang"), 1)
      assert.strictEqual((yield* client.call("garbage", {})).text, "ok") // the stray line is skipped and logged
      const bad = yield* flipCall(client, "bad_result", {})
      assert.strictEqual(bad.reason, "ServerError")
      // the connection survived all of it
      assert.strictEqual((yield* client.call("incr", {})).text, "1")
      yield* Effect.sleep("50 millis") // let the log fiber drain
      assert.isTrue(logs.some((l) => l.includes("faulty server up"))) // the server's stderr
      assert.isTrue(logs.some((l) => l.includes("[not JSON-RPC on stdout]")))
    }).pipe(
      Effect.provide(Logger.layer([Logger.make((o) => void logs.push(String(o.message)))])),
      Effect.provideService(References.MinimumLogLevel, "Debug")
    )
  )

  it.live("tools/list_changed: a tool the server adds at run time joins the cached list and can be called", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("faulty")
      const client = yield* McpClient.make({ servers: [Servers.faulty(dir)] })
      assert.isFalse((yield* client.tools).some((t) => t.name === "late_tool"))
      assert.strictEqual((yield* client.call("add_tool", {})).text, "added")
      for (let i = 0; i < 50 && !(yield* client.tools).some((t) => t.name === "late_tool"); i++) {
        yield* Effect.sleep("20 millis")
      }
      assert.strictEqual((yield* client.call("late_tool", {})).text, "late")
    })
  )

  it.live(
    "per_trajectory isolation: each session gets its own process, killed (with its children) with the scope",
    () =>
      Effect.gen(function* () {
        const dir = Servers.tempDir("faulty")
        const client = yield* McpClient.make({ servers: [Servers.faulty(dir, { isolation: "per_trajectory" })] })
        const defaultPids = yield* client.processIds
        const seen = yield* Effect.scoped(
          Effect.gen(function* () {
            const a = yield* client.session
            const b = yield* client.session
            assert.strictEqual((yield* a.call("incr", {})).text, "1")
            assert.strictEqual((yield* a.call("incr", {})).text, "2")
            assert.strictEqual((yield* b.call("incr", {})).text, "1") // b does not see a's state
            const grandchild = Number((yield* a.call("spawn_child", {})).text)
            const pids = [...(yield* a.processIds), ...(yield* b.processIds)]
            assert.strictEqual(pids.length, 2)
            assert.isTrue(pids.every(Servers.alive) && Servers.alive(grandchild))
            return { pids, grandchild }
          })
        )
        // the faulty server ignores stdin EOF: the client had to signal its process group
        assert.isFalse(seen.pids.some(Servers.alive))
        assert.isFalse(Servers.alive(seen.grandchild))
        assert.deepStrictEqual(yield* client.processIds, defaultPids)
      })
  )

  it("no orphan when the run crashes without closing its scope: the exit hook kills the server's group", () => {
    const dir = Servers.tempDir("crash")
    // inside the repository (test/.tmp is git-ignored), so that "effect" resolves from node_modules
    const tmp = join(import.meta.dirname, "../.tmp")
    mkdirSync(tmp, { recursive: true })
    const script = join(tmp, `crash-${process.pid}.ts`)
    writeFileSync(
      script,
      [
        `import { Effect, Schema, Scope } from "effect"`,
        `import * as McpClient from ${JSON.stringify(Servers.mcpClientModule)}`,
        `import { McpServerConfig } from ${JSON.stringify(join(import.meta.dirname, "../../src/config/EnvironmentConfig.ts"))}`,
        `const server = Schema.decodeUnknownSync(McpServerConfig)({ name: "faulty", command: "node", args: [${JSON.stringify(Servers.faultyScript)}], env: { FAULTY_STATE_DIR: ${JSON.stringify(dir)} } })`,
        `const scope = Effect.runSync(Scope.make())`,
        `const client = await Effect.runPromise(McpClient.make({ servers: [server] }).pipe(Scope.provide(scope)))`,
        `const pids = await Effect.runPromise(client.processIds)`,
        `const grandchild = await Effect.runPromise(client.call("spawn_child", {}))`,
        `console.log(JSON.stringify({ pids, grandchild: Number(grandchild.text) }))`,
        `throw new Error("the run crashed")`
      ].join("\n")
    )
    const out = spawnSync(process.execPath, [script], { encoding: "utf8", timeout: 30_000 })
    rmSync(script)
    assert.notStrictEqual(out.status, 0)
    assert.match(out.stderr, /the run crashed/)
    const seen = JSON.parse(out.stdout.trim().split("\n").pop() ?? "{}") as { pids: Array<number>; grandchild: number }
    assert.strictEqual(seen.pids.length, 1)
    assert.isTrue(Servers.diesWithin(seen.pids[0]!, 2000))
    assert.isTrue(Servers.diesWithin(seen.grandchild, 2000))
  })

  it.live("interrupting a call cancels it on the server (notifications/cancelled); the connection stays usable", () =>
    Effect.gen(function* () {
      const log = join(Servers.tempDir("cancel"), "probe.log")
      const client = yield* McpClient.make({ servers: [Servers.cancelProbe(log, { timeout_ms: 10_000 })] })
      const started = Date.now()
      const call = yield* Effect.forkChild(client.call("wait", {}))
      yield* Effect.sleep("300 millis")
      yield* Fiber.interrupt(call)
      assert.isBelow(Date.now() - started, 5_000) // not the call's 10 s timeout
      for (let i = 0; i < 100 && !Servers.readLines(log).includes("cancelled"); i++) yield* Effect.sleep("20 millis")
      assert.deepStrictEqual(Servers.readLines(log), ["started", "cancelled"])
      const again = yield* Effect.forkChild(client.call("wait", {}))
      yield* Effect.sleep("300 millis")
      yield* Fiber.interrupt(again)
      for (let i = 0; i < 100 && Servers.readLines(log).length < 4; i++) yield* Effect.sleep("20 millis")
      assert.deepStrictEqual(Servers.readLines(log), ["started", "cancelled", "started", "cancelled"])
    }).pipe(Effect.scoped)
  )

  it.live("no orphan: closing the client's scope kills a server stuck in a hanging call", () =>
    Effect.gen(function* () {
      const dir = Servers.tempDir("faulty")
      const pids = yield* Effect.scoped(
        Effect.gen(function* () {
          const client = yield* McpClient.make({ servers: [Servers.faulty(dir, { timeout_ms: 10_000 })] })
          yield* Effect.forkScoped(client.call("hang", {}))
          yield* Effect.sleep("100 millis")
          return yield* client.processIds
        })
      )
      assert.strictEqual(pids.length, 1)
      assert.isFalse(Servers.alive(pids[0]!))
    })
  )
})
