// A tool-using agent written for the Vercel AI SDK, with nothing of effect-rl in it: an OpenAI-compatible provider
// (its base URL and key from OPENAI_BASE_URL / OPENAI_API_KEY), the bundled toolbox's tools as plain functions, and
// the AI SDK's own multi-step loop. It reads its task as one JSON line on stdin ({prompt: messages, ...}) and prints
// {"answer": …} last. configs/agent-ai-sdk.yaml trains the policy behind it through generator.agent.
// (examples/agents/openai-agents-agent.mjs reaches the same tools through the MCP SDK instead.)
import { createOpenAICompatible } from "@ai-sdk/openai-compatible"
import { generateText, jsonSchema, stepCountIs, tool } from "ai"
import * as Tools from "../../src/toolbox/Tools.ts"

let input = ""
for await (const chunk of process.stdin) input += chunk
const task = JSON.parse(input)

const tools = Object.fromEntries(
  Tools.tools.map((t) => [
    t.name,
    tool({
      description: t.description,
      inputSchema: jsonSchema(Tools.inputSchema(t)),
      execute: async (args) => Tools.call(t.name, args).text
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
console.log(JSON.stringify({ answer: result.text }))
