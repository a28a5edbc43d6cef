/**
 * Command-line flags of the benches: `--name VALUE` and bare `--name`; and where a bench writes its result.
 *
 * bench/results/ holds the committed results, as they were measured (docs/results.md quotes them): a bench writes
 * there only when asked, with `--out FILE`. Without it, results go to bench/out/, which git ignores, so running a
 * bench leaves the checkout clean.
 */
import * as fs from "node:fs"
import * as path from "node:path"

/** The value after `--name`, or `fallback` when the flag is absent. */
export const arg = (name: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback
}

/** Whether the bare flag `--name` was given. */
export const has = (name: string): boolean => process.argv.includes(`--${name}`)

/** The committed results (written only with `--out`). */
export const resultsDir = path.join(import.meta.dirname, "results")

/** Where a run's results go without `--out` (git ignores it). */
export const outDir = path.join(import.meta.dirname, "out")

/**
 * The file a bench writes its result to, its folder made: `--out FILE` → bench/results/FILE (an absolute path as it
 * is), to record a measurement; without it, bench/out/`name`.
 */
export const resultFile = (name: string): string => {
  const out = arg("out", "")
  const file = out === "" ? path.join(outDir, name) : path.isAbsolute(out) ? out : path.join(resultsDir, out)
  fs.mkdirSync(path.dirname(file), { recursive: true })
  return file
}

/** Write `result` as indented JSON to `resultFile(name)`; returns the file. */
export const writeResult = (name: string, result: unknown): string => {
  const file = resultFile(name)
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`)
  return file
}
