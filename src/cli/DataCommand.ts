/**
 * `data inspect FILE`: validate a dataset (every row), print counts and prompt length statistics, list bad rows as
 * `FILE:ROW: path: message`, and end with a JSON summary line. Exits 1 when any row is bad.
 *
 * `data generate toolbox --seed N --train 2000 --val 200 --out data/toolbox`: write multi-step tasks for the bundled
 * toolbox server (`train.jsonl`, `val.jsonl`) and demonstrations of the train tasks (`demos.jsonl`); the same flags
 * give byte-identical files. Ends with a JSON line: counts per split and family, file sizes.
 */
import { Console, Effect, FileSystem, Option, Path, type Scope, Stream } from "effect"
import { Argument, CliError, Command, Flag } from "effect/cli"
import * as Dataset from "../data/Dataset.ts"
import * as DatasetStats from "../data/DatasetStats.ts"
import * as DependentSpecs from "../data/DependentSpecs.ts"
import * as LlmTasks from "../data/LlmTasks.ts"
import * as TauBenchConverter from "../data/TauBenchConverter.ts"
import * as ToolboxTasks from "../data/ToolboxTasks.ts"
import { DatasetError } from "../domain/Errors.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import * as ChatClient from "../env/ChatClient.ts"
import * as TauDb from "../env/tau/Db.ts"
import * as RunFlags from "./RunFlags.ts"
import * as ToolsCommand from "./ToolsCommand.ts"

const maxListed = 20

const inspect = Command.make(
  "inspect",
  {
    file: Argument.File("file", { mustExist: true }).pipe(
      Argument.withDescription("A .json, .jsonl or .parquet dataset")
    )
  },
  Effect.fn("cli.data.inspect")(function* ({ file }) {
    const path = yield* Path.Path
    const baseName = path.basename(file)
    const acc = new DatasetStats.Accumulator(file)
    yield* Dataset.readRaw(file).pipe(
      Stream.runForEach(({ raw, index }) =>
        Dataset.toRow(raw, file, index, baseName).pipe(
          Effect.match({ onFailure: (e) => acc.fail(e), onSuccess: (row) => acc.add(row) })
        )
      )
    )
    const stats = acc.stats()
    for (const error of acc.errors.slice(0, maxListed)) yield* Console.error(error.message)
    if (acc.errors.length > maxListed) yield* Console.error(`... and ${acc.errors.length - maxListed} more bad rows`)
    const table = (title: string, counts: Readonly<Record<string, number>>) =>
      `${title}: ${
        Object.entries(counts)
          .map(([k, n]) => `${k} (${n})`)
          .join(", ") || "none"
      }`
    yield* Console.log(`${file}: ${stats.rows} rows, ${stats.badRows} bad`)
    yield* Console.log(table("env classes", stats.envClasses))
    yield* Console.log(table("data sources", stats.dataSources))
    const s = stats.promptChars
    yield* Console.log(`prompt chars: min ${s.min}, mean ${s.mean}, p50 ${s.p50}, p95 ${s.p95}, max ${s.max}`)
    yield* Console.log(
      `prompt messages: min ${stats.promptMessages.min}, max ${stats.promptMessages.max}; with ground truth: ${stats.withGroundTruth}`
    )
    yield* Console.log(JSON.stringify(stats))
    if (stats.badRows > 0) {
      const message = `${stats.badRows} of ${stats.rows} rows of ${file} are invalid`
      return yield* new CliError.UserError({ cause: new Error(message), userMessage: message })
    }
  })
).pipe(
  Command.withDescription("Validate a dataset; print row count, env classes, data sources and prompt lengths"),
  Command.withExamples(({ commandPath }) => [
    { command: `${commandPath.join(" ")} data/toolbox/val.jsonl`, description: "check the shipped held-out tasks" }
  ])
)

const userError = (message: string) => new CliError.UserError({ cause: new Error(message), userMessage: message })

const force = Flag.Boolean("force").pipe(
  Flag.withDescription("Overwrite output files that exist (off: refuse)"),
  Flag.withDefault(false)
)

