/**
 * The composition of `env check`: each task's ground truth replayed through a fresh env, as an agent would make the
 * calls (tau-bench rows through TauEnv with the scripted user; `mcp_tool` rows through McpToolEnv on the config's
 * MCP servers), one line per task with its reward and state hash, compared with an optional golden file.
 */
import { Console, Effect, FileSystem, Layer, Option, Stream } from "effect"
import { CliError } from "effect/cli"
import type { RunConfig } from "../config/RunConfig.ts"
import * as Dataset from "../data/Dataset.ts"
import * as TauBenchConverter from "../data/TauBenchConverter.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import * as McpToolEnv from "../env/McpToolEnv.ts"
import * as Rewards from "../env/Rewards.ts"
import * as ToolCallParser from "../env/ToolCallParser.ts"
import * as ToolIo from "../env/ToolIo.ts"
import * as TauDb from "../env/tau/Db.ts"
import * as Hash from "../env/tau/Hash.ts"
import * as TauEnv from "../env/tau/TauEnv.ts"
import * as UserLlm from "../env/tau/UserLlm.ts"

export const userError = (message: string) =>
  new CliError.UserError({ cause: new Error(message), userMessage: message })

export interface Line {
  readonly task: string | number
  readonly split: string
  readonly reward: number
  readonly hash: string
  readonly expected?: string
}

/** A tau-bench tasks.json (objects with `actions` and `instruction`, no `env_class`). */
const isTauTasks = (value: unknown): value is ReadonlyArray<TauDb.Task> =>
  Array.isArray(value) &&
  value.length > 0 &&
  value.every((t) => t !== null && typeof t === "object" && "actions" in t && "instruction" in t && !("env_class" in t))

const readRows = Effect.fn("cli.env.readRows")(function* (file: string, tau: TauEnv.TauEnvOptions | undefined) {
  const fs = yield* FileSystem.FileSystem
  if (file.endsWith(".json")) {
    const text = yield* fs.readFileString(file)
    const value = yield* Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: () => userError(`${file} is not JSON`)
    })
    if (isTauTasks(value)) {
      if (tau === undefined)
        return yield* userError("a tau-bench tasks.json needs environment.tau in the config or --data")
      const data = yield* TauDb.loadDomain(tau.dataDir, tau.domain).pipe(
        Effect.mapError((e) => userError(`${e.file}: ${e.message}`))
      )
      return value.map((t) => TauBenchConverter.toRow(tau.domain, data.wiki, t))
    }
  }
  const rows = yield* Stream.runCollect(Dataset.readAll([file])).pipe(Effect.mapError((e) => userError(e.message)))
  return [...rows]
})

const tauOptions = (c: RunConfig, data: Option.Option<string>): TauEnv.TauEnvOptions | undefined => {
  const tau = c.environment.tau
  if (tau === undefined && Option.isNone(data)) return undefined
  const base: TauEnv.TauEnvOptions =
    tau === undefined
      ? {
          dataDir: ".",
          domain: "retail",
          user: "scripted",
          maxSteps: 30,
          toolCallFormat: c.environment.tool_call_format
        }
      : TauEnv.optionsFromConfig(c.environment, tau)
  return Option.isSome(data) ? { ...base, dataDir: data.value } : base
}

/** An `mcp_tool` row's tool_sequence made by a scripted agent, then its answer. */
const checkMcpRow = Effect.fn("cli.env.checkMcpRow")(function* (row: PromptRow, c: RunConfig) {
  const truth = yield* Rewards.decodeGroundTruth(row.reward_spec?.ground_truth).pipe(
    Effect.mapError((e) => userError(e.message))
  )
  const sequence = truth.tool_sequence ?? []
  const format: ToolCallParser.WriteFormat =
    c.environment.tool_call_format === "auto" ? "hermes" : c.environment.tool_call_format
  const env = yield* McpToolEnv.make(row, {
    ...McpToolEnv.optionsFromConfig(c.environment, c.generator),
    maxTurns: sequence.length + 1
  })
  yield* env.init(row.prompt)
  const results: Array<string> = []
  let reward = 0
  for (const call of sequence) {
    const out = yield* env.step(ToolCallParser.toText({ name: call.tool, arguments: call.arguments ?? {} }, format))
    results.push(...out.metadata.toolCalls.map((r) => r.result))
    reward = out.reward
    if (out.done) return { reward, hash: Hash.hash(results) }
  }
  const answer =
    truth.answer === undefined ? "" : Array.isArray(truth.answer) ? String(truth.answer[0]) : String(truth.answer)
  const last = yield* env.step(`<answer>${answer}</answer>`)
  return { reward: last.reward, hash: Hash.hash(results) }
})

