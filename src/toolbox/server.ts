/**
 * Entry point of the bundled toolbox MCP server.
 *
 *   node src/toolbox/server.ts                     # stdio
 *   node src/toolbox/server.ts --http 8931         # Streamable HTTP on http://127.0.0.1:8931/mcp (0 = any free port)
 *   node src/toolbox/server.ts --latency-ms 50     # or TOOLBOX_LATENCY_MS=50: every call waits 50 ms
 *   node src/toolbox/server.ts --latency-ms 50-200 # each call waits a uniformly random 50–200 ms
 *
 * HTTP mode is stateless (a fresh server per request, no session id): the toolbox keeps no state, so any replica can
 * answer any request. It binds to 127.0.0.1 only and prints `listening on <url>` to stderr once ready.
 */

import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js"
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js"
import * as Toolbox from "./Toolbox.ts"

const argValue = (flag: string): string | undefined => {
  const i = process.argv.indexOf(flag)
  return i >= 0 ? process.argv[i + 1] : undefined
}

const latencyText = argValue("--latency-ms") ?? process.env["TOOLBOX_LATENCY_MS"] ?? "0"
const latency = Toolbox.parseLatency(latencyText)
if (latency === undefined) {
  process.stderr.write(`toolbox: bad latency ${latencyText} (want MS or MIN-MAX)\n`)
  process.exit(2)
}
const options: Toolbox.ToolboxOptions = { latencyMs: latency[0], latencyMaxMs: latency[1] }
const httpPort = argValue("--http")

if (httpPort === undefined) {
  const server = Toolbox.make(options)
  await server.connect(new StdioServerTransport())
  // The client closing our stdin is the end of the session: never linger as an orphan.
  process.stdin.on("end", () => process.exit(0))
} else {
  const http = createServer((req, res) => {
    if (req.url?.split("?")[0] !== "/mcp") {
      res.writeHead(404).end()
      return
    }
    if (req.method !== "POST") {
      res.writeHead(405, { allow: "POST" }).end()
      return
    }
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      let body: unknown
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"))
      } catch {
        res.writeHead(400, { "content-type": "application/json" })
        res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32700, message: "Parse error" }, id: null }))
        return
      }
      const server = Toolbox.make(options)
      const transport = new StreamableHTTPServerTransport({ enableJsonResponse: true }) // no session ids: stateless
      res.on("close", () => {
        void transport.close()
        void server.close()
      })
      server
        .connect(transport)
        .then(() => transport.handleRequest(req, res, body))
        .catch((error: unknown) => {
          process.stderr.write(`toolbox: ${error instanceof Error ? error.message : String(error)}\n`)
          if (!res.headersSent) res.writeHead(500).end()
        })
    })
  })
  http.listen(Number(httpPort), "127.0.0.1", () => {
    const { port } = http.address() as AddressInfo
    process.stderr.write(`listening on http://127.0.0.1:${port}/mcp\n`)
  })
  const stop = () => http.close(() => process.exit(0))
  process.on("SIGTERM", stop)
  process.on("SIGINT", stop)
}
