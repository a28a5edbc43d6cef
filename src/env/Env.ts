/**
 * The environment contract, SkyRL's `BaseTextEnv` made scoped and typed. An env is created per trajectory (by
 * `EnvRegistry.make` from a row's `env_class`), lives in the trajectory's scope, and is driven by the generator:
 *
 *   const env = yield* registry.make(row.env_class, row)             // scoped: closing the scope closes the env
 *   const { messages, metadata } = yield* env.init(row.prompt)        // the chat the policy starts from
 *   loop: const out = yield* env.step(completionText)                 // observations, reward, done
 *
 * `step` never fails for the policy's mistakes: unparsable calls, unknown tools and tool errors come back as
 * observations and are counted in `metrics`. `EnvError` is for infrastructure (an unknown env class, a row the env
 * cannot work with, a replay miss) and ends the trajectory with stop reason `error`.
 */
import { type Effect, Schema } from "effect"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import type { ToolCallRecord } from "../domain/ToolCall.ts"

/** A tool in OpenAI function format, as chat templates with a `tools` argument expect it. */
export interface FunctionTool {
  readonly type: "function"
  readonly function: {
    readonly name: string
    readonly description: string
    readonly parameters: Readonly<Record<string, unknown>>
  }
}

export interface InitResult {
  /** The conversation the policy starts from (the prompt, possibly with a system message the env added). */
  readonly messages: ReadonlyArray<Message>
  readonly metadata: {
    /** The tools, for chat templates that render them (`apply_chat_template(messages, tools=...)`). */
    readonly tools?: ReadonlyArray<FunctionTool>
    readonly [key: string]: unknown
  }
}

export interface StepResult {
  /** Messages appended after the policy's turn (tool results, a user nudge); empty when done. */
  readonly observations: ReadonlyArray<Message>
  readonly reward: number
  readonly done: boolean
  readonly metadata: {
    readonly toolCalls: ReadonlyArray<ToolCallRecord>
    readonly parseError?: string
    readonly finalAnswer?: string
    /** Why the env ended the episode: "answer", "max_turns", or an env-defined reason. */
    readonly stopReason?: string
  }
}

export class EnvError extends Schema.TaggedError<EnvError>()("EnvError", {
  envClass: Schema.String,
  reason: Schema.Literals(["UnknownEnvClass", "BadRow", "ReplayMiss", "Reward", "Failed"]),
  message: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {}

/** One environment instance: one trajectory. */
export interface Env {
  readonly envClass: string
  readonly init: (prompt: ReadonlyArray<Message>) => Effect.Effect<InitResult, EnvError>
  /**
   * The policy's turn. `toolCalls`: calls a server already read out of the text (chat completions' `tool_calls`,
   * `generator.engine.chat`); an env that runs tools runs these instead of parsing the text for calls. Absent or
   * empty: the env reads the text as always (an answer, or a malformed attempt it reports back).
   */
  readonly step: (actionText: string, toolCalls?: ReadonlyArray<ToolCallWire>) => Effect.Effect<StepResult, EnvError>
  /** Counters of this episode so far, `area/name` keys (`env/tool_calls`, …). */
  readonly metrics: Effect.Effect<Record<string, number>>
  /** Releases what the env holds before its scope closes (idempotent; the scope calls it too). */
  readonly close: Effect.Effect<void>
}

/**
 * Aggregates per-trajectory env metrics into batch metrics: the mean of every key over the envs that reported it
 * (SkyRL's `aggregate_env_metrics`), plus rates computed from the sums, which are not the mean of per-episode rates:
 * `generate/parse_failure_rate` = Σ env/parse_failures / Σ env/turns, `env/tool_error_rate` = Σ env/tool_errors /
 * Σ env/tool_calls.
 */
export const aggregateMetrics = (all: ReadonlyArray<Readonly<Record<string, number>>>): Record<string, number> => {
  const sums: Record<string, number> = {}
  const counts: Record<string, number> = {}
  for (const metrics of all) {
    for (const [key, value] of Object.entries(metrics)) {
      sums[key] = (sums[key] ?? 0) + value
      counts[key] = (counts[key] ?? 0) + 1
    }
  }
  const out: Record<string, number> = {}
  for (const key of Object.keys(sums)) out[key] = sums[key]! / counts[key]!
  const turns = sums["env/turns"] ?? 0
  if (turns > 0) out["generate/parse_failure_rate"] = (sums["env/parse_failures"] ?? 0) / turns
  const calls = sums["env/tool_calls"] ?? 0
  if (calls > 0) out["env/tool_error_rate"] = (sums["env/tool_errors"] ?? 0) / calls
  return out
}
