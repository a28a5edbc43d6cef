/**
 * One trajectory as one run of the user's agent program (`generator.agent`), in place of AgentLoop's turns: the
 * program talks to the policy through an SDK client pointed at the agent gateway (generator/AgentGateway.ts), which
 * records every call token-exact; the trajectory is built from those records, never from a re-tokenisation.
 *
 * - The program: `command` (`node` is this Node, with Node's compile cache on unless NODE_COMPILE_CACHE is set), in
 *   `cwd`, its own process group, with `OPENAI_BASE_URL`,
 *   `ANTHROPIC_BASE_URL` (the trajectory's gateway session), `OPENAI_API_KEY` and `ANTHROPIC_API_KEY` (a dummy),
 *   `EFFECT_RL_TRAJECTORY` (`<uid>/<sample>`) and the config's `env`; the task row as one line of JSON on stdin. It
 *   may print a last stdout line `{"answer": …}`.
 * - It ends when it exits or after `timeout_seconds`; either way its whole process group is killed (and registered
 *   with the ProcessReaper meanwhile, so a trainer killed with SIGKILL leaves nothing behind).
 * - The row: turn 0's prompt ids as served; each later call's prompt must extend the row so far (prompt, replies,
 *   what came between), the ids past it appended with lossMask 0 and counted as the previous turn's
 *   `observationTokens`; once a call's prompt does not (the program rewrote its history, or the template re-renders
 *   a reply differently from how it was sampled), the trajectory is kept step-wise: every call a row of its own
 *   (`steps`), as AgentLoop's chat mode does.
 * - The reward: the row's `reward_spec` (env/Rewards.ts) over the transcript the gateway saw: each call's tool calls
 *   with the results the next call's conversation carries (by call id; a call with no result counts as failed), and
 *   the final answer (the `answer` line, else the last reply that made no call; `<answer>…</answer>` read out as the
 *   env reads it). Per-turn rewards on each call, the final one on the last.
 * - Stop reasons: `stop` for a program that exited 0; `max_turns` when it asked for more calls than
 *   `generator.max_turns`; `overlong` when a call was refused for the context length; `error` (with the reason, and
 *   no reward) when it exited non-zero, was killed at its timeout, could not start, or never called the model.
 */
import { spawn } from "node:child_process"
import * as os from "node:os"
import * as path from "node:path"
import { Clock, Duration, Effect } from "effect"
import { PolicyDivergedError } from "../domain/Errors.ts"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { ToolCallRecord } from "../domain/ToolCall.ts"
import type { StopReason, Trajectory, Turn } from "../domain/Trajectory.ts"
import * as Rewards from "../env/Rewards.ts"
import * as ToolCallParser from "../env/ToolCallParser.ts"
import * as ProcessReaper from "../mcp/ProcessReaper.ts"
import type { ServedTurn } from "../serve/Served.ts"
import { AgentGateway, type Session } from "./AgentGateway.ts"
import * as AgentLoop from "./AgentLoop.ts"

export interface AgentOptions {
  readonly command: ReadonlyArray<string>
  readonly timeoutSeconds: number
  readonly env: Readonly<Record<string, string>>
  readonly cwd?: string | undefined
  /** How the policy writes answers and calls (`environment.tool_call_format`), to read its final answer. */
  readonly toolCallFormat: ToolCallParser.Format
}

/** How the program ended. */
interface Outcome {
  readonly exit: "exited" | "timeout" | "spawn-failed"
  readonly code: number | null
  readonly signal: string | null
  readonly lastLine: string | undefined
  readonly stderr: string
  readonly ms: number
}

const stderrTail = 2000