/** Refuse to overwrite any of `files` that exists unless `--force` (shipped data is one regeneration away from lost). */
const refuseOverwrite = Effect.fnUntraced(function* (files: ReadonlyArray<string>, overwrite: boolean) {
  if (overwrite) return
  const fs = yield* FileSystem.FileSystem
  const existing: Array<string> = []
  for (const file of files) if (yield* fs.exists(file).pipe(Effect.orElseSucceed(() => false))) existing.push(file)
  if (existing.length > 0) {
    return yield* userError(
      `${existing.join(", ")} ${existing.length === 1 ? "exists" : "exist"}: pass --force to overwrite, or --out another place`
    )
  }
})

const positiveInt = (name: string, fallback: number, description: string) =>
  Flag.Int(name).pipe(Flag.withDescription(`${description} (default ${fallback})`), Flag.withDefault(fallback))

const toolbox = Command.make(
  "toolbox",
  {
    seed: Flag.Int("seed").pipe(Flag.withDescription("PRNG seed: the same seed gives byte-identical files")),
    train: positiveInt("train", 2000, "Train tasks (and demonstrations)"),
    val: positiveInt("val", 200, "Validation tasks"),
    out: Flag.String("out").pipe(
      Flag.withDescription("Output directory (default data/toolbox)"),
      Flag.withDefault("data/toolbox")
    ),
    maxOperand: positiveInt("max-operand", ToolboxTasks.defaultKnobs.maxOperand, "Largest operand, quantity or offset"),
    maxChain: positiveInt("max-chain", ToolboxTasks.defaultKnobs.maxChain, "Most calls in an arith_chain task (≥ 2)"),
    families: Flag.String("families").pipe(
      Flag.withDescription(`Comma-separated families (default all): ${ToolboxTasks.families.join(", ")}`),
      Flag.optional
    ),
    exclude: Flag.String("exclude").pipe(
      Flag.withDescription("A rows file (e.g. another set's val.jsonl): drop train tasks and demos with its prompts"),
      Flag.optional
    ),
    force
  },
  Effect.fn("cli.data.generate.toolbox")(function* (flags) {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    const chosen = Option.isSome(flags.families)
      ? flags.families.value
          .split(",")
          .map((f) => f.trim())
          .filter((f) => f !== "")
      : [...ToolboxTasks.families]
    const unknown = chosen.filter((f) => !ToolboxTasks.isFamily(f))
    if (unknown.length > 0) {
      return yield* userError(`unknown families: ${unknown.join(", ")}; known: ${ToolboxTasks.families.join(", ")}`)
    }
    if (flags.train < 0 || flags.val < 0) return yield* userError("--train and --val must be ≥ 0")
    const generated = yield* Effect.try({
      try: () =>
        ToolboxTasks.generate({
          seed: flags.seed,
          train: flags.train,
          val: flags.val,
          maxOperand: flags.maxOperand,
          maxChain: flags.maxChain,
          families: chosen.filter(ToolboxTasks.isFamily)
        }),
      catch: (e) => userError(e instanceof Error ? e.message : String(e))
    })
    let data = generated
    if (Option.isSome(flags.exclude)) {
      const held = yield* Stream.runCollect(Dataset.readAll([flags.exclude.value]))
      const excluded = ToolboxTasks.exclude(generated, new Set(held.map(ToolboxTasks.promptText)))
      data = excluded.data
      if (excluded.dropped > 0) {
        yield* Console.log(`dropped ${excluded.dropped} train tasks whose prompt is in ${flags.exclude.value}`)
      }
    }
    const files = {
      train: ToolboxTasks.toJsonl(data.train),
      val: ToolboxTasks.toJsonl(data.val),
      demos: ToolboxTasks.toJsonl(data.demos)
    }
    yield* refuseOverwrite(
      Object.keys(files).map((name) => path.join(flags.out, `${name}.jsonl`)),
      flags.force
    )
    yield* fs.makeDirectory(flags.out, { recursive: true })
    const bytes: Record<string, number> = {}
    for (const [name, text] of Object.entries(files)) {
      const file = path.join(flags.out, `${name}.jsonl`)
      yield* fs.writeFileString(file, text)
      bytes[name] = Buffer.byteLength(text)
    }
    const counts = {
      train: ToolboxTasks.countByFamily(data.train),
      val: ToolboxTasks.countByFamily(data.val),
      demos: ToolboxTasks.countByFamily(data.demos)
    }
    for (const [split, rows] of [
      ["train", data.train.length],
      ["val", data.val.length],
      ["demos", data.demos.length]
    ] as const) {
      yield* Console.log(`${path.join(flags.out, `${split}.jsonl`)}: ${rows} rows, ${bytes[split]} bytes`)
    }
    for (const family of chosen) {
      const f = family as ToolboxTasks.Family
      const repeats = (data.repeats.train[f] ?? 0) + (data.repeats.val[f] ?? 0)
      yield* Console.log(
        `  ${f}: train ${counts.train[f] ?? 0}, val ${counts.val[f] ?? 0}${repeats > 0 ? ` (${repeats} repeated prompts: few distinct tasks)` : ""}`
      )
    }
    yield* Console.log(
      JSON.stringify({
        seed: flags.seed,
        out: flags.out,
        counts,
        bytes,
        repeats: data.repeats,
        weights: ToolboxTasks.weights
      })
    )
  })
).pipe(
  Command.withDescription("Multi-step tasks for the bundled toolbox MCP server, with SFT demonstrations"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --seed 7 --train 500 --val 50 --out runs/toolbox-7`,
      description: "500 train and 50 held-out tasks in a new directory"
    }
  ])
)

// ---------------------------------------------------------------------------------------------------------------
// Tasks written by an LLM: `generate llm` (tools from a file) and `generate mcp` (an MCP server's tools).

const list = (text: string): ReadonlyArray<string> =>
  text
    .split(",")
    .map((x) => x.trim())
    .filter((x) => x !== "")

const llmFlags = {
  url: Flag.String("url").pipe(
    Flag.withDescription("Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (not with --replay)"),
    Flag.optional
  ),
  model: Flag.String("model").pipe(Flag.withDescription("The endpoint's model name"), Flag.optional),
  apiKeyEnv: Flag.String("api-key-env").pipe(
    Flag.withDescription("Environment variable holding the API key (sent as a bearer token), e.g. OPENAI_API_KEY"),
    Flag.optional
  ),
  count: positiveInt("count", 50, "Tasks to keep"),
  seed: positiveInt("seed", 0, "Seed of the (domain, complexity) draws and the requests' seed"),
  batch: positiveInt("batch", LlmTasks.defaults.batch, "Tasks asked for per call"),
  maxCalls: Flag.Int("max-calls").pipe(
    Flag.withDescription("Most calls in all (default 3 × ⌈count / batch⌉ + 2)"),
    Flag.optional
  ),
  concurrency: positiveInt("concurrency", LlmTasks.defaults.concurrency, "Calls in flight at once"),
  maxTools: positiveInt("max-tools", LlmTasks.defaults.maxTools, "Most tool calls one task may need"),
  maxTurns: positiveInt("max-turns", LlmTasks.defaults.maxTurns, "The rows' max_turns (turn budget per episode)"),
  temperature: Flag.Finite("temperature").pipe(
    Flag.withDescription(`Sampling temperature (default ${LlmTasks.defaults.temperature})`),
    Flag.withDefault(LlmTasks.defaults.temperature)
  ),
  maxTokens: positiveInt("max-tokens", LlmTasks.defaults.maxTokens, "Most tokens per answer"),
  noResponseFormat: Flag.Boolean("no-response-format").pipe(
    Flag.withDescription("Do not send response_format (for endpoints without JSON-schema outputs)"),
    Flag.withDefault(false)
  ),
  sequenceWeight: Flag.Finite("sequence-weight").pipe(
    Flag.withDescription(
      `Reward weight of the tool sequence's partial credit; the outcome gets 1 − it (default ${LlmTasks.defaults.sequenceWeight})`
    ),
    Flag.withDefault(LlmTasks.defaults.sequenceWeight)
  ),
  reward: Flag.Literals("reward", ["rule", "judge"]).pipe(
    Flag.withDescription(
      "rule: the rule reward on the expected calls and answer; judge: the LLM group judge (environment.judge), with them as its reference (default rule)"
    ),
    Flag.withDefault("rule" as const)
  ),
  rubric: Flag.String("rubric").pipe(
    Flag.withDescription("With --reward judge: the rows' rubric (default: environment.judge.rubric of the run)"),
    Flag.optional
  ),
  out: Flag.String("out").pipe(
    Flag.withDescription("Output .jsonl (or .json); the prompts and raw answers go to <out>.raw.jsonl")
  ),
  replay: Flag.File("replay", { mustExist: true }).pipe(
    Flag.withDescription("A raw log (<out>.raw.jsonl) to regenerate the same rows from, with no endpoint or server"),
    Flag.optional
  ),
  force
}

