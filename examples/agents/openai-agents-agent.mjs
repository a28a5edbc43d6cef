// A tool-using agent written for the OpenAI Agents SDK, with nothing of effect-rl in it: the SDK's default model
// (the Responses API, its base URL and key from OPENAI_BASE_URL / OPENAI_API_KEY), the bundled toolbox's MCP tools as
// function tools through the MCP SDK, and the SDK's own run loop. It reads its task as one JSON line on stdin
// ({prompt: messages, ...}) and prints {"answer": …} last. Run it with OPENAI_AGENTS_DISABLE_TRACING=1 where the
// OpenAI trace exporter cannot be reached (generator.agent.env in a config).
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js"
import { Agent, run, tool } from "@openai/agents"
import * as Toolbox from "../../src/toolbox/Toolbox.ts"

let input = ""
for await (const chunk of process.stdin) input += chunk
const task = JSON.parse(input)

// the toolbox MCP server, connected in process (a stdio or HTTP transport works the same)
const [clientSide, serverSide] = InMemoryTransport.createLinkedPair()
await Toolbox.make().connect(serverSide)
const mcp = new Client({ name: "openai-agents-agent", version: "1.0.0" })
await mcp.connect(clientSide)
const { tools: listed } = await mcp.listTools()
const tools = listed.map((t) =>
  tool({
    name: t.name,
    description: t.description ?? "",
    parameters: { ...t.inputSchema, additionalProperties: false },
    strict: false,
    execute: async (args) => {
      const result = await mcp.callTool({ name: t.name, arguments: args })
      return result.content.map((part) => (part.type === "text" ? part.text : "")).join("")
    }
  })
)

const agent = new Agent({ name: "toolbox", instructions: undefined, model: "policy", tools })
const question = task.prompt.map((m) => m.content).join("\n")
const result = await run(agent, question, { maxTurns: 6 })
await mcp.close()
console.log(JSON.stringify({ answer: result.finalOutput ?? "" }))