/** Runs the program for one trajectory; its process group is killed when it ends, times out, or is interrupted. */
const runProgram = (agent: AgentOptions, session: Session, row: PromptRow, id: string) =>
  Effect.gen(function* () {
    const started = yield* Clock.currentTimeMillis
    const [file, ...args] = agent.command
    const child = yield* Effect.acquireRelease(
      Effect.sync(() =>
        spawn(file === "node" ? process.execPath : file!, args, {
          cwd: agent.cwd ?? process.cwd(),
          detached: true,
          stdio: ["pipe", "pipe", "pipe"],
          env: {
            ...process.env,
            // Node's compile cache: a program's imports are compiled once, not on every run (about 0.3 s of each)
            ...(file === "node" && process.env["NODE_COMPILE_CACHE"] === undefined
              ? { NODE_COMPILE_CACHE: path.join(os.tmpdir(), "effect-rl-agent-compile-cache") }
              : {}),
            ...agent.env,
            OPENAI_BASE_URL: session.openAiBaseUrl,
            OPENAI_API_KEY: "effect-rl",
            ANTHROPIC_BASE_URL: session.anthropicBaseUrl,
            ANTHROPIC_API_KEY: "effect-rl",
            EFFECT_RL_TRAJECTORY: id
          }
        })
      ).pipe(
        Effect.tap((c) =>
          Effect.sync(() => {
            if (c.pid !== undefined) ProcessReaper.register(c.pid)
          })
        )
      ),
      (c) =>
        Effect.sync(() => {
          if (c.pid === undefined) return
          try {
            process.kill(-c.pid, "SIGKILL")
          } catch {
            // the group ended already
          }
          ProcessReaper.forget(c.pid)
        })
    )
    let stdout = ""
    let stderr = ""
    let tailText = ""
    let written = 0
    child.stdout?.on("data", (chunk: Buffer) => {
      stdout = (stdout + chunk.toString("utf8")).slice(-65536)
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      // the head (where an uncaught error's message is) and the tail
      written += chunk.length
      stderr = stderr.length < stderrTail ? stderr + chunk.toString("utf8") : stderr
      tailText = (tailText + chunk.toString("utf8")).slice(-stderrTail)
    })
    child.stdin?.on("error", () => {}) // a program that does not read its stdin
    child.stdin?.end(`${JSON.stringify(row)}\n`)
    const ended = yield* Effect.callback<{ code: number | null; signal: string | null } | { spawnError: string }>(
      (resume) => {
        child.once("error", (e) => resume(Effect.succeed({ spawnError: e.message })))
        child.once("close", (code, signal) => resume(Effect.succeed({ code, signal })))
      }
    ).pipe(Effect.timeoutOption(Duration.seconds(agent.timeoutSeconds)))
    const ms = (yield* Clock.currentTimeMillis) - started
    if (written > Buffer.byteLength(stderr)) stderr = `${stderr}\n${tailText}`
    const lastLine = stdout
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => l !== "")
      .at(-1)
    if (ended._tag === "None") {
      return { exit: "timeout", code: null, signal: null, lastLine, stderr, ms } satisfies Outcome
    }
    const value = ended.value
    if ("spawnError" in value) {
      return {
        exit: "spawn-failed",
        code: null,
        signal: null,
        lastLine,
        stderr: value.spawnError,
        ms
      } satisfies Outcome
    }
    return { exit: "exited", code: value.code, signal: value.signal, lastLine, stderr, ms } satisfies Outcome
  })

/** Why a trajectory failed, or undefined when the program ended well. */
const failureOf = (outcome: Outcome, agent: AgentOptions, turns: number): string | undefined => {
  // a stack trace's message is at its top, what a program printed last at the bottom
  const lines = outcome.stderr
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("at ") && l !== "}" && l !== "^")
  const shown = lines.length <= 6 ? lines : [...lines.slice(0, 3), "…", ...lines.slice(-2)]
  const tail = shown.length === 0 ? "" : `: ${shown.join(" | ")}`
  if (outcome.exit === "spawn-failed") return `the agent (${agent.command.join(" ")}) could not start${tail}`
  if (outcome.exit === "timeout") return `the agent ran past generator.agent.timeout_seconds (${agent.timeoutSeconds})`
  if (outcome.code !== 0) {
    return `the agent exited with ${outcome.code === null ? `signal ${outcome.signal}` : `code ${outcome.code}`}${tail}`
  }
  if (turns === 0) return "the agent never called the model (is its client's base URL OPENAI_BASE_URL?)"
  return undefined
}

