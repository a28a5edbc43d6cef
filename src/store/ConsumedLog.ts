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
import { Effect } from "effect"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"

export const fileName = "consumed.jsonl"

export interface Line {
  readonly uid: string
  readonly cursor: number
  readonly step: number
}

export const file = (runDir: string) => path.join(runDir, fileName)

/** Append and fsync the lines of one training step. */
export const append = (runDir: string, step: number, groups: ReadonlyArray<TrajectoryGroup>) =>
  Effect.tryPromise(async () => {
    const handle = await fs.open(file(runDir), "a")
    try {
      const lines = groups.map((g) => `${JSON.stringify({ uid: g.promptUid, cursor: g.cursor, step })}\n`)
      await handle.writeFile(lines.join(""))
      await handle.sync()
    } finally {
      await handle.close()
    }
  }).pipe(Effect.orDie)

/** Keep only the lines of steps ≤ `step` (rewritten via a temporary file and rename); returns how many were dropped. */
export const truncateTo = (runDir: string, step: number) =>
  Effect.tryPromise(async () => {
    let text: string
    try {
      text = await fs.readFile(file(runDir), "utf8")
    } catch {
      return 0
    }
    const lines = text.split("\n").filter((l) => l.trim() !== "")
    const kept = lines.filter((l) => {
      try {
        return (JSON.parse(l) as Line).step <= step
      } catch {
        return false // a torn line from a crash mid-write
      }
    })
    const tmp = `${file(runDir)}.tmp`
    const handle = await fs.open(tmp, "w")
    try {
      await handle.writeFile(kept.map((l) => `${l}\n`).join(""))
      await handle.sync()
    } finally {
      await handle.close()
    }
    await fs.rename(tmp, file(runDir))
    return lines.length - kept.length
  }).pipe(Effect.orDie)

/** Every line of the file (a torn last line is skipped). */
export const read = (runDir: string) =>
  Effect.tryPromise(async () => {
    const text = await fs.readFile(file(runDir), "utf8").catch(() => "")
    return text
      .split("\n")
      .filter((l) => l.trim() !== "")
      .flatMap((l): Array<Line> => {
        try {
          return [JSON.parse(l) as Line]
        } catch {
          return []
        }
      })
  }).pipe(Effect.orDie)

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
