/**
 * `data generate llm` and `data generate mcp` as users run them: the CLI in its own process against a real
 * OpenAI-compatible HTTP server (the TaskWriter fixture, answering from the tools it is shown), `--replay` from the
 * raw log with no server, `--force`, and `mcp` over the bundled toolbox MCP server, whose rows then run on
 * McpToolEnv with that server.
 */
import { spawn } from "node:child_process"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import * as McpToolEnv from "../../src/env/McpToolEnv.ts"
import * as Rewards from "../../src/env/Rewards.ts"
import * as ToolIo from "../../src/env/ToolIo.ts"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as Servers from "../env/McpServers.ts"
import * as ChatServer from "../fixtures/ChatServer.ts"
import * as TaskWriter from "../fixtures/TaskWriter.ts"

interface Run {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
  readonly last: Record<string, unknown>
}

/** The CLI in a child process, awaited without blocking this process (the fixture server runs here). */
const cli = (args: ReadonlyArray<string>): Promise<Run> =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, ["src/main.ts", ...args], { env: { ...process.env, NO_COLOR: "1" } })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
    child.on("close", (code) => {
      const lines = stdout.trim().split("\n")
      let last: Record<string, unknown> = {}
      try {
        last = JSON.parse(lines[lines.length - 1] ?? "{}") as Record<string, unknown>
      } catch {
        // not JSON: the test's asserts say what was printed
      }
      resolve({ code: code ?? -1, stdout, stderr, last })
    })
  })

