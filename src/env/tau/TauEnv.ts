/**
 * `tau_bench`: a tau-bench episode (retail or airline) as an Env, upstream's `Env` + tool-calling agent loop.
 *
 * init: the domain policy (`wiki.md`) is the whole system prompt (the row's own system message if it has one, which
 *   the converter writes from the same file), followed by the simulated user's first message; `metadata.tools` holds
 *   the domain's tool schemas (tools.json) for the chat template.
 * step: the model's turn is parsed with `ToolCallParser`. As upstream's agent does, only the FIRST tool call of a
 *   turn runs; its result is a `tool` message. A turn without a call is a `respond` action: the simulated user's
 *   reply is the observation (a `user` message). The episode ends when the user says `###STOP###`, when the agent
 *   calls `transfer_to_human_agents`, or after `maxSteps` actions (reward 0 then, as upstream, the reward function
 *   never runs). A turn whose tool call cannot be read gets `Error: <why>` as a tool message and counts as a step.
 * reward (on the last step only): `Reward.reward` — the DB hash against the ground-truth replay's, and every required
 *   output said in some reply.
 *
 * Rows (see TauBenchConverter): `reward_spec.ground_truth = {actions, outputs}`, `extra_info = {domain, task_id,
 * split, instruction}`. A row without a ground truth is looked up in the data directory by (split, task_id).
 */
import { Clock, Effect, type FileSystem, Layer, type Path } from "effect"
import type { EnvironmentConfig, TauConfig } from "../../config/EnvironmentConfig.ts"
import type { Message } from "../../domain/Message.ts"
import type { PromptRow } from "../../domain/PromptRow.ts"
import type { ToolCallRecord } from "../../domain/ToolCall.ts"
import { type Env, EnvError, type InitResult, type StepResult } from "../Env.ts"
import * as EnvRegistry from "../EnvRegistry.ts"
import * as ToolCallParser from "../ToolCallParser.ts"
import * as Db from "./Db.ts"
import * as Reward from "./Reward.ts"
import * as Tool from "./Tool.ts"
import * as UserLlm from "./UserLlm.ts"
import * as UserSimulator from "./UserSimulator.ts"

export const envClass = "tau_bench"

export interface TauEnvOptions {
  /** The directory holding `<domain>/db/*.json`, `tasks.json`, `tools.json`, `wiki.md` (e.g. shared/tau-bench). */
  readonly dataDir: string
  /** The domain of rows that do not name one in `extra_info.domain`. */
  readonly domain: Db.Domain
  readonly user: UserSimulator.Strategy
  /** Actions before the episode is cut with reward 0 (upstream's tool-calling agent: 30). */
  readonly maxSteps: number
  readonly toolCallFormat: ToolCallParser.Format
}

/** What an episode needs of a task. */
export interface TaskSpec {
  readonly domain: Db.Domain
  readonly split: string
  readonly id: number
  readonly instruction: string
  readonly actions: ReadonlyArray<Db.Action>
  readonly outputs: ReadonlyArray<string>
}

const badRow = (message: string) => new EnvError({ envClass, reason: "BadRow", message })

const isActionList = (x: unknown): x is ReadonlyArray<Db.Action> =>
  Array.isArray(x) &&
  x.every((a) => a !== null && typeof a === "object" && typeof a.name === "string" && typeof a.kwargs === "object")

/** The task of a row: its ground truth and instruction, or the task the row points at in the data directory. */
export const taskOf = Effect.fn("TauEnv.taskOf")(function* (
  row: PromptRow,
  options: Pick<TauEnvOptions, "dataDir" | "domain">
) {
  const info = row.extra_info ?? {}
  const domainName = typeof info["domain"] === "string" ? info["domain"] : options.domain
  if (!Db.isDomain(domainName)) return yield* badRow(`unknown tau-bench domain "${domainName}"`)
  const split = typeof info["split"] === "string" ? info["split"] : "test"
  const id = typeof info["task_id"] === "number" ? info["task_id"] : -1
  const truth = row.reward_spec?.ground_truth as { actions?: unknown; outputs?: unknown } | undefined
  if (truth !== undefined && isActionList(truth.actions) && typeof info["instruction"] === "string") {
    const outputs = Array.isArray(truth.outputs) ? truth.outputs.filter((o): o is string => typeof o === "string") : []
    return {
      domain: domainName,
      split,
      id,
      instruction: info["instruction"],
      actions: truth.actions,
      outputs
    } satisfies TaskSpec
  }
  const data = yield* Db.loadDomain(options.dataDir, domainName).pipe(
    Effect.mapError((e) => badRow(`${e.file}: ${e.message}`))
  )
  const task = data.tasks.find((t) => t.split === split && t.id === id)
  if (task === undefined) {
    return yield* badRow(`row has no reward_spec.ground_truth.actions and names no task (split "${split}", id ${id})`)
  }
  return {
    domain: domainName,
    split,
    id,
    instruction: task.instruction,
    actions: task.actions,
    outputs: task.outputs
  } satisfies TaskSpec
})

