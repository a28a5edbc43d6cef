/**
 * `mcp_tool`: a multi-turn tool-use environment over MCP servers (through `ToolIo`: live, record or replay).
 *
 * init: adds a system message listing the tools (`toolPrompt: system`: name, description, JSON schema; `compact`:
 *   `name(args): description`) and how to call them in the configured format; or, with `toolPrompt: template`,
 *   no system text and the tools in `metadata.tools` (OpenAI function format) for the chat template to render.
 *   Only one of the two is ever given, so the tools are never listed twice.
 * step: parses the model's text (`ToolCallParser`; or takes the calls a server's tool parser read, chat
 *   completions' `tool_calls`), runs each call in order, answers with one `tool` message per
 *   call. The episode ends on a final answer (text without a tool call, or `<answer>…</answer>`), after `max_turns`
 *   steps, or when the reward function says so. Parse failures and tool errors become observations (`Error: …`),
 *   never failures, and are counted (`env/parse_failures`, `env/tool_errors`).
 * reward: `Rewards.evaluate(row.reward_spec, episode)` on every step (per-turn rewards, final reward on the last).
 *
 * Row extras read: `max_turns` (overrides the option).
 */
import { Effect, type Layer } from "effect"
import type { EnvironmentConfig } from "../config/EnvironmentConfig.ts"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import * as Spans from "../domain/Spans.ts"
import type { ToolCall, ToolCallRecord } from "../domain/ToolCall.ts"
import type { McpTool } from "../mcp/Types.ts"
import { type Env, EnvError, type FunctionTool, type InitResult, type StepResult } from "./Env.ts"
import * as EnvRegistry from "./EnvRegistry.ts"
import * as Rewards from "./Rewards.ts"
import * as ToolCallParser from "./ToolCallParser.ts"
import { ToolIo } from "./ToolIo.ts"

export const envClass = "mcp_tool"

export interface McpToolEnvOptions {
  readonly toolCallFormat: ToolCallParser.Format
  readonly maxTurns: number
  /**
   * How the policy learns the tools (default `system`):
   * - `system`: a system message lists each tool's JSON schema, one per line;
   * - `compact`: a system message lists `name(arg, ...): description`, one per line (tiny byte-level models);
   * - `template`: no system text; `metadata.tools` goes to the chat template, which renders them its own way
   *   (what a pretrained Qwen/Llama model was trained on);
   * - `none`: the tools are not shown at all (a policy fine-tuned on demonstrations of these tools already knows them:
   *   the quickstart's tiny byte-level policy, whose every prompt byte costs compute).
   */
  readonly toolPrompt?: "system" | "compact" | "template" | "none"
}

export const optionsFromConfig = (
  env: EnvironmentConfig,
  generator: { readonly max_turns: number }
): McpToolEnvOptions => ({
  toolCallFormat: env.tool_call_format,
  maxTurns: generator.max_turns,
  toolPrompt: env.tool_prompt
})

/** The tool list in OpenAI function format. */
export const functionTools = (tools: ReadonlyArray<McpTool>): ReadonlyArray<FunctionTool> =>
  tools.map((t) => ({
    type: "function",
    function: { name: t.name, description: t.description, parameters: schemaForPrompt(t.inputSchema) }
  }))

/** The input schema without keys that only cost prompt tokens. */
const schemaForPrompt = (schema: Readonly<Record<string, unknown>>): Record<string, unknown> => {
  const { $schema: _s, additionalProperties: _a, ...rest } = schema
  return rest
}

const example = (tools: ReadonlyArray<McpTool>, format: ToolCallParser.WriteFormat): string => {
  const first = tools[0]
  const props = (first?.inputSchema["properties"] ?? {}) as Record<string, { type?: string }>
  const args = Object.fromEntries(Object.entries(props).map(([k, v]) => [k, v.type === "number" ? 1 : "…"]))
  return ToolCallParser.toText({ name: first?.name ?? "tool", arguments: args }, format)
}

/** `name(arg, arg): description`: one short line per tool. */
export const compactLine = (tool: McpTool): string => {
  const props = Object.keys((tool.inputSchema["properties"] ?? {}) as Record<string, unknown>)
  return `${tool.name}(${props.join(", ")})${tool.description === "" ? "" : `: ${tool.description}`}`
}

