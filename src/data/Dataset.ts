/**
 * Dataset readers: JSON array, JSONL and Parquet files streamed as `Stream<PromptRow>`, each row decoded with the
 * PromptRow schema. A bad row fails with `FILE:ROW: path: message` (rows are 1-based; for JSONL the row is the line
 * number). Keys beyond SkyRL's own become the row's `extras`; a row without `uid` gets `<file name>#<row>`.
 *
 * Parquet columns holding JSON text (`prompt`, `reward_spec`, `extra_info` written as strings) are parsed, since
 * some exporters flatten nested columns that way.
 */
import { Effect, FileSystem, Path, Schema, SchemaIssue, Stream } from "effect"
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } from "hyparquet"
import { DatasetError } from "../domain/Errors.ts"
import { knownKeys, PromptRow } from "../domain/PromptRow.ts"

export type Format = "json" | "jsonl" | "parquet"

export interface RowOf {
  readonly row: PromptRow
  readonly index: number // 1-based row (JSONL: line number)
}

export const formatOf = (file: string): Format | undefined => {
  const lower = file.toLowerCase()
  if (lower.endsWith(".jsonl") || lower.endsWith(".ndjson")) return "jsonl"
  if (lower.endsWith(".json")) return "json"
  if (lower.endsWith(".parquet")) return "parquet"
  return undefined
}

const decodeRow = Schema.decodeUnknownExit(PromptRow)

/** Normalise values that Parquet readers hand back (BigInt, JSON text in nested columns). */
const normalise = (value: unknown, key?: string): unknown => {
  if (typeof value === "bigint") return Number(value)
  if (typeof value === "string" && (key === "prompt" || key === "reward_spec" || key === "extra_info")) {
    const t = value.trim()
    if (t.startsWith("[") || t.startsWith("{")) {
      try {
        return normalise(JSON.parse(t))
      } catch {
        return value
      }
    }
  }
  if (Array.isArray(value)) return value.map((v) => normalise(v))
  if (value instanceof Date) return value.toISOString()
  if (typeof value === "object" && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, normalise(v, k)]))
  }
  return value
}

/** Decode one raw row; `file` and `index` only label errors and the default uid. */
export const toRow = (
  raw: unknown,
  file: string,
  index: number,
  baseName: string
): Effect.Effect<PromptRow, DatasetError> => {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    return Effect.fail(new DatasetError({ file, row: index, detail: "a row must be a JSON object" }))
  }
  const exit = decodeRow(raw, { errors: "all" })
  if (exit._tag === "Failure") {
    const error = exit.cause.reasons.find((r) => r._tag === "Fail")
    const issue =
      error !== undefined && error._tag === "Fail"
        ? SchemaIssue.makeFormatterStandardSchemaV1()(error.error.issue).issues[0]
        : undefined
    return Effect.fail(
      new DatasetError({
        file,
        row: index,
        path: (issue?.path ?? []).map((p) => String(typeof p === "object" ? p.key : p)).join("."),
        detail: issue?.message ?? "invalid row"
      })
    )
  }
  const extras = Object.fromEntries(Object.entries(raw).filter(([k]) => !knownKeys.has(k)))
  const decoded = exit.value
  const row: PromptRow = {
    ...decoded,
    uid: decoded.uid ?? `${baseName}#${index}`,
    ...(Object.keys(extras).length > 0 ? { extras } : {})
  }
  return Effect.succeed(row)
}

const jsonlRaw = (file: string) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    return fs.stream(file).pipe(
      Stream.mapError((cause) => new DatasetError({ file, detail: `cannot read: ${cause.message}` })),
      Stream.decodeText(),
      Stream.splitLines,
      Stream.zipWithIndex,
      Stream.filter(([line]) => line.trim() !== ""),
      Stream.mapEffect(([line, i]) =>
        Effect.try({
          try: () => ({ raw: JSON.parse(line) as unknown, index: i + 1 }),
          catch: (cause) =>
            new DatasetError({ file, row: i + 1, detail: `not valid JSON: ${(cause as Error).message}` })
        })
      )
    )
  }).pipe(Stream.unwrap)