/** The `answer` of the program's last stdout line, when it is `{"answer": …}`. */
const answerLine = (line: string | undefined): string | undefined => {
  if (line === undefined || !line.startsWith("{")) return undefined
  try {
    const answer = (JSON.parse(line) as { answer?: unknown }).answer
    return answer === undefined || answer === null
      ? undefined
      : typeof answer === "string"
        ? answer
        : JSON.stringify(answer)
  } catch {
    return undefined
  }
}

/** The argument object of a call (`{}` when its arguments are not a JSON object). */
const argumentsOf = (call: ToolCallWire): unknown => {
  try {
    return JSON.parse(call.function.arguments === "" ? "{}" : call.function.arguments)
  } catch {
    return {}
  }
}

/** Each call's tool calls, with the results the next call's conversation carries (by id). */
const toolCallsOf = (turns: ReadonlyArray<ServedTurn>): Array<Array<ToolCallRecord>> =>
  turns.map((turn, k) => {
    const calls = (turn.replies[0]?.["tool_calls"] as ReadonlyArray<ToolCallWire> | undefined) ?? []
    const next: ReadonlyArray<Message> = turns[k + 1]?.messages ?? []
    return calls.map((call) => {
      const result = next.findLast((m) => m.role === "tool" && m.tool_call_id === call.id)
      return {
        id: call.id,
        tool: call.function.name,
        arguments: argumentsOf(call),
        result: result?.content ?? "",
        isError: result === undefined,
        ms: 0
      }
    })
  })

/** The rows of the trajectory: one while every call's prompt extends it, else one per call (`steps`). */
const rowsOf = (turns: ReadonlyArray<ServedTurn>) => {
  const promptIds = [...(turns[0]?.promptIds ?? [])]
  const responseIds: Array<number> = []
  const lossMask: Array<0 | 1> = []
  const rolloutLogprobs: Array<number> = []
  const spans: Array<{ start: number; end: number; observationTokens: number }> = []
  let extending = true
  for (const [k, turn] of turns.entries()) {
    const result = turn.results[0]!
    if (k > 0 && extending) {
      const held = promptIds.length + responseIds.length
      const served = turn.promptIds
      extending = AgentLoop.extendsRow(served, promptIds, responseIds)
      if (extending) {
        for (let i = held; i < served.length; i++) {
          responseIds.push(served[i]!)
          lossMask.push(0)
          rolloutLogprobs.push(0)
        }
        spans[k - 1]!.observationTokens = served.length - held
      }
    }
    const start = responseIds.length
    for (let i = 0; i < result.tokens.length; i++) {
      responseIds.push(result.tokens[i]!)
      lossMask.push(1)
      rolloutLogprobs.push(result.logprobs[i]!)
    }
    spans.push({ start, end: responseIds.length, observationTokens: 0 })
  }
  if (extending) return { promptIds, responseIds, lossMask, rolloutLogprobs, spans, steps: undefined }
  // step-wise: the generated tokens alone, each call a row of its own
  const generated: Array<number> = []
  const generatedLogprobs: Array<number> = []
  const stepSpans = turns.map((turn) => {
    const result = turn.results[0]!
    const start = generated.length
    for (let i = 0; i < result.tokens.length; i++) {
      generated.push(result.tokens[i]!)
      generatedLogprobs.push(result.logprobs[i]!)
    }
    return { start, end: generated.length, observationTokens: 0 }
  })
  const steps = turns.map((turn) => ({
    promptIds: turn.promptIds,
    responseIds: turn.results[0]!.tokens,
    rolloutLogprobs: turn.results[0]!.logprobs
  }))
  return {
    promptIds,
    responseIds: generated,
    lossMask: generated.map((): 0 | 1 => 1),
    rolloutLogprobs: generatedLogprobs,
    spans: stepSpans,
    steps
  }
}

/** The rewards of each call: per-turn ones, and the final one on the last (with its `reward/*` metrics). */
const rewardsOf = (
  row: PromptRow,
  calls: ReadonlyArray<ReadonlyArray<ToolCallRecord>>,
  finalAnswer: string | undefined
) =>
  Effect.gen(function* () {
    const rewards: Array<number> = []
    let metrics: Record<string, number> = {}
    for (let k = 0; k < calls.length; k++) {
      const done = k === calls.length - 1
      const result = yield* Rewards.evaluate(row.reward_spec, {
        calls: calls.slice(0, k + 1).flat(),
        finalAnswer: done ? finalAnswer : undefined,
        turn: k,
        done,
        stepCalls: calls[k]!
      })
      rewards.push(result.reward)
      if (done) metrics = result.metrics
    }
    return { rewards, metrics }
  })

