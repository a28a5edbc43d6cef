/**
 * A stdio MCP server for the write-coalescing test: `reads` answers how many chunks the server has read from its
 * stdin so far (one per `data` event), `echo` answers its argument.
 */
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js"
import * as z from "zod"

let reads = 0
process.stdin.on("data", () => {
  reads++
})
const server = new McpServer({ name: "read-probe", version: "0.0.1" })
server.registerTool("reads", { description: "stdin chunks read so far" }, () => ({
  content: [{ type: "text", text: String(reads) }]
}))
server.registerTool("echo", { description: "answers n", inputSchema: { n: z.number() } }, ({ n }) => ({
  content: [{ type: "text", text: String(n) }]
}))
await server.connect(new StdioServerTransport())
