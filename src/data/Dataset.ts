/**
 * Dataset readers: JSON array, JSONL and Parquet files streamed as `Stream<PromptRow>`, each row decoded with the
 * PromptRow schema. A bad row fails with `FILE:ROW: path: message` (rows are 1-based; for JSONL the row is the line
 * number). Keys beyond SkyRL's own become the row's `extras`; a row without `uid` gets `<file name>#<row>`.
 *
 * Parquet columns holding JSON text (`prompt`, `reward_spec`, `extra_info` written as strings) are parsed, since
 * some exporters flatten nested columns that way.
 *
 * Text must be UTF-8: bytes that are not fail the row with their byte offset, rather than reaching training as
 * U+FFFD (what a lenient decoder would hand over).
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

// ---------------------------------------------------------------------------------------------------------------
// UTF-8

const utf8 = new TextDecoder("utf-8", { fatal: true })

const reencode = "the file must be UTF-8: re-encode it (e.g. `iconv -f latin1 -t utf-8`) or fix that text"

/**
 * Where the first malformed UTF-8 sequence of `bytes` starts, or undefined when there is none. The standard fatal
 * decoder decides, fed a byte at a time (only on the error path): the bad sequence starts just past the last byte
 * that completed a character.
 */
const invalidUtf8Offset = (bytes: Uint8Array): number | undefined => {
  const decoder = new TextDecoder("utf-8", { fatal: true })
  let start = 0
  for (let i = 0; i < bytes.length; i++) {
    try {
      if (decoder.decode(bytes.subarray(i, i + 1), { stream: true }) !== "") start = i + 1
    } catch {
      return start
    }
  }
  try {
    decoder.decode() // a sequence cut off at the end
    return undefined
  } catch {
    return start
  }
}

/** `bytes` as text, or the offset of its first malformed UTF-8 sequence. */
const decodeUtf8 = (bytes: Uint8Array): string | { readonly invalidAt: number } => {
  try {
    return utf8.decode(bytes)
  } catch {
    return { invalidAt: invalidUtf8Offset(bytes) ?? 0 }
  }
}

const errorText = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

/** JSON.parse's message without its `(line 1 column N)`: a JSONL row is one line, the row number says which. */
const jsonProblem = (cause: unknown): string =>
  cause instanceof Error
    ? cause.message.replace(/ at position \d+ \(line 1 column (\d+)\)/, " at column $1")
    : String(cause)

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

interface Line {
  readonly bytes: Uint8Array
  readonly number: number // 1-based
  readonly offset: number // of its first byte in the file
}

/**
 * Byte chunks → lines (without the `\n`), each with its number and file offset. Split before decoding, so a bad byte
 * is reported with its line and offset.
 */
const splitLines = Stream.mapAccum(
  () => ({ pending: new Uint8Array(0), number: 0, offset: 0 }),
  (state, chunk: Uint8Array) => {
    const buffer = state.pending.length === 0 ? chunk : Buffer.concat([state.pending, chunk])
    const lines: Array<Line> = []
    let { number, offset } = state
    let start = 0
    for (let end = buffer.indexOf(0x0a); end >= 0; end = buffer.indexOf(0x0a, start)) {
      number += 1
      lines.push({ bytes: buffer.subarray(start, end), number, offset })
      offset += end + 1 - start
      start = end + 1
    }
    return [{ pending: buffer.slice(start), number, offset }, lines] as const
  },
  {
    onHalt: (state): ReadonlyArray<Line> =>
      state.pending.length === 0 ? [] : [{ bytes: state.pending, number: state.number + 1, offset: state.offset }]
  }
)

const jsonlRaw = (file: string) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    return fs.stream(file).pipe(
      Stream.mapError((cause) => new DatasetError({ file, detail: `cannot read: ${cause.message}` })),
      splitLines,
      Stream.mapEffect(({ bytes, number, offset }) => {
        const text = decodeUtf8(bytes)
        return typeof text === "string"
          ? Effect.succeed({ text, number })
          : Effect.fail(
              new DatasetError({
                file,
                row: number,
                detail: `not valid UTF-8 at byte ${offset + text.invalidAt} of the file (byte ${text.invalidAt} of the line): ${reencode}`
              })
            )
      }),
      Stream.filter(({ text }) => text.trim() !== ""),
      Stream.mapEffect(({ text, number }) =>
        Effect.try({
          try: () => ({ raw: JSON.parse(text) as unknown, index: number }),
          catch: (cause) => new DatasetError({ file, row: number, detail: `not valid JSON: ${jsonProblem(cause)}` })
        })
      )
    )
  }).pipe(Stream.unwrap)