type LlmFlags = {
  readonly [K in keyof typeof llmFlags]: (typeof llmFlags)[K] extends Flag.Flag<infer A> ? A : never
}

/** Generates (or replays), then writes the rows and the raw log and prints progress and a JSON summary. */
const runLlmTasks = Effect.fnUntraced(function* (
  flags: LlmFlags,
  fresh: Effect.Effect<
    { readonly tools: ReadonlyArray<LlmTasks.Tool>; readonly settings: LlmTasks.Settings },
    CliError.UserError,
    Scope.Scope | FileSystem.FileSystem
  >
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const rawOut = LlmTasks.rawFile(flags.out)
  yield* refuseOverwrite([flags.out, rawOut], flags.force)
  let client: ChatClient.ChatClient
  let tools: ReadonlyArray<LlmTasks.Tool>
  let settings: LlmTasks.Settings
  if (Option.isSome(flags.replay)) {
    const file = flags.replay.value
    const text = yield* fs.readFileString(file).pipe(Effect.mapError((e) => userError(`${file}: ${e.message}`)))
    const log = yield* Effect.try({
      try: () => LlmTasks.readRawLog(text, file),
      catch: (e) => userError(e instanceof Error ? e.message : String(e))
    })
    tools = log.header.tools
    settings = log.header.settings
    client = ChatClient.make({
      url: "http://replay.invalid/v1",
      model: log.header.model,
      mode: "replay",
      records: log.records
    })
    yield* Console.log(
      `replaying ${log.records.length} recorded calls from ${file} (settings and tools from its header)`
    )
  } else {
    if (Option.isNone(flags.url) || Option.isNone(flags.model)) {
      return yield* userError("give --url and --model (an OpenAI-compatible endpoint), or --replay RAW_LOG")
    }
    const fromSource = yield* fresh
    tools = fromSource.tools
    settings = fromSource.settings
    const key = yield* ChatClient.apiKey(
      Option.isSome(flags.apiKeyEnv) ? { env: flags.apiKeyEnv.value } : undefined
    ).pipe(Effect.mapError((e) => userError(`--api-key-env: ${e.message}`)))
    if (Option.isSome(flags.apiKeyEnv) && key === undefined) {
      return yield* userError(`--api-key-env ${flags.apiKeyEnv.value}: that environment variable is not set`)
    }
    client = ChatClient.make({
      url: flags.url.value,
      model: flags.model.value,
      apiKey: key,
      maxConcurrency: settings.concurrency,
      mode: "record"
    })
    yield* Console.log(
      `asking ${client.endpoint} (${client.model}) for ${settings.count} tasks over ${tools.length} tools`
    )
  }
  const result = yield* LlmTasks.generate(client, tools, settings, (p) =>
    Console.error(
      `call ${p.call + 1}: ${settings.style === "mcp" ? `difficulty ${p.complexity}` : `${p.domain} / ${p.complexity}`}: ` +
        `kept ${p.kept}, rejected ${p.rejected.length}${p.rejected.length > 0 ? ` (${p.rejected[0]!.reason}${p.rejected.length > 1 ? ", ..." : ""})` : ""}; ` +
        `${p.total}/${settings.count} tasks`
    )
  ).pipe(Effect.mapError((e) => userError(e.message)))
  const dir = path.dirname(flags.out)
  if (dir !== "") yield* fs.makeDirectory(dir, { recursive: true })
  yield* fs.writeFileString(flags.out, TauBenchConverter.serialize(result.rows, flags.out))
  const header: LlmTasks.Header = { kind: "header", settings, model: client.model, tools }
  yield* fs.writeFileString(rawOut, LlmTasks.rawLog(header, result.calls))
  yield* Console.log(`${flags.out}: ${result.rows.length} rows; ${rawOut}: ${result.calls.length} calls`)
  if (result.rows.length < settings.count) {
    yield* Console.error(
      `only ${result.rows.length} of ${settings.count} tasks after ${result.calls.length} calls (--max-calls ${settings.maxCalls}); see the rejections in ${rawOut}`
    )
  }
  yield* Console.log(
    JSON.stringify({
      out: flags.out,
      raw: rawOut,
      rows: result.rows.length,
      calls: result.calls.length,
      rejected: result.rejected,
      duplicates: result.duplicates,
      prompt_tokens: result.promptTokens,
      completion_tokens: result.completionTokens,
      replayed: client.mode === "replay"
    })
  )
})

