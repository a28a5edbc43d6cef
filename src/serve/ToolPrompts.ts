/**
 * How a chat request's `tools` are put in front of the policy (ChatCompletions.ts `ToolPrompt`), as a run's
 * `environment.tool_prompt` put them in front of it in training: `template` through the chat template, `system` /
 * `compact` as the env's own tool system message (env/McpToolEnv.ts `systemPrompt`, in the run's
 * `tool_call_format`), `none` not at all. `serve` takes the served checkpoint's run's settings (layers/Serve.ts); the
 * agent gateway the training run's (generator/AgentGateway.ts).
 */
import type { Message } from "../domain/Message.ts"
import * as McpToolEnv from "../env/McpToolEnv.ts"
import type * as ToolCallParser from "../env/ToolCallParser.ts"
import type * as ChatCompletions from "./ChatCompletions.ts"

export type Style = "template" | "system" | "compact" | "none"

/** The tool prompt of a run trained with `tool_prompt: style` and `tool_call_format: format`. */
export const fromEnvironment = (style: Style, format: ToolCallParser.Format): ChatCompletions.ToolPrompt => {
  // the format the policy was taught to write calls in (`auto` teaches hermes: McpToolEnv.systemPrompt)
  const written: ToolCallParser.WriteFormat = format === "auto" ? "hermes" : format
  switch (style) {
    case "none":
      return (messages) => ({ messages, tools: [], format: written })
    case "system":
    case "compact":
      return (messages, tools) => ({
        messages: withSystem(
          messages,
          McpToolEnv.systemPrompt(
            tools.map((t) => ({
              name: t.function.name,
              server: "",
              remoteName: t.function.name,
              description: t.function.description ?? "",
              inputSchema: (t.function.parameters ?? {}) as Record<string, unknown>,
              readOnly: false,
              idempotent: false
            })),
            format,
            style
          )
        ),
        tools: [],
        format: written
      })
    case "template":
      return (messages, tools) => ({ messages, tools, format: written })
  }
}

/** The env's way of adding its tool text: appended to the first system message, else a system message of its own. */
const withSystem = (messages: ReadonlyArray<Message>, text: string): ReadonlyArray<Message> => {
  const [first, ...rest] = messages
  if (first?.role === "system") return [{ ...first, content: `${first.content}\n\n${text}` }, ...rest]
  return [{ role: "system", content: text }, ...messages]
}