const jsonRaw = (file: string) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const bytes = yield* fs
      .readFile(file)
      .pipe(Effect.mapError((cause) => new DatasetError({ file, detail: `cannot read: ${cause.message}` })))
    const text = decodeUtf8(bytes)
    if (typeof text !== "string") {
      const line = bytes.subarray(0, text.invalidAt).filter((b) => b === 0x0a).length + 1
      return yield* new DatasetError({
        file,
        detail: `not valid UTF-8 at byte ${text.invalidAt} (line ${line}): ${reencode}`
      })
    }
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

/** What a Parquet string holds in place of bytes that are not UTF-8; `parquetRaw` fails the row that holds one. */
class InvalidUtf8 {
  readonly offset: number
  constructor(offset: number) {
    this.offset = offset
  }
}

// hyparquet's own decoders turn bad bytes into U+FFFD; these keep the offset of the first, for the row's error
const strictParsers = {
  stringFromBytes: (bytes: Uint8Array | undefined): unknown => {
    if (bytes === undefined || bytes === null) return bytes
    const text = decodeUtf8(bytes)
    return typeof text === "string" ? text : new InvalidUtf8(text.invalidAt)
  },
  jsonFromBytes: (bytes: Uint8Array | undefined): unknown => {
    if (bytes === undefined || bytes === null) return bytes
    const text = decodeUtf8(bytes)
    return typeof text === "string" ? JSON.parse(text) : new InvalidUtf8(text.invalidAt)
  }
}

/** The key path of the first InvalidUtf8 in a raw Parquet row, and its offset. */
const findInvalidUtf8 = (
  value: unknown,
  path: ReadonlyArray<string> = []
): { readonly path: string; readonly offset: number } | undefined => {
  if (value instanceof InvalidUtf8) return { path: path.join("."), offset: value.offset }
  if (typeof value !== "object" || value === null || value instanceof Date) return undefined
  for (const [key, v] of Object.entries(value)) {
    const found = findInvalidUtf8(v, [...path, key])
    if (found !== undefined) return found
  }
  return undefined
}

const parquetRaw = (file: string) =>
  Effect.gen(function* () {
    const buffer = yield* Effect.tryPromise({
      try: () => asyncBufferFromFile(file),
      catch: (cause) => new DatasetError({ file, detail: `cannot read: ${errorText(cause)}` })
    })
    const metadata = yield* Effect.tryPromise({
      try: () => parquetMetadataAsync(buffer),
      catch: (cause) =>
        new DatasetError({ file, detail: `not a Parquet file, or a truncated one: ${errorText(cause)}` })
    })
    const rows = Number(metadata.num_rows)
    const starts = Array.from({ length: Math.ceil(rows / parquetChunk) }, (_, i) => i * parquetChunk)
    const rowOf = (raw: unknown, index: number) => {
      const invalid = findInvalidUtf8(raw)
      return invalid === undefined
        ? Effect.succeed({ raw: normalise(raw), index })
        : Effect.fail(
            new DatasetError({
              file,
              row: index,
              path: invalid.path,
              detail:
                `not valid UTF-8 at byte ${invalid.offset} of the value: Parquet strings must be UTF-8; ` +
                "fix the value where the file was written"
            })
          )
    }
    return Stream.fromIterable(starts).pipe(
      Stream.mapEffect((rowStart) =>
        Effect.tryPromise({
          try: () =>
            parquetReadObjects({
              file: buffer,
              metadata,
              rowStart,
              rowEnd: Math.min(rows, rowStart + parquetChunk),
              parsers: strictParsers
            }),
          catch: (cause) =>
            new DatasetError({
              file,
              row: rowStart + 1,
              detail: `cannot decode Parquet (rows ${rowStart + 1} to ${Math.min(rows, rowStart + parquetChunk)}; a corrupted file?): ${errorText(cause)}`
            })
        }).pipe(Effect.map((objects) => objects.map((raw, i) => ({ raw, index: rowStart + i + 1 }))))
      ),
      Stream.flatMap((chunk) => Stream.fromIterable(chunk)),
      Stream.mapEffect(({ raw, index }) => rowOf(raw, index))
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
