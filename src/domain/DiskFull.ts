/**
 * A full disk (ENOSPC) or a spent quota (EDQUOT), wherever a run writes: the episode and consumed logs, metrics, the
 * report, weight-sync files, exports. Such a write stops the run with one line naming the file and saying what to do
 * (`no space left on the device writing runs/x/episodes.jsonl: free space, then train --resume latest`), never a
 * stack: nothing is wrong with the program. What was written before it stays readable (the logs lose at most their
 * torn last line, `latest` names a complete checkpoint), so the run resumes once there is room.
 */
import { Schema } from "effect"
import { CliError } from "effect/cli"

export class DiskFullError extends Schema.TaggedError<DiskFullError>()("DiskFullError", {
  file: Schema.String,
  message: Schema.String
}) {
  override get [CliError.userMessage](): string {
    return this.message
  }
}

const codeOf = (error: unknown): unknown =>
  typeof error === "object" && error !== null ? (error as { code?: unknown }).code : undefined

/** The error and the ones it wraps (`cause`: Effect's PlatformError keeps Node's error there), outermost first. */
const chain = (error: unknown): Array<unknown> => {
  const errors: Array<unknown> = []
  for (let e = error; typeof e === "object" && e !== null && errors.length < 8; e = (e as { cause?: unknown }).cause) {
    errors.push(e)
  }
  return errors
}

/** Whether `error`, or an error it wraps, is ENOSPC (no space left on the device) or EDQUOT (over the disk quota). */
export const is = (error: unknown): boolean =>
  error instanceof DiskFullError || chain(error).some((e) => codeOf(e) === "ENOSPC" || codeOf(e) === "EDQUOT")

/** The error for a write to `file` that found no room, with what to do next (for a training run: resume it). */
export const at = (file: string, next = "free space, then train --resume latest"): DiskFullError =>
  new DiskFullError({ file, message: `no space left on the device writing ${file}: ${next}` })

/** The file an error chain names: a `file` or `path` field, a PlatformError's path, or Node's `path`. */
const fileOf = (error: unknown): string | undefined => {
  for (const e of chain(error)) {
    const record = e as { file?: unknown; path?: unknown; reason?: { pathOrDescriptor?: unknown } }
    for (const candidate of [record.file, record.path, record.reason?.pathOrDescriptor]) {
      if (typeof candidate === "string" && candidate !== "") return candidate
    }
  }
  return undefined
}

/** `error` as a DiskFullError when it is (or wraps) a full disk, naming the file it names; otherwise undefined. */
export const find = (error: unknown): DiskFullError | undefined => {
  if (error instanceof DiskFullError) return error
  return is(error) ? at(fileOf(error) ?? "a run file") : undefined
}

/**
 * Map a write's failure: a full disk becomes a DiskFullError naming `file` (and `next`, what to do), anything else goes
 * through `otherwise`.
 */
export const orElse =
  <E>(file: string, otherwise: (error: unknown) => E, next?: string) =>
  (error: unknown): DiskFullError | E =>
    error instanceof DiskFullError ? error : is(error) ? at(file, next) : otherwise(error)