/** An episode: its env, and what `check` and tests may look at (the task, the DB, the reward once done). */
export interface Episode {
  readonly env: Env
  readonly task: TaskSpec
  readonly db: Db.Db
  readonly result: () => Reward.RewardInfo | undefined
}

/** The env of one trajectory. */
export const make = (row: PromptRow, options: TauEnvOptions) => Effect.map(episode(row, options), (e) => e.env)

/** `make`, keeping the episode's state in reach. */
export const episode = Effect.fn("TauEnv.episode")(function* (row: PromptRow, options: TauEnvOptions) {
  const task = yield* taskOf(row, options)
  const data = yield* Db.loadDomain(options.dataDir, task.domain).pipe(
    Effect.mapError((e) => new EnvError({ envClass, reason: "Failed", message: `${e.file}: ${e.message}` }))
  )
  const maxSteps =
    typeof row.extra_info?.["max_steps"] === "number" ? (row.extra_info["max_steps"] as number) : options.maxSteps
  const tools = Reward.toolsOf(task.domain)
  const db = Db.fresh(data)
  const replies: Array<string> = []
  const counters = { turns: 0, toolCalls: 0, toolErrors: 0, parseFailures: 0, userTurns: 0, userLlmCalls: 0 }
  let steps = 0
  let done = false
  let result: Reward.RewardInfo | undefined
  // the first user message's LLM records ride on the first step, so the episode log keeps them
  let pending: ReadonlyArray<ToolCallRecord> = []

  const accomplished = () => Reward.reward(data, db, task, replies).reward === 1
  const user: UserSimulator.UserSimulator =
    options.user === "scripted"
      ? UserSimulator.scripted(accomplished)
      : UserSimulator.llm(yield* (yield* UserLlm.UserLlm).session, options.user)

  const userFailed = (e: UserLlm.UserLlmError) =>
    new EnvError({
      envClass,
      reason: e.reason === "ReplayMiss" ? "ReplayMiss" : "Failed",
      message: `simulated user: ${e.message}`,
      cause: e
    })

  const init = (prompt: ReadonlyArray<Message>): Effect.Effect<InitResult, EnvError> =>
    Effect.gen(function* () {
      const first = yield* user.reset(task.instruction).pipe(Effect.mapError(userFailed))
      counters.userLlmCalls += first.records.length
      pending = first.records
      const system: ReadonlyArray<Message> =
        prompt[0]?.role === "system" ? [prompt[0]] : [{ role: "system", content: data.wiki }]
      return {
        messages: [...system, { role: "user", content: first.text }],
        metadata: { tools: data.tools, domain: task.domain, taskId: task.id, split: task.split }
      }
    })

  const step = (actionText: string): Effect.Effect<StepResult, EnvError> =>
    Effect.gen(function* () {
      if (done) return yield* new EnvError({ envClass, reason: "Failed", message: "step after the episode ended" })
      counters.turns++
      steps++
      const parsed = ToolCallParser.parse(actionText, options.toolCallFormat)
      const records: Array<ToolCallRecord> = [...pending]
      pending = []
      const observations: Array<Message> = []
      let stopReason: string | undefined
      let finalAnswer: string | undefined

      const call = parsed.calls[0]
      if (call !== undefined) {
        const start = yield* Clock.currentTimeMillis
        const outcome = tools.has(call.name)
          ? Tool.invoke(tools.get(call.name)!, db, call.arguments)
          : Reward.act(db, { name: call.name, kwargs: call.arguments })
        const record: ToolCallRecord = {
          id: call.id,
          server: `tau_${task.domain}`,
          tool: call.name,
          arguments: call.arguments,
          result: outcome.text,
          isError: outcome.isError,
          ms: (yield* Clock.currentTimeMillis) - start
        }
        records.push(record)
        counters.toolCalls++
        if (outcome.isError) counters.toolErrors++
        observations.push({ role: "tool", content: outcome.text, tool_call_id: call.id, name: call.name })
        if (call.name === Tool.terminateTool) stopReason = "transfer"
      } else if (parsed.error !== undefined) {
        counters.parseFailures++
        observations.push({ role: "tool", content: `Error: ${parsed.error}` })
      } else {
        finalAnswer = parsed.finalAnswer ?? actionText.trim()
        replies.push(finalAnswer)
        const reply = yield* user.step(finalAnswer).pipe(Effect.mapError(userFailed))
        counters.userTurns++
        counters.userLlmCalls += reply.records.length
        records.push(...reply.records)
        if (reply.text.includes(UserSimulator.stopToken)) stopReason = "user_stop"
        else observations.push({ role: "user", content: reply.text })
      }
      if (stopReason === undefined && steps >= maxSteps) stopReason = "max_turns"
      let reward = 0
      if (stopReason !== undefined) {
        done = true
        if (stopReason !== "max_turns") {
          result = Reward.reward(data, db, task, replies)
          reward = result.reward
        }
      }
      return {
        observations: done ? [] : observations,
        reward,
        done,
        metadata: {
          toolCalls: records,
          ...(parsed.error === undefined ? {} : { parseError: parsed.error }),
          ...(finalAnswer === undefined ? {} : { finalAnswer }),
          ...(stopReason === undefined ? {} : { stopReason })
        }
      } satisfies StepResult
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
      "tau/user_turns": counters.userTurns,
      "tau/user_llm_calls": counters.userLlmCalls,
      ...(result === undefined
        ? {}
        : {
            "tau/reward": result.reward,
            "tau/db_match": result.hash === result.gtHash ? 1 : 0,
            ...(result.outputs === undefined
              ? {}
              : { "tau/outputs_match": Object.values(result.outputs).every(Boolean) ? 1 : 0 })
          })
    })),
    close: Effect.void
  }
  return { env, task, db, result: () => result } satisfies Episode
})