const readExpected = Effect.fn("cli.env.readExpected")(function* (file: string) {
  const fs = yield* FileSystem.FileSystem
  const text = yield* fs.readFileString(file)
  const golden = yield* Effect.try({
    try: () => JSON.parse(text) as { tasks?: ReadonlyArray<{ split: string; id: number; canonical_hash: string }> },
    catch: () => userError(`${file} is not JSON`)
  })
  return new Map((golden.tasks ?? []).map((t) => [`${t.split}/${t.id}`, t.canonical_hash]))
})

export interface CheckOptions {
  readonly tasks: string
  readonly data: Option.Option<string>
  readonly expect: Option.Option<string>
}

/** Check every task, printing one JSON line each, then the summary line; fails when a task or hash is off. */
export const check = Effect.fn("EnvCheck.check")(function* (c: RunConfig, flags: CheckOptions) {
  const tau = tauOptions(c, flags.data)
  const rows = yield* readRows(flags.tasks, tau)
  const expected = Option.isSome(flags.expect) ? yield* readExpected(flags.expect.value) : new Map<string, string>()
  const needsMcp = rows.some((r) => r.env_class !== TauEnv.envClass)
  const toolIo = needsMcp
    ? ToolIo.layerFromConfig(c.environment)
    : Layer.succeed(ToolIo.ToolIo, ToolIo.makeReplay({ records: [] }))
  const lines: Array<Line> = []
  let mismatched = 0
  yield* Effect.gen(function* () {
    for (const [index, row] of rows.entries()) {
      const info = row.extra_info ?? {}
      const taskId = typeof info["task_id"] === "number" ? info["task_id"] : (row.uid ?? index)
      const split = typeof info["split"] === "string" ? info["split"] : "-"
      const outcome =
        row.env_class === TauEnv.envClass
          ? yield* tau === undefined
              ? Effect.fail(userError("tau_bench rows need environment.tau in the config or --data"))
              : TauEnv.check(row, tau).pipe(
                  Effect.provide(UserLlm.layerNone), // the check replays actions with the scripted user
                  Effect.mapError((e) => userError(e.message))
                )
          : yield* checkMcpRow(row, c)
      const want = expected.get(`${split}/${taskId}`)
      if (want !== undefined && want !== outcome.hash) mismatched++
      const line: Line = {
        task: taskId,
        split,
        reward: outcome.reward,
        hash: outcome.hash,
        ...(want !== undefined && want !== outcome.hash ? { expected: want } : {})
      }
      lines.push(line)
      yield* Console.log(JSON.stringify(line))
    }
  }).pipe(
    Effect.scoped,
    Effect.provide(toolIo),
    Effect.mapError((e) => (e instanceof CliError.UserError ? e : userError(`${e}`)))
  )
  const failed = lines.filter((l) => l.reward !== 1)
  const summary = {
    tasks: lines.length,
    reward_mean: lines.length === 0 ? 0 : lines.reduce((s, l) => s + l.reward, 0) / lines.length,
    passed: lines.length - failed.length,
    failed: failed.map((l) => `${l.split}/${l.task}`),
    ...(Option.isSome(flags.expect)
      ? { expected: { checked: lines.filter((l) => expected.has(`${l.split}/${l.task}`)).length, mismatched } }
      : {})
  }
  yield* Console.log(JSON.stringify(summary))
  if (failed.length > 0 || mismatched > 0) {
    const message = `${failed.length} of ${lines.length} tasks did not get reward 1; ${mismatched} hashes differ from the expected`
    return yield* userError(message)
  }
})
