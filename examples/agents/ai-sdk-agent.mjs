// A tool-using agent written for the Vercel AI SDK, with nothing of effect-rl in it: an OpenAI-compatible provider
// (its base URL and key from OPENAI_BASE_URL / OPENAI_API_KEY), the bundled toolbox's MCP tools through the MCP SDK,
// and the AI SDK's own multi-step loop. It reads its task as one JSON line on stdin ({prompt: messages, ...}) and prints
// {"answer": …} last. configs/agent-ai-sdk.yaml trains the policy behind it through generator.agent.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js"
import { generateText, jsonSchema, stepCountIs, tool } from "ai"
import * as Toolbox from "../../src/toolbox/Toolbox.ts"

let input = ""
for await (const chunk of process.stdin) input += chunk
const task = JSON.parse(input)

// the toolbox MCP server, connected in process (a stdio or HTTP transport works the same)
const [clientSide, serverSide] = InMemoryTransport.createLinkedPair()
await Toolbox.make().connect(serverSide)
const mcp = new Client({ name: "ai-sdk-agent", version: "1.0.0" })
await mcp.connect(clientSide)
const { tools: listed } = await mcp.listTools()
const tools = Object.fromEntries(
  listed.map((t) => [
    t.name,
    tool({
      description: t.description,
      inputSchema: jsonSchema(t.inputSchema),
      execute: async (args) => {
        const result = await mcp.callTool({ name: t.name, arguments: args })
        return result.content.map((part) => (part.type === "text" ? part.text : "")).join("")
      }
    })
  ])
)

const provider = createOpenAICompatible({
  name: "policy",
  baseURL: process.env.OPENAI_BASE_URL,
  apiKey: process.env.OPENAI_API_KEY
})
const result = await generateText({
  model: provider("policy"),
  messages: task.prompt,
  tools,
  stopWhen: stepCountIs(6),
  maxOutputTokens: 96,
  maxRetries: 0
})
await mcp.close()
console.log(JSON.stringify({ answer: result.text }))