/**
 * The env sanity check of one row: a fresh episode with the scripted user, driven by an agent that makes each
 * ground-truth call (as a Hermes tool call, skipping `transfer_to_human_agents`, as upstream's replay does) and then
 * says every required output. A sound env and task give reward 1; `hash` is the DB's canonical hash at the end.
 */
export const check = Effect.fn("TauEnv.check")(function* (row: PromptRow, options: TauEnvOptions) {
  const task = yield* taskOf(row, options)
  const calls = task.actions.filter((a) => a.name !== Tool.terminateTool)
  const run = yield* episode(row, { ...options, user: "scripted", maxSteps: calls.length + 2 })
  yield* run.env.init(row.prompt)
  const observations: Array<string> = []
  for (const action of calls) {
    const out = yield* run.env.step(ToolCallParser.toText({ name: action.name, arguments: action.kwargs }, "hermes"))
    observations.push(out.metadata.toolCalls[0]?.result ?? "")
    if (out.done) break
  }
  const last = yield* run.env.step(task.outputs.length > 0 ? `Done: ${task.outputs.join(" ")}.` : "Done.")
  const result = run.result()
  return {
    task,
    done: last.done,
    reward: last.reward,
    hash: result?.hash ?? Reward.hashDb(run.db),
    gtHash: result?.gtHash,
    observations
  }
})

/** The options an `environment` section with a `tau` part gives. */
export const optionsFromConfig = (env: EnvironmentConfig, tau: TauConfig): TauEnvOptions => ({
  dataDir: tau.data_dir,
  domain: tau.domain,
  user: tau.user,
  maxSteps: tau.max_steps,
  toolCallFormat: env.tool_call_format
})

/**
 * Registers `tau_bench` as an `environment` section asks (its user LLM included); registers nothing when the section
 * has no `tau` part, so a composition root can merge it unconditionally.
 */
export const layerFromConfig = (
  env: EnvironmentConfig
): Layer.Layer<never, never, EnvRegistry.EnvRegistry | FileSystem.FileSystem | Path.Path> =>
  env.tau === undefined
    ? Layer.empty
    : layer(optionsFromConfig(env, env.tau)).pipe(Layer.provide(UserLlm.layerFromConfig(env)), Layer.orDie)

/** Registers `tau_bench` in the EnvRegistry; needs the user LLM (`UserLlm.layerNone` for the scripted user). */
export const layer = (
  options: TauEnvOptions
): Layer.Layer<never, never, EnvRegistry.EnvRegistry | UserLlm.UserLlm | FileSystem.FileSystem | Path.Path> =>
  EnvRegistry.layerRegister(envClass, (row) => make(row, options))