const rowsOf = (file: string): ReadonlyArray<PromptRow> =>
  readFileSync(file, "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as PromptRow)

let server: ChatServer.ChatServer
const dir = mkdtempSync(join(tmpdir(), "gen-"))

beforeAll(async () => {
  server = await ChatServer.start((seen) => TaskWriter.answer(seen))
})
afterAll(() => server.close())

describe("data generate llm", () => {
  it("writes validated, de-duplicated rows and the raw log; --replay gives the same bytes with no server", async () => {
    const toolsFile = join(dir, "tools.json")
    writeFileSync(
      toolsFile,
      JSON.stringify([
        {
          name: "convert_currency",
          description: "amount from one currency to another",
          inputSchema: {
            type: "object",
            properties: {
              amount: { type: "number", minimum: 0 },
              from: { type: "string", enum: ["USD", "EUR", "JPY"] },
              to: { type: "string", enum: ["USD", "EUR", "JPY"] }
            },
            required: ["amount", "from", "to"]
          }
        },
        {
          name: "lookup_rate",
          inputSchema: { type: "object", properties: { pair: { type: "string" } }, required: ["pair"] }
        }
      ])
    )
    const out = join(dir, "llm", "train.jsonl")
    const base = ["data", "generate", "llm", "--tools", toolsFile, "--count", "7", "--batch", "3", "--seed", "4"]
    const first = await cli([...base, "--url", server.url, "--model", "writer", "--out", out])
    assert.strictEqual(first.code, 0, first.stderr)
    assert.match(
      first.stderr,
      /call 1: \S.* \/ \S.*: kept 3, rejected 3 \(tool_sequence\[0\]\.tool: "no_such_tool" is not a tool/
    )
    assert.deepStrictEqual(first.last, {
      out,
      raw: join(dir, "llm", "train.raw.jsonl"),
      rows: 7,
      calls: 3,
      rejected: 4, // invalid (an unknown tool, bad arguments) in each of the first two calls; the third stopped at 7
      duplicates: 2,
      prompt_tokens: 30,
      completion_tokens: 15,
      replayed: false
    })
    const rows = rowsOf(out)
    assert.strictEqual(new Set(rows.map((r) => r.prompt[0]!.content.toLowerCase())).size, 7)
    const raw = readFileSync(join(dir, "llm", "train.raw.jsonl"), "utf8")
      .trim()
      .split("\n")
    assert.strictEqual(raw.length, 4) // header + one line per call: the prompt asked and the answer, verbatim
    const call = JSON.parse(raw[1]!) as {
      record: { request: { messages: Array<{ content: string }> }; content: string }
    }
    assert.match(call.record.request.messages[0]!.content, /"name":"convert_currency"/)
    assert.include(call.record.content, "no_such_tool")

    const again = await cli([...base, "--url", server.url, "--model", "writer", "--out", out])
    assert.strictEqual(again.code, 1)
    assert.match(again.stderr, /exist: pass --force to overwrite, or --out another place/)

    const seenBefore = server.seen.length
    const replayOut = join(dir, "llm", "replayed.jsonl")
    const replay = await cli([
      "data",
      "generate",
      "llm",
      "--replay",
      join(dir, "llm", "train.raw.jsonl"),
      "--out",
      replayOut
    ])
    assert.strictEqual(replay.code, 0, replay.stderr)
    assert.strictEqual(replay.last["replayed"], true)
    assert.strictEqual(server.seen.length, seenBefore) // nothing asked
    assert.strictEqual(readFileSync(replayOut, "utf8"), readFileSync(out, "utf8"))
    assert.strictEqual(
      readFileSync(join(dir, "llm", "replayed.raw.jsonl"), "utf8"),
      readFileSync(join(dir, "llm", "train.raw.jsonl"), "utf8")
    )
  }, 60_000)
})

describe("data generate mcp", () => {
  it.effect(
    "tasks from the toolbox server's own schemas; rows name the server and run on McpToolEnv with it",
    () =>
      Effect.gen(function* () {
        const out = join(dir, "mcp", "toolbox.jsonl")
        const run = yield* Effect.promise(() =>
          cli([
            "data",
            "generate",
            "mcp",
            "--command",
            "node src/toolbox/server.ts",
            "--name",
            "toolbox",
            "--url",
            server.url,
            "--model",
            "writer",
            "--count",
            "40",
            "--batch",
            "8",
            "--seed",
            "1",
            "--out",
            out
          ])
        )
        assert.strictEqual(run.code, 0, run.stderr)
        assert.strictEqual(run.last["rows"], 40)
        const rows = rowsOf(out)
        // the writer was shown the toolbox's 11 tools, with their schemas
        const system = (server.seen.at(-1)!.body["messages"] as Array<{ content: string }>)[0]!.content
        assert.match(system, /"name":"find_customer".*"required":\["name"\]/)
        assert.match(system, /MCP server/)
        for (const row of rows) {
          assert.strictEqual(row.data_source, "mcp_tasks/toolbox")
          assert.strictEqual(row.extra_info?.["server"], "toolbox")
          const truth = Rewards.decodeGroundTruth(row.reward_spec!.ground_truth).pipe(Effect.runSync)
          for (const call of truth.tool_sequence!) assert.strictEqual(call.server, "toolbox")
        }
        // a row whose calls are all arithmetic, solved through McpToolEnv on the toolbox: the rule reward pays 1
        const arithmetic = new Set(["add", "subtract", "multiply"])
        const row = rows.find((r) =>
          (r.reward_spec!.ground_truth as { tool_sequence: Array<{ tool: string }> }).tool_sequence.every((c) =>
            arithmetic.has(c.tool)
          )
        )
        assert.isDefined(row)
        const truth = yield* Rewards.decodeGroundTruth(row!.reward_spec!.ground_truth)
        const env = yield* McpToolEnv.make(row!, { toolCallFormat: "hermes", maxTurns: 6 })
        yield* env.init(row!.prompt)
        let reward = 0
        for (const c of truth.tool_sequence!) {
          reward = (yield* env.step(
            `<tool_call>${JSON.stringify({ name: c.tool, arguments: c.arguments })}</tool_call>`
          )).reward
        }
        reward = (yield* env.step(`<answer>${truth.answer ?? "done"}</answer>`)).reward
        assert.strictEqual(reward, 1)
      }).pipe(
        Effect.scoped,
        Effect.provide(ToolIo.layerLive.pipe(Layer.provide(McpClient.layer({ servers: [Servers.toolbox()] }))))
      ),
    60_000
  )
})