/** The system text that teaches the tools and the call format (`compact`: one short line per tool). */
export const systemPrompt = (
  tools: ReadonlyArray<McpTool>,
  format: ToolCallParser.Format,
  style: "system" | "compact" = "system"
): string => {
  const write: ToolCallParser.WriteFormat = format === "auto" ? "hermes" : format
  const lines =
    style === "compact" ? tools.map(compactLine) : functionTools(tools).map((t) => JSON.stringify(t.function))
  const answer = write === "react" ? "Final Answer: …" : "<answer>…</answer>"
  return [
    "You can call these tools:",
    ...lines,
    `To call a tool, write: ${example(tools, write)}`,
    `When you know the answer, write ${answer}.`
  ].join("\n")
}

const withSystem = (prompt: ReadonlyArray<Message>, text: string): ReadonlyArray<Message> => {
  const [first, ...rest] = prompt
  if (first?.role === "system") return [{ ...first, content: `${first.content}\n\n${text}` }, ...rest]
  return [{ role: "system", content: text }, ...prompt]
}

const positiveInt = (x: unknown): number | undefined =>
  typeof x === "number" && Number.isInteger(x) && x > 0 ? x : undefined

/** The env of one trajectory. Its tool session (and any per-trajectory server) closes with the scope. */
export const make = Effect.fn("McpToolEnv.make")(function* (row: PromptRow, options: McpToolEnvOptions) {
  const toolIo = yield* ToolIo
  const session = yield* toolIo.session
  const maxTurns =
    positiveInt(row.extras?.["max_turns"]) ?? positiveInt(row.extra_info?.["max_turns"]) ?? options.maxTurns
  const format = options.toolCallFormat

  let turn = 0
  let done = false
  const calls: Array<ToolCallRecord> = []
  const counters = { turns: 0, toolCalls: 0, toolErrors: 0, parseFailures: 0, toolMs: 0, answered: 0 }
  let rewardMetrics: Record<string, number> = {}

  const fail = (reason: EnvError["reason"], message: string, cause?: unknown) =>
    new EnvError({ envClass, reason, message, cause })

  const init = (prompt: ReadonlyArray<Message>): Effect.Effect<InitResult, EnvError> =>
    Effect.sync(() => {
      const style = options.toolPrompt ?? "system"
      if (style === "none") return { messages: prompt, metadata: {} }
      return style === "template"
        ? { messages: prompt, metadata: { tools: functionTools(session.tools) } }
        : { messages: withSystem(prompt, systemPrompt(session.tools, format, style)), metadata: {} }
    })

  const noRewardResult: Rewards.RewardResult = { reward: 0, metrics: {} }
  const reward = (finalAnswer: string | undefined, stepCalls: ReadonlyArray<ToolCallRecord>, isDone: boolean) =>
    row.reward_spec === undefined
      ? Effect.succeed(noRewardResult)
      : Rewards.evaluate(row.reward_spec, {
          calls,
          finalAnswer,
          turn: turn - 1,
          done: isDone,
          stepCalls,
          parseFailures: counters.parseFailures
        }).pipe(Effect.mapError((e) => fail("Reward", e.message, e)))

  const toEnvError = (e: { readonly message: string }) => fail("ReplayMiss", e.message, e)
  /** One tool call under its span (`tool.call`, a child of the turn's). */
  const traced = (call: ToolCall) =>
    session.call(call).pipe(
      Effect.tap((record) => Effect.annotateCurrentSpan("tool.is_error", record.isError)),
      Effect.withSpan(Spans.names.toolCall, { attributes: { "tool.name": call.name } })
    )
  // the episode's call history is read only by the reward: without a reward_spec it is not kept (a long-lived env
  // would otherwise hold every record it ever made, and the collector pays for them on every call: about 8 µs per
  // call after thousands of calls in the mcp-latency bench)
  const keep = (record: ToolCallRecord) => {
    if (row.reward_spec !== undefined) calls.push(record)
    counters.toolCalls++
    counters.toolMs += record.ms
    if (record.isError) counters.toolErrors++
  }
  /** The calls of one step (at least one), in order: each is recorded before the next starts (a reward reads them). */
  const runCalls = (
    todo: ReadonlyArray<ToolCall>,
    i: number,
    records: Array<ToolCallRecord>
  ): Effect.Effect<Array<ToolCallRecord>, EnvError> => {
    const kept = (record: ToolCallRecord) => {
      keep(record)
      records.push(record)
      return records
    }
    const next = traced(todo[i]!)
    return i === todo.length - 1
      ? Effect.mapBoth(next, { onFailure: toEnvError, onSuccess: kept })
      : Effect.flatMap(Effect.mapError(next, toEnvError), (record) => runCalls(todo, i + 1, kept(record)))
  }

  const finish = (
    parsed: ToolCallParser.Parsed,
    records: ReadonlyArray<ToolCallRecord>,
    stop: string | undefined,
    result: Rewards.RewardResult
  ): StepResult => {
    if (parsed.finalAnswer !== undefined) counters.answered = 1
    if (stop !== undefined) {
      done = true
      rewardMetrics = result.metrics
    }
    const observations: Array<Message> = []
    if (!done) {
      for (const r of records) observations.push({ role: "tool", content: r.result, tool_call_id: r.id, name: r.tool })
      if (parsed.error !== undefined) observations.push({ role: "tool", content: `Error: ${parsed.error}` })
    }
    const metadata: {
      toolCalls: ReadonlyArray<ToolCallRecord>
      parseError?: string
      finalAnswer?: string
      stopReason?: string
    } = {
      toolCalls: records
    }
    if (parsed.error !== undefined) metadata.parseError = parsed.error
    if (parsed.finalAnswer !== undefined) metadata.finalAnswer = parsed.finalAnswer
    if (stop !== undefined) metadata.stopReason = stop
    return { observations, reward: result.reward, done, metadata }
  }

  // the parser gives a final answer for text without calls, for <answer>…</answer> and for ReAct's Final Answer
  const stopOf = (parsed: ToolCallParser.Parsed) =>
    parsed.finalAnswer !== undefined ? "answer" : turn >= maxTurns ? "max_turns" : undefined

  /** After the calls: the reward (evaluated again as final when the reward function ends the episode). */
  const settle = (parsed: ToolCallParser.Parsed, records: ReadonlyArray<ToolCallRecord>) => {
    const stop = stopOf(parsed)
    return Effect.flatMap(reward(parsed.finalAnswer, records, stop !== undefined), (result) =>
      result.done === true && stop === undefined
        ? Effect.map(reward(parsed.finalAnswer, records, true), (final) => finish(parsed, records, "env_done", final))
        : Effect.succeed(finish(parsed, records, stop, result))
    )
  }

  // No generator per step: a step is on every tool call's path (the mcp-latency bench), and a generator function
  // made per call costs microseconds.
  const step = (actionText: string, toolCalls?: ReadonlyArray<ToolCallWire>): Effect.Effect<StepResult, EnvError> =>
    Effect.suspend(() => {
      if (done) return Effect.fail(fail("Failed", "step after the episode ended"))
      turn++
      counters.turns++
      // calls a server's tool parser already read (chat completions) are run as given, ids kept
      const parsed =
        toolCalls !== undefined && toolCalls.length > 0
          ? ToolCallParser.fromOpenAi(toolCalls)
          : ToolCallParser.parse(actionText, format)
      if (parsed.error !== undefined) counters.parseFailures++
      if (parsed.calls.length === 0) return settle(parsed, [])
      if (parsed.calls.length === 1 && row.reward_spec === undefined) {
        // the common step, one primitive after the parse: the call, its record kept, the result
        return Effect.mapBoth(traced(parsed.calls[0]!), {
          onFailure: toEnvError,
          onSuccess: (record) => {
            keep(record)
            return finish(parsed, [record], stopOf(parsed), noRewardResult)
          }
        })
      }
      const records = runCalls(parsed.calls, 0, [])
      return row.reward_spec === undefined
        ? Effect.map(records, (made) => finish(parsed, made, stopOf(parsed), noRewardResult))
        : Effect.flatMap(records, (made) => settle(parsed, made))
    })

  const env: Env = {
    envClass,
    init,
    step,
    metrics: Effect.sync(() => ({
      "env/turns": counters.turns,
      "env/tool_calls": counters.toolCalls,
      "env/tool_errors": counters.toolErrors,
      "env/parse_failures": counters.parseFailures,
      "env/tool_ms": counters.toolMs,
      "env/answered": counters.answered,
      ...rewardMetrics
    })),
    close: Effect.void // the tool session is closed by the scope
  }
  return env
})

/** Registers `mcp_tool` in the EnvRegistry; needs a ToolIo (live, record or replay). */
export const layer = (options: McpToolEnvOptions): Layer.Layer<never, never, EnvRegistry.EnvRegistry | ToolIo> =>
  EnvRegistry.layerRegister(envClass, (row) => make(row, options))
