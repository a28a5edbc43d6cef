/**
 * The episode log: every TrajectoryGroup appended to `<run dir>/episodes.jsonl` as one schema-encoded JSON line,
 * written and fsync'd before `append` returns, so a crash loses at most the line being written. The same file is
 * the trainer's replay source, the resume journal's evidence and the report's data.
 *
 * Reading tolerates a torn last line (a crash mid-write): it is skipped with a warning. A bad line anywhere else is
 * an error naming the file and line, since it means the file was edited or corrupted.
 */
import { createReadStream } from "node:fs"
import * as readline from "node:readline"
import { Context, Effect, FileSystem, Layer, Path, Schema, Semaphore, Stream } from "effect"
import { CliError } from "effect/cli"
import * as DiskFull from "../domain/DiskFull.ts"
import { TrajectoryGroup } from "../domain/Trajectory.ts"
import * as ConsumedLog from "./ConsumedLog.ts"

export class EpisodeLogError extends Schema.TaggedError<EpisodeLogError>()("EpisodeLogError", {
  file: Schema.String,
  line: Schema.optionalKey(Schema.Int),
  message: Schema.String
}) {
  override get [CliError.userMessage](): string {
    return `${this.file}${this.line === undefined ? "" : `:${this.line}`}: ${this.message}`
  }
}

export class EpisodeLog extends Context.Service<
  EpisodeLog,
  {
    readonly file: string
    /** Append one group; durable (fsync'd) when this succeeds. */
    readonly append: (group: TrajectoryGroup) => Effect.Effect<void, EpisodeLogError | DiskFull.DiskFullError>
  }
>()("rl/store/EpisodeLog") {}

const encodeLine = Schema.encodeSync(Schema.fromJsonString(TrajectoryGroup))
const decodeLine = Schema.decodeUnknownExit(Schema.fromJsonString(TrajectoryGroup))

export const fileName = "episodes.jsonl"

/** Open (create or append to) `<dir>/episodes.jsonl`. The file handle closes with the scope. */
export const make = Effect.fn("EpisodeLog.make")(function* (dir: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const file = path.join(dir, fileName)
  const fail = (message: string) =>
    DiskFull.orElse(file, (cause) => new EpisodeLogError({ file, message: `${message}: ${(cause as Error).message}` }))
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(fail("cannot create run directory")))
  // a resumed run appends after a crash: a torn last line must not swallow the next group
  yield* ConsumedLog.dropTornTail(file)
  const handle = yield* fs.open(file, { flag: "a" }).pipe(Effect.mapError(fail("cannot open")))
  const encoder = new TextEncoder()
  const lock = yield* Semaphore.make(1) // lines from concurrent producers never interleave
  const append = (group: TrajectoryGroup) =>
    Semaphore.withPermit(lock)(
      Effect.gen(function* () {
        const line = yield* Effect.try({
          try: () => `${encodeLine(group)}\n`,
          catch: (cause) =>
            new EpisodeLogError({ file, message: `cannot encode group ${group.promptUid}: ${String(cause)}` })
        })
        yield* handle.writeAll(encoder.encode(line)).pipe(Effect.mapError(fail("write failed")))
        yield* handle.sync.pipe(Effect.mapError(fail("fsync failed")))
      })
    )
  return EpisodeLog.of({ file, append })
})

export const layer = (
  dir: string
): Layer.Layer<EpisodeLog, EpisodeLogError | DiskFull.DiskFullError, FileSystem.FileSystem | Path.Path> =>
  Layer.effect(EpisodeLog, make(dir))

/**
 * The lines of `file` with their index, read as a stream (a long run's log is hundreds of MB: held whole, every reader
 * would hold it all), each marked `last` when no line follows it.
 */
async function* numberedLines(file: string): AsyncGenerator<{ line: string; i: number; last: boolean }> {
  const input = createReadStream(file)
  const lines = readline.createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY })
  try {
    let previous: string | undefined
    let i = 0
    for await (const line of lines) {
      if (previous !== undefined) yield { line: previous, i: i - 1, last: false }
      previous = line
      i++
    }
    if (previous !== undefined) yield { line: previous, i: i - 1, last: true }
  } finally {
    // a reader that stops early (a bad line, an interrupted stream) must not leave the file open
    lines.close()
    input.destroy()
  }
}

/**
 * Stream the groups of an episode log in order, a line at a time. A torn last line is skipped with a warning; any
 * other bad line fails.
 */
export const read = (file: string): Stream.Stream<TrajectoryGroup, EpisodeLogError> =>
  Stream.fromAsyncIterable(
    numberedLines(file),
    (cause) => new EpisodeLogError({ file, message: `cannot read: ${(cause as Error).message}` })
  ).pipe(
    Stream.filter(({ line }) => line.trim() !== ""),
    Stream.mapEffect(({ line, i, last }) => {
      const exit = decodeLine(line)
      if (exit._tag === "Success") return Effect.succeed([exit.value])
      if (last) {
        return Effect.logWarning(
          `${file}:${i + 1}: skipping torn last line (${line.length} bytes; a crash mid-write)`
        ).pipe(Effect.as([]))
      }
      return Effect.fail(
        new EpisodeLogError({
          file,
          line: i + 1,
          message:
            "not a valid trajectory group (a torn or edited line in the middle of the log; only a torn last line is skipped)"
        })
      )
    }),
    Stream.flatMap((groups) => Stream.fromIterable(groups))
  )
