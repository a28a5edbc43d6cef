/**
 * `<run dir>/consumed.jsonl`: one `{"uid", "cursor", "step"}` line per prompt trained on, appended and fsync'd once
 * per training step, after the step's weights are published. It is the evidence that a run (resumed or not) trained
 * on every prompt exactly once.
 *
 * A run truncates it to the step it starts from (the checkpoint's, or 0): lines of later steps describe training
 * whose weights were lost with a crash, and the resumed run trains those prompts again (from the checkpoint's
 * cursor), writing their lines anew. A torn last line (a crash mid-write) goes with them. (The alternative, keeping
 * the lines and skipping their prompts, would train on fewer prompts than the lines claim.)
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect, Schema } from "effect"
import { CliError } from "effect/cli"
import * as DiskFull from "../domain/DiskFull.ts"
import * as SyncedFile from "../domain/SyncedFile.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"

export const fileName = "consumed.jsonl"

export interface Line {
  readonly uid: string
  readonly cursor: number
  readonly step: number
}

export const file = (runDir: string) => path.join(runDir, fileName)

/**
 * Append `text` (whole lines) to the JSONL file `jsonl` and fsync it: durable when this resolves. A full disk rejects
 * with a DiskFullError naming the file.
 */
export const appendDurably = async (jsonl: string, text: string): Promise<void> => {
  try {
    await SyncedFile.write(jsonl, text, "a")
  } catch (error) {
    throw DiskFull.orElse(jsonl, (cause) => cause)(error)
  }
}

/** Append and fsync the lines of one training step. */
export const append = (runDir: string, step: number, groups: ReadonlyArray<TrajectoryGroup>) =>
  Effect.promise(() =>
    appendDurably(
      file(runDir),
      groups.map((g) => `${JSON.stringify({ uid: g.promptUid, cursor: g.cursor, step })}\n`).join("")
    )
  )

/** A line of consumed.jsonl that is not one, other than a torn last line. */
export class ConsumedLogError extends Schema.TaggedError<ConsumedLogError>()("ConsumedLogError", {
  file: Schema.String,
  line: Schema.Int,
  message: Schema.String
}) {
  override get [CliError.userMessage](): string {
    return `${this.file}:${this.line}: ${this.message}`
  }
}

/**
 * The lines of the file as records. A torn last line (a crash mid-write) is skipped; a bad line anywhere else is a
 * ConsumedLogError naming it, since dropping it would lose the record that its prompt was trained on.
 */
const parse = (file: string, text: string): Effect.Effect<Array<Line>, ConsumedLogError> =>
  Effect.gen(function* () {
    const lines = text.split("\n")
    const last = text.endsWith("\n") ? lines.length - 2 : lines.length - 1
    const out: Array<Line> = []
    for (let i = 0; i < lines.length; i++) {
      const l = lines[i]!
      if (l.trim() === "") continue
      let record: Partial<Line> | undefined
      try {
        record = JSON.parse(l) as Partial<Line>
      } catch {
        record = undefined
      }
      if (
        record !== undefined &&
        typeof record.uid === "string" &&
        Number.isInteger(record.cursor) &&
        Number.isInteger(record.step)
      ) {
        out.push(record as Line)
      } else if (i !== last) {
        return yield* new ConsumedLogError({
          file,
          line: i + 1,
          message:
            'not a consumed-prompt line ({"uid","cursor","step"}): a torn or edited line in the middle of the file ' +
            "(only a torn last line is skipped); restore the file or remove the line by hand"
        })
      }
    }
    return out
  })

const readText = (runDir: string) =>
  Effect.promise(() => fs.readFile(file(runDir), "utf8").catch((): string | undefined => undefined))

/** Keep only the lines of steps ≤ `step` (rewritten via a temporary file and rename); returns how many were dropped. */
export const truncateTo = (runDir: string, step: number) =>
  Effect.gen(function* () {
    const text = yield* readText(runDir)
    if (text === undefined) return 0
    const lines = yield* parse(file(runDir), text)
    const kept = lines.filter((l) => l.step <= step)
    yield* Effect.tryPromise(async () => {
      const tmp = `${file(runDir)}.tmp`
      await SyncedFile.write(tmp, kept.map((l) => `${JSON.stringify(l)}\n`).join(""))
      await fs.rename(tmp, file(runDir))
    }).pipe(Effect.orDie)
    return text.split("\n").filter((l) => l.trim() !== "").length - kept.length
  })

/** Every line of the file (a torn last line is skipped; a bad line elsewhere is a ConsumedLogError). */
export const read = (runDir: string) =>
  Effect.gen(function* () {
    const text = yield* readText(runDir)
    return text === undefined ? [] : yield* parse(file(runDir), text)
  })

/**
 * A JSONL file that a crash cut mid-line (no final newline): cut the torn tail off, so appending after a resume does
 * not glue a new line onto it. Returns the bytes dropped (0 when the file is whole or absent).
 */
export const dropTornTail = (jsonl: string) =>
  Effect.gen(function* () {
    const dropped = yield* Effect.tryPromise(async () => {
      let text: Buffer
      try {
        text = await fs.readFile(jsonl)
      } catch {
        return 0
      }
      if (text.length === 0 || text[text.length - 1] === 0x0a) return 0
      const keep = text.lastIndexOf(0x0a) + 1
      await fs.truncate(jsonl, keep)
      return text.length - keep
    }).pipe(Effect.orDie)
    if (dropped > 0) yield* Effect.logWarning(`${jsonl}: skipping torn last line (${dropped} bytes; a crash mid-write)`)
    return dropped
  })
