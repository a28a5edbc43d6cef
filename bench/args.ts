/** Command-line flags of the benches: `--name VALUE` and bare `--name`. */

/** The value after `--name`, or `fallback` when the flag is absent. */
export const arg = (name: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback
}

/** Whether the bare flag `--name` was given. */
export const has = (name: string): boolean => process.argv.includes(`--${name}`)
