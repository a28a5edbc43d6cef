/**
 * A stdio MCP server for the interruption test: `wait` never answers on its own; when the client cancels the request
 * (`notifications/cancelled`), the server-side signal aborts and `cancelled` is appended to CANCEL_PROBE_LOG.
 */
import { appendFileSync } from "node:fs"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js"

const log = process.env["CANCEL_PROBE_LOG"] ?? ""
const server = new McpServer({ name: "cancel-probe", version: "0.0.1" })
server.registerTool(
  "wait",
  { description: "answers only when cancelled" },
  (extra) =>
    new Promise(() => {
      appendFileSync(log, "started\n")
      extra.signal.addEventListener("abort", () => appendFileSync(log, "cancelled\n"))
    })
)
await server.connect(new StdioServerTransport())