const jsonRaw = (file: string) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const text = yield* fs
      .readFileString(file)
      .pipe(Effect.mapError((cause) => new DatasetError({ file, detail: `cannot read: ${cause.message}` })))
    const parsed = yield* Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: (cause) => new DatasetError({ file, detail: `not valid JSON: ${(cause as Error).message}` })
    })
    if (!Array.isArray(parsed)) {
      return yield* new DatasetError({
        file,
        detail: "a .json dataset must be an array of rows (use .jsonl for one row per line)"
      })
    }
    return Stream.fromIterable(parsed.map((raw, i) => ({ raw: raw as unknown, index: i + 1 })))
  }).pipe(Stream.unwrap)

const parquetChunk = 1024

const parquetRaw = (file: string) =>
  Effect.gen(function* () {
    const buffer = yield* Effect.tryPromise({
      try: () => asyncBufferFromFile(file),
      catch: (cause) => new DatasetError({ file, detail: `cannot read: ${String(cause)}` })
    })
    const metadata = yield* Effect.tryPromise({
      try: () => parquetMetadataAsync(buffer),
      catch: (cause) => new DatasetError({ file, detail: `not a Parquet file: ${String(cause)}` })
    })
    const rows = Number(metadata.num_rows)
    const starts = Array.from({ length: Math.ceil(rows / parquetChunk) }, (_, i) => i * parquetChunk)
    return Stream.fromIterable(starts).pipe(
      Stream.mapEffect((rowStart) =>
        Effect.tryPromise({
          try: () =>
            parquetReadObjects({ file: buffer, metadata, rowStart, rowEnd: Math.min(rows, rowStart + parquetChunk) }),
          catch: (cause) =>
            new DatasetError({ file, row: rowStart + 1, detail: `cannot decode Parquet: ${String(cause)}` })
        }).pipe(Effect.map((objects) => objects.map((raw, i) => ({ raw: normalise(raw), index: rowStart + i + 1 }))))
      ),
      Stream.flatMap((chunk) => Stream.fromIterable(chunk))
    )
  }).pipe(Stream.unwrap)

/** Raw rows with their 1-based index, before schema decoding. */
export const readRaw = (
  file: string
): Stream.Stream<{ readonly raw: unknown; readonly index: number }, DatasetError, FileSystem.FileSystem> => {
  switch (formatOf(file)) {
    case "jsonl":
      return jsonlRaw(file)
    case "json":
      return jsonRaw(file)
    case "parquet":
      return parquetRaw(file)
    default:
      return Stream.fail(
        new DatasetError({ file, detail: "unknown dataset format: expected .json, .jsonl or .parquet" })
      )
  }
}

/** Decoded rows of one file; fails on the first bad row. */
export const read = (file: string): Stream.Stream<RowOf, DatasetError, FileSystem.FileSystem | Path.Path> =>
  Effect.gen(function* () {
    const path = yield* Path.Path
    const baseName = path.basename(file)
    return readRaw(file).pipe(
      Stream.mapEffect(({ raw, index }) =>
        toRow(raw, file, index, baseName).pipe(Effect.map((row) => ({ row, index })))
      )
    )
  }).pipe(Stream.unwrap)

/** Rows of several files in order. */
export const readAll = (
  files: ReadonlyArray<string>
): Stream.Stream<PromptRow, DatasetError, FileSystem.FileSystem | Path.Path> =>
  Stream.fromIterable(files).pipe(Stream.flatMap((file) => read(file).pipe(Stream.map(({ row }) => row))))

/** The row's `extra_info[key]` when it is a string, number or boolean (what can be filtered and grouped on). */
export const extraInfoScalar = (row: PromptRow | undefined, key: string): string | number | boolean | undefined => {
  const value = row?.extra_info?.[key]
  return typeof value === "string" || typeof value === "number" || typeof value === "boolean" ? value : undefined
}

/** `data.include`: per `extra_info` key, the values a row may have there. */
export type Include = Readonly<Record<string, ReadonlyArray<string | number | boolean>>>

/** Whether the row's `extra_info` has, for every key of `include`, one of that key's values. */
export const isIncluded =
  (include: Include) =>
  (row: PromptRow): boolean =>
    Object.entries(include).every(([key, values]) => {
      const value = extraInfoScalar(row, key)
      return value !== undefined && values.includes(value)
    })