const settingsOf = (
  flags: LlmFlags,
  style: "llm" | "mcp",
  domains: ReadonlyArray<string>,
  complexities: ReadonlyArray<string>,
  dataSource: string
) =>
  Effect.gen(function* () {
    if (!(flags.sequenceWeight >= 0 && flags.sequenceWeight <= 1)) {
      return yield* userError("--sequence-weight must be in [0, 1]")
    }
    if (Option.isSome(flags.rubric) && flags.reward !== "judge")
      return yield* userError("--rubric needs --reward judge")
    if (flags.count < 1 || flags.batch < 1 || flags.maxTools < 1 || flags.maxTurns < 1 || flags.concurrency < 1) {
      return yield* userError("--count, --batch, --max-tools, --max-turns and --concurrency must be ≥ 1")
    }
    const maxCalls = Option.getOrElse(flags.maxCalls, () => LlmTasks.defaultMaxCalls(flags.count, flags.batch))
    if (maxCalls < 1) return yield* userError("--max-calls must be ≥ 1")
    const settings: LlmTasks.Settings = {
      style,
      domains,
      complexities,
      maxTools: flags.maxTools,
      maxTurns: flags.maxTurns,
      count: flags.count,
      seed: flags.seed,
      batch: flags.batch,
      maxCalls,
      concurrency: flags.concurrency,
      dataSource,
      sequenceWeight: flags.sequenceWeight,
      temperature: flags.temperature,
      maxTokens: flags.maxTokens,
      responseFormat: !flags.noResponseFormat,
      reward: flags.reward,
      ...(Option.isSome(flags.rubric) ? { rubric: flags.rubric.value } : {})
    }
    return settings
  })

