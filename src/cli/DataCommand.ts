/**
 * `data inspect FILE`: validate a dataset (every row), print counts and prompt length statistics, list bad rows as
 * `FILE:ROW: path: message`, and end with a JSON summary line. Exits 1 when any row is bad.
 */
import { Console, Effect, Path, Stream } from "effect"
import { Argument, CliError, Command } from "effect/cli"
import * as Dataset from "../data/Dataset.ts"
import * as DatasetStats from "../data/DatasetStats.ts"

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
).pipe(Command.withDescription("Validate a dataset; print row count, env classes, data sources and prompt lengths"))

export const command = Command.make("data").pipe(
  Command.withDescription("Inspect, convert and generate datasets"),
  Command.withSubcommands([inspect])
)
