import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"
import * as Servers from "./McpServers.ts"

const toolboxCommand = `node ${Servers.toolboxScript}`

describe("effect-rl tools", () => {
  it("list --command prints every tool with its schema, then a JSON array as the last line", () => {
    const out = Cli.run(["tools", "list", "--command", toolboxCommand])
    assert.strictEqual(out.code, 0, out.stderr)
    assert.match(out.stdout, /^find_customer — customer id for a full name$/m)
    const tools = JSON.parse(out.lastLine) as Array<{ name: string; inputSchema: { required: Array<string> } }>
    assert.strictEqual(tools.length, 11)
    assert.deepStrictEqual(tools.find((t) => t.name === "get_order")?.inputSchema.required, ["order_id"])
  })

  it("call prints the result as JSON; a tool error exits 1 with the server's message", () => {
    const ok = Cli.run(["tools", "call", "multiply", "--args", '{"a": 6, "b": 7}', "--command", toolboxCommand])
    assert.strictEqual(ok.code, 0, ok.stderr)
    assert.deepStrictEqual(JSON.parse(ok.lastLine), { tool: "multiply", server: "server", isError: false, text: "42" })
    const bad = Cli.run(["tools", "call", "divide", "--args", '{"a": 1, "b": 0}', "--command", toolboxCommand])
    assert.strictEqual(bad.code, 1)
    assert.strictEqual(JSON.parse(bad.lastLine).text, "division by zero")
    assert.match(bad.stderr, /divide failed \(ToolFailed\): division by zero/)
  })

  it("--config picks a server by name from environment.mcp_servers", () => {
    const dir = Servers.tempDir("cli")
    const file = join(dir, "run.yaml")
    writeFileSync(
      file,
      [
        "environment:",
        "  mcp_servers:",
        "    - name: toolbox",
        "      command: node",
        `      args: [${JSON.stringify(Servers.toolboxScript)}]`,
        "      allowed_tools: [find_customer, get_orders]"
      ].join("\n")
    )
    const listed = Cli.run(["tools", "list", "--config", file, "--server", "toolbox"])
    assert.strictEqual(listed.code, 0, listed.stderr)
    assert.deepStrictEqual(
      (JSON.parse(listed.lastLine) as Array<{ name: string }>).map((t) => t.name),
      ["find_customer", "get_orders"]
    )
    const called = Cli.run(["tools", "call", "get_orders", "--args", '{"customer_id":"C001"}', "--config", file])
    assert.strictEqual(JSON.parse(called.lastLine).text, "O1001,O1002")
    const missing = Cli.run(["tools", "list", "--config", file, "--server", "nope"])
    assert.strictEqual(missing.code, 1)
    assert.match(missing.stderr, /no MCP server "nope"/)
  })
})