const llm = Command.make(
  "llm",
  {
    ...llmFlags,
    tools: Flag.File("tools", { mustExist: true }).pipe(
      Flag.withDescription(
        "The tools, a JSON array: MCP tools {name, description, inputSchema, server?} (what `tools list` prints last) or OpenAI functions"
      ),
      Flag.optional
    ),
    domains: Flag.String("domains").pipe(
      Flag.withDescription(`Comma-separated domains (default ${LlmTasks.defaults.llm.domains.join(", ")})`),
      Flag.withDefault(LlmTasks.defaults.llm.domains.join(","))
    ),
    complexities: Flag.String("complexities").pipe(
      Flag.withDescription(`Comma-separated complexities (default ${LlmTasks.defaults.llm.complexities.join(", ")})`),
      Flag.withDefault(LlmTasks.defaults.llm.complexities.join(","))
    ),
    dataSource: Flag.String("data-source").pipe(
      Flag.withDescription("The rows' data_source (default llm_tasks)"),
      Flag.withDefault("llm_tasks")
    )
  },
  Effect.fn("cli.data.generate.llm")(function* (flags) {
    const fresh = Effect.gen(function* () {
      if (Option.isNone(flags.tools))
        return yield* userError("give --tools FILE (a JSON array of tools), or --replay RAW_LOG")
      const fs = yield* FileSystem.FileSystem
      const file = flags.tools.value
      const text = yield* fs.readFileString(file).pipe(Effect.mapError((e) => userError(`${file}: ${e.message}`)))
      const tools = yield* Effect.try({
        try: () => LlmTasks.toolsFromJson(JSON.parse(text) as unknown, file),
        catch: (e) =>
          userError(e instanceof SyntaxError ? `${file}: not valid JSON: ${e.message}` : String((e as Error).message))
      })
      const settings = yield* settingsOf(flags, "llm", list(flags.domains), list(flags.complexities), flags.dataSource)
      return { tools, settings }
    })
    yield* runLlmTasks(flags, fresh)
  }, Effect.scoped)
).pipe(
  Command.withDescription(
    "Tool-use tasks written by an LLM (any OpenAI-compatible endpoint), checked against the tools' schemas, de-duplicated"
  ),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --tools tools.json --url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B --count 200 --out runs/llm/train.jsonl`,
      description: "200 tasks from a vLLM server; prompts and answers kept in runs/llm/train.raw.jsonl"
    },
    {
      command: `${commandPath.join(" ")} --replay runs/llm/train.raw.jsonl --out runs/llm/again.jsonl`,
      description: "the same rows again from the recorded calls, with no endpoint"
    }
  ])
)

const mcp = Command.make(
  "mcp",
  {
    ...llmFlags,
    config: RunFlags.config.pipe(Flag.optional),
    server: Flag.String("server").pipe(
      Flag.withDescription("Name of a server in the config's environment.mcp_servers (with --config)"),
      Flag.optional
    ),
    command: Flag.String("command").pipe(
      Flag.withDescription('A stdio server command line, e.g. "node src/toolbox/server.ts" ("node" is this Node)'),
      Flag.optional
    ),
    name: Flag.String("name").pipe(
      Flag.withDescription(
        "The server's name in the rows: the environment.mcp_servers name the run mounts it under (default: --server's, or the command's)"
      ),
      Flag.optional
    ),
    complexities: Flag.String("difficulties").pipe(
      Flag.withDescription(`Comma-separated difficulties (default ${LlmTasks.defaults.mcp.complexities.join(", ")})`),
      Flag.withDefault(LlmTasks.defaults.mcp.complexities.join(","))
    ),
    dataSource: Flag.String("data-source").pipe(
      Flag.withDescription("The rows' data_source (default mcp_tasks/<server>)"),
      Flag.optional
    )
  },
  Effect.fn("cli.data.generate.mcp")(function* (flags) {
    const fresh = Effect.gen(function* () {
      if (Option.isNone(flags.command) && Option.isNone(flags.config)) {
        return yield* userError('give --command "CMD ARGS" or --config FILE [--server NAME], or --replay RAW_LOG')
      }
      const selected = yield* ToolsCommand.selectServers({ ...flags, url: Option.none(), overrides: [] })
      if (Option.isSome(flags.name) && selected.length > 1) {
        return yield* userError("--name renames one server: pick it with --server NAME")
      }
      const servers = Option.isSome(flags.name)
        ? selected.map((s) => ({ ...s, name: flags.name.pipe(Option.getOrThrow) }))
        : selected
      const client = yield* ToolsCommand.connect(servers)
      const mcpTools = yield* client.tools
      if (mcpTools.length === 0) return yield* userError(`${servers.map((s) => s.name).join(", ")} offers no tools`)
      const tools: ReadonlyArray<LlmTasks.Tool> = mcpTools.map((t) => ({
        name: t.name,
        description: t.description,
        inputSchema: t.inputSchema,
        server: t.server
      }))
      const dataSource = Option.getOrElse(flags.dataSource, () => `mcp_tasks/${servers.map((s) => s.name).join("+")}`)
      const settings = yield* settingsOf(flags, "mcp", [], list(flags.complexities), dataSource)
      return { tools, settings }
    })
    yield* runLlmTasks(flags, fresh)
  }, Effect.scoped)
).pipe(
  Command.withDescription(
    "Tasks for an MCP server's own tools (its schemas in the prompt), written by an LLM; rows name the server"
  ),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --command "node src/toolbox/server.ts" --name toolbox --url http://127.0.0.1:8000/v1 --model policy --count 100 --out runs/mcp/train.jsonl`,
      description: "100 tasks for the bundled toolbox, runnable with mcp_servers [{name: toolbox, ...}]"
    },
    {
      command: `${commandPath.join(" ")} --config configs/quickstart.yaml --server toolbox --url https://api.openai.com/v1 --api-key-env OPENAI_API_KEY --model gpt-4o-mini --out runs/mcp/tb.jsonl`,
      description: "a hosted model writing tasks for a server declared in a config"
    }
  ])
)

