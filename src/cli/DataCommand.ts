/**
 * `data inspect FILE`: validate a dataset (every row), print counts and prompt length statistics, list bad rows as
 * `FILE:ROW: path: message`, and end with a JSON summary line. Exits 1 when any row is bad.
 *
 * `data generate toolbox --seed N --train 2000 --val 200 --out data/toolbox`: write multi-step tasks for the bundled
 * toolbox server (`train.jsonl`, `val.jsonl`) and demonstrations of the train tasks (`demos.jsonl`); the same flags
 * give byte-identical files. Ends with a JSON line: counts per split and family, file sizes.
 */
import { Console, Effect, FileSystem, Option, Path, Stream } from "effect"
import { Argument, CliError, Command, Flag } from "effect/cli"
import * as Dataset from "../data/Dataset.ts"
import * as DatasetStats from "../data/DatasetStats.ts"
import * as TauBenchConverter from "../data/TauBenchConverter.ts"
import * as ToolboxTasks from "../data/ToolboxTasks.ts"
import * as TauDb from "../env/tau/Db.ts"

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

const generate = Command.make("generate").pipe(
  Command.withDescription("Generate datasets"),
  Command.withSubcommands([toolbox])
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

const convert = Command.make("convert").pipe(
  Command.withDescription("Convert datasets to SkyRL-format rows"),
  Command.withSubcommands([tauBench])
)

export const command = Command.make("data").pipe(
  Command.withDescription("Inspect, convert and generate datasets"),
  Command.withSubcommands([inspect, convert, generate])
)