/**
 * Run one trajectory of `row` as a run of the agent program. Failures of the program end it with stop reason `error`
 * and their reason; it fails only when the policy sampled a non-finite log-prob, as AgentLoop does.
 */
export const run = Effect.fn("AgentProgram.run")(function* (
  row: PromptRow,
  sample: number,
  options: AgentLoop.Options,
  agent: AgentOptions
) {
  const gateway = yield* AgentGateway
  const uid = row.uid ?? "prompt"
  const id = `${uid}/${sample}`
  return yield* Effect.scoped(
    Effect.gen(function* () {
      const session = yield* gateway.open({
        temperature: options.temperature,
        topP: options.topP,
        topK: options.topK,
        stopStrings: options.stopStrings,
        maxGenerateLength: options.maxGenerateLength,
        maxInputLength: options.maxInputLength,
        maxCalls: options.maxTurns,
        seed: (call) => AgentLoop.requestSeed(options.seed, uid, sample, call)
      })
      const outcome = yield* runProgram(agent, session, row, id)
      const turns = [...session.turns]
      for (const turn of turns) {
        const diverged = turn.results[0]!.logprobs.find((lp) => !Number.isFinite(lp))
        if (diverged !== undefined) {
          return yield* Effect.fail(
            new PolicyDivergedError({
              version: turn.results[0]!.policyVersionLast,
              prompt: uid,
              logprob: String(diverged)
            })
          )
        }
      }
      const overlong = session.refused.some((r) => /maximum context length/.test(r.message))
      const failure = overlong || session.overCalls() ? undefined : failureOf(outcome, agent, turns.length)
      const calls = toolCallsOf(turns)
      const lastReply = turns.at(-1)?.replies[0]
      const lastText = calls.at(-1)?.length === 0 ? String(lastReply?.["content"] ?? "") : undefined
      const said = answerLine(outcome.lastLine) ?? lastText
      const finalAnswer =
        said === undefined ? undefined : (ToolCallParser.parse(said, agent.toolCallFormat).finalAnswer ?? said)
      const scored =
        failure === undefined
          ? yield* rewardsOf(row, calls, finalAnswer).pipe(
              Effect.map((r) => ({ ...r, error: undefined as string | undefined })),
              Effect.catch((e: Rewards.RewardError) =>
                Effect.succeed({ rewards: calls.map(() => 0), metrics: {}, error: `${e._tag}: ${e.message}` })
              )
            )
          : { rewards: calls.map(() => 0), metrics: {}, error: failure }
      const rows = rowsOf(turns)
      const stopReason: StopReason =
        scored.error !== undefined ? "error" : overlong ? "overlong" : session.overCalls() ? "max_turns" : "stop"
      const trajectoryTurns: Array<Turn> = turns.map((turn, k) => {
        const result = turn.results[0]!
        return {
          ...rows.spans[k]!,
          reward: scored.rewards[k] ?? 0,
          finishReason: result.finishReason,
          policyVersionFirst: result.policyVersionFirst,
          policyVersionLast: result.policyVersionLast,
          toolCalls: calls[k]!,
          llmMs: turn.llmMs,
          envMs: 0
        }
      })
      const trajectory: Trajectory = {
        id,
        promptUid: uid,
        sample,
        promptIds: rows.promptIds,
        responseIds: rows.responseIds,
        lossMask: rows.lossMask,
        rolloutLogprobs: rows.rolloutLogprobs,
        turns: trajectoryTurns,
        reward: trajectoryTurns.reduce((sum, t) => sum + t.reward, 0),
        stopReason,
        ...(scored.error === undefined ? {} : { error: scored.error }),
        envMetrics: { ...scored.metrics, "agent/model_calls": turns.length, "agent/seconds": outcome.ms / 1000 },
        ...(rows.steps === undefined ? {} : { steps: rows.steps })
      }
      return trajectory
    })
  )
})