const generate = Command.make("generate").pipe(
  Command.withDescription("Generate datasets"),
  Command.withSubcommands([toolbox, llm, mcp])
)

const tauBench = Command.make(
  "tau-bench",
  {
    domain: Flag.Literals("domain", TauDb.domains).pipe(Flag.withDescription("retail or airline")),
    split: Flag.String("split").pipe(Flag.withDescription("Task split: retail train | dev | test, airline test")),
    data: Flag.Directory("data", { mustExist: true }).pipe(
      Flag.withDescription("The tau-bench data directory (holds <domain>/db, tasks.json, tools.json, wiki.md)")
    ),
    out: Flag.String("out").pipe(Flag.withDescription("Output .jsonl (or .json) file")),
    trainRatio: Flag.Finite("train-ratio").pipe(
      Flag.withDescription("Keep this fraction in --out and write the rest to <out>.val.jsonl (default 1: all)"),
      Flag.withDefault(1)
    ),
    force
  },
  Effect.fn("cli.data.convert.tau-bench")(function* (flags) {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    if (!(flags.trainRatio > 0 && flags.trainRatio <= 1)) return yield* userError("--train-ratio must be in (0, 1]")
    const data = yield* TauDb.loadDomain(flags.data, flags.domain).pipe(
      Effect.mapError((e) => userError(`${e.file}: ${e.message}`))
    )
    const known = TauBenchConverter.splits(data)
    if (!known.includes(flags.split)) {
      return yield* userError(`${flags.domain} has no split "${flags.split}"; it has: ${known.join(", ")}`)
    }
    const rows = TauBenchConverter.convert(data, flags.split, flags.trainRatio)
    const files: Array<readonly [string, number]> = [[flags.out, rows.train.length]]
    if (flags.trainRatio < 1) files.push([TauBenchConverter.valFile(flags.out), rows.val.length])
    yield* refuseOverwrite(
      files.map(([file]) => file),
      flags.force
    )
    const dir = path.dirname(flags.out)
    if (dir !== "") yield* fs.makeDirectory(dir, { recursive: true })
    yield* fs.writeFileString(flags.out, TauBenchConverter.serialize(rows.train, flags.out))
    if (flags.trainRatio < 1) {
      yield* fs.writeFileString(files[1]![0], TauBenchConverter.serialize(rows.val, files[1]![0]))
    }
    for (const [file, n] of files) yield* Console.log(`${file}: ${n} rows`)
    yield* Console.log(
      JSON.stringify({
        domain: flags.domain,
        split: flags.split,
        train: { file: flags.out, rows: rows.train.length },
        ...(flags.trainRatio < 1 ? { val: { file: files[1]![0], rows: rows.val.length } } : {})
      })
    )
  })
).pipe(
  Command.withDescription("tau-bench tasks → SkyRL rows for the tau_bench env (ground-truth actions and outputs)"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --domain retail --split dev --data ../shared/tau-bench --out runs/tau/retail-dev.jsonl`,
      description: "the retail dev split as SkyRL rows"
    }
  ])
)

const dependentSpecs = Command.make(
  "dependent-specs",
  {
    input: Flag.File("in", { mustExist: true }).pipe(
      Flag.withDescription("Specs: .jsonl (one per line), .json (an array) or .parquet")
    ),
    out: Flag.String("out").pipe(Flag.withDescription("Output .jsonl (or .json) file")),
    server: Flag.String("server").pipe(
      Flag.withDescription("MCP server (environment.mcp_servers name) of calls whose spec names none"),
      Flag.optional
    ),
    followUps: Flag.Literals("follow-ups", ["append", "drop"]).pipe(
      Flag.withDescription("Later user turns: appended to the first user message, or dropped (default append)"),
      Flag.withDefault("append" as const)
    ),
    sequenceWeight: Flag.Finite("sequence-weight").pipe(
      Flag.withDescription(
        `Reward weight of the partial credit for the tool sequence; the outcome gets 1 − it (default ${DependentSpecs.defaultOptions.sequenceWeight})`
      ),
      Flag.withDefault(DependentSpecs.defaultOptions.sequenceWeight)
    ),
    dataSource: Flag.String("data-source").pipe(
      Flag.withDescription(`data_source of specs that name none (default ${DependentSpecs.defaultOptions.dataSource})`),
      Flag.withDefault(DependentSpecs.defaultOptions.dataSource)
    ),
    force
  },
  Effect.fn("cli.data.convert.dependent-specs")(function* (flags) {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    if (!(flags.sequenceWeight >= 0 && flags.sequenceWeight <= 1)) {
      return yield* userError("--sequence-weight must be in [0, 1]")
    }
    const options: DependentSpecs.Options = {
      ...DependentSpecs.defaultOptions,
      dataSource: flags.dataSource,
      followUps: flags.followUps,
      sequenceWeight: flags.sequenceWeight,
      ...(Option.isSome(flags.server) ? { server: flags.server.value } : {})
    }
    const baseName = path.basename(flags.input)
    const rows: Array<PromptRow> = []
    const errors: Array<string> = []
    yield* Dataset.readRaw(flags.input).pipe(
      Stream.runForEach(({ raw, index }) =>
        Effect.sync(() => {
          const out = DependentSpecs.convert(raw, flags.input, index, baseName, options)
          if (out instanceof DatasetError) errors.push(out.message)
          else rows.push(out)
        })
      ),
      Effect.mapError((e) => userError(e.message))
    )
    if (errors.length > 0) {
      for (const error of errors.slice(0, maxListed)) yield* Console.error(error)
      if (errors.length > maxListed) yield* Console.error(`... and ${errors.length - maxListed} more bad specs`)
      return yield* userError(
        `${errors.length} of ${errors.length + rows.length} specs of ${flags.input} are invalid; nothing written`
      )
    }
    yield* refuseOverwrite([flags.out], flags.force)
    const dir = path.dirname(flags.out)
    if (dir !== "") yield* fs.makeDirectory(dir, { recursive: true })
    yield* fs.writeFileString(flags.out, TauBenchConverter.serialize(rows, flags.out))
    const calls = rows.reduce((n, r) => n + Number(r.extra_info?.["calls"] ?? 0), 0)
    const unresolved = rows.reduce((n, r) => n + Number(r.extra_info?.["unresolved_arguments"] ?? 0), 0)
    yield* Console.log(`${flags.out}: ${rows.length} rows, ${calls} expected calls, ${unresolved} unresolved arguments`)
    yield* Console.log(JSON.stringify({ in: flags.input, out: flags.out, rows: rows.length, calls, unresolved }))
  })
).pipe(
  Command.withDescription(
    "Multi-turn dependent specs → compact prompts (system + one user message) with ground_truth.tool_sequence"
  ),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --in specs.jsonl --out runs/specs/train.jsonl --server toolbox`,
      description: "convert scripted conversations for the toolbox server"
    }
  ])
)

const convert = Command.make("convert").pipe(
  Command.withDescription("Convert datasets to SkyRL-format rows"),
  Command.withSubcommands([tauBench, dependentSpecs])
)

export const command = Command.make("data").pipe(
  Command.withDescription("Inspect, convert and generate datasets"),
  Command.withSubcommands([inspect, convert, generate])
)
