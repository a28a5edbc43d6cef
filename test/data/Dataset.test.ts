import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, type Path, Stream } from "effect"
import { parquetWriteFile } from "hyparquet-writer"
import { readRows } from "../../src/cli/TrainCommand.ts"
import * as Dataset from "../../src/data/Dataset.ts"

const row = (i: number) => ({
  data_source: i % 2 === 0 ? "toolbox" : "math",
  env_class: "mcp_tool",
  prompt: [
    { role: "system", content: "Use tools." },
    { role: "user", content: `What is ${i} + ${i}?` }
  ],
  reward_spec: { method: "rule", ground_truth: { answer: 2 * i } },
  extra_info: { index: i },
  difficulty: "easy"
})

const withTempDir = <A, E>(
  f: (dir: string, fs: FileSystem.FileSystem) => Effect.Effect<A, E, FileSystem.FileSystem | Path.Path>
) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const dir = yield* fs.makeTempDirectoryScoped()
    return yield* f(dir, fs)
  }).pipe(Effect.provide(NodeServices.layer))

const collect = (file: string) => Dataset.read(file).pipe(Stream.runCollect, Effect.provide(NodeServices.layer))

describe("Dataset.read", () => {
  it.effect("streams JSONL rows decoded, with extras and a uid derived from file and line", () =>
    withTempDir((dir, fs) =>
      Effect.gen(function* () {
        const file = `${dir}/train.jsonl`
        yield* fs.writeFileString(file, [1, 2, 3].map((i) => JSON.stringify(row(i))).join("\n") + "\n\n")
        const rows = yield* collect(file)
        assert.strictEqual(rows.length, 3)
        assert.strictEqual(rows[0]!.row.uid, "train.jsonl#1")
        assert.strictEqual(rows[2]!.row.prompt[1]!.content, "What is 3 + 3?")
        assert.deepStrictEqual(rows[0]!.row.extras, { difficulty: "easy" })
        assert.deepStrictEqual(rows[1]!.row.reward_spec, { method: "rule", ground_truth: { answer: 4 } })
      })
    )
  )

  it.effect("names file, line and key when JSONL row 7 lacks prompt", () =>
    withTempDir((dir, fs) =>
      Effect.gen(function* () {
        const file = `${dir}/bad.jsonl`
        const lines = Array.from({ length: 9 }, (_, i) => {
          const r: Record<string, unknown> = row(i + 1)
          if (i + 1 === 7) delete r["prompt"]
          return JSON.stringify(r)
        })
        yield* fs.writeFileString(file, lines.join("\n"))
        const error = yield* collect(file).pipe(Effect.flip)
        assert.strictEqual(error.row, 7)
        assert.strictEqual(error.message, `${file}:7: prompt: Missing key`)
      })
    )
  )

  it.effect("reports a line that is not JSON with its line number", () =>
    withTempDir((dir, fs) =>
      Effect.gen(function* () {
        const file = `${dir}/torn.jsonl`
        yield* fs.writeFileString(file, `${JSON.stringify(row(1))}\n{"data_source": "x", "pro`)
        const error = yield* collect(file).pipe(Effect.flip)
        assert.strictEqual(error.row, 2)
        assert.include(error.message, "not valid JSON")
      })
    )
  )

  it.effect("reads JSON arrays, and rejects a JSON file that is not an array", () =>
    withTempDir((dir, fs) =>
      Effect.gen(function* () {
        const file = `${dir}/rows.json`
        yield* fs.writeFileString(file, JSON.stringify([row(1), row(2)]))
        assert.strictEqual((yield* collect(file)).length, 2)
        const bad = `${dir}/object.json`
        yield* fs.writeFileString(bad, JSON.stringify(row(1)))
        const error = yield* collect(bad).pipe(Effect.flip)
        assert.include(error.message, "must be an array of rows")
      })
    )
  )

  it.effect("reads Parquet with nested list<struct> prompt columns (SkyRL's layout)", () =>
    withTempDir((dir) =>
      Effect.gen(function* () {
        const file = `${dir}/train.parquet`
        const rows = [1, 2, 3].map(row)
        yield* Effect.promise(async () =>
          parquetWriteFile({
            filename: file,
            schema: [
              { name: "root", num_children: 4 },
              { name: "data_source", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
              { name: "env_class", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
              { name: "prompt", repetition_type: "REQUIRED", converted_type: "LIST", num_children: 1 },
              { name: "list", repetition_type: "REPEATED", num_children: 1 },
              { name: "element", repetition_type: "REQUIRED", num_children: 2 },
              { name: "role", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
              { name: "content", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
              { name: "index", type: "INT64", repetition_type: "REQUIRED" }
            ],
            columnData: [
              { name: "data_source", data: rows.map((r) => r.data_source) },
              { name: "env_class", data: rows.map((r) => r.env_class) },
              { name: "prompt", data: rows.map((r) => r.prompt) },
              { name: "index", data: rows.map((_, i) => BigInt(i)) }
            ]
          })
        )
        const read = yield* collect(file)
        assert.strictEqual(read.length, 3)
        assert.strictEqual(read[1]!.row.prompt[1]!.content, "What is 2 + 2?")
        assert.deepStrictEqual(read[2]!.row.extras, { index: 2 })
      })
    )
  )

  it.effect("reads Parquet whose nested columns were written as JSON text, and names the bad row", () =>
    withTempDir((dir) =>
      Effect.gen(function* () {
        const file = `${dir}/flat.parquet`
        const prompts = [JSON.stringify(row(1).prompt), JSON.stringify([{ role: "user" }])]
        yield* Effect.promise(async () =>
          parquetWriteFile({
            filename: file,
            columnData: [
              { name: "data_source", data: ["a", "b"], type: "STRING" },
              { name: "env_class", data: ["mcp_tool", "mcp_tool"], type: "STRING" },
              { name: "prompt", data: prompts, type: "STRING" }
            ]
          })
        )
        const error = yield* collect(file).pipe(Effect.flip)
        assert.strictEqual(error.message, `${file}:2: prompt.0.content: Missing key`)
      })
    )
  )

  it.effect("rejects unknown extensions", () =>
    Effect.gen(function* () {
      const error = yield* collect("rows.csv").pipe(Effect.flip)
      assert.include(error.message, "expected .json, .jsonl or .parquet")
    })
  )
})

describe("data.include", () => {
  // rows 1..6: extra_info {index: i, family: a|b|c in turn}
  const familyRow = (i: number) => ({ ...row(i), extra_info: { index: i, family: ["a", "b", "c"][i % 3] } })
  const writeRows = (file: string, fs: FileSystem.FileSystem) =>
    fs.writeFileString(file, [1, 2, 3, 4, 5, 6].map((i) => JSON.stringify(familyRow(i))).join("\n"))

  it.effect("keeps the rows whose extra_info values are listed, before max_prompts takes the first N", () =>
    withTempDir((dir, fs) =>
      Effect.gen(function* () {
        const file = `${dir}/rows.jsonl`
        yield* writeRows(file, fs)
        const index = (rows: ReadonlyArray<{ readonly extra_info?: Record<string, unknown> }>) =>
          rows.map((r) => r.extra_info?.["index"])
        assert.deepStrictEqual(index(yield* readRows([file], undefined, { family: ["a", "c"] })), [2, 3, 5, 6])
        assert.deepStrictEqual(index(yield* readRows([file], 3, { family: ["a", "c"] })), [2, 3, 5])
        assert.deepStrictEqual(index(yield* readRows([file], undefined, { family: ["c"], index: [4, 5] })), [5])
        assert.deepStrictEqual(index(yield* readRows([file], 2)), [1, 2])
      })
    )
  )

  it.effect("fails naming data.include and the files when it keeps no row", () =>
    withTempDir((dir, fs) =>
      Effect.gen(function* () {
        const file = `${dir}/rows.jsonl`
        yield* writeRows(file, fs)
        const error = yield* readRows([file], undefined, { family: ["unit_sum"] }).pipe(Effect.flip)
        assert.strictEqual(error._tag, "ConfigError")
        assert.include(error.message, `data.include {"family":["unit_sum"]} keeps none of the 6 rows of ${file}`)
      })
    )
  )
})
