/**
 * `npm run bench -- <name> [flags]`: runs bench/<name>.ts. Each bench prints its result as the last stdout line (JSON)
 * and writes bench/out/<name>.json, which git ignores; `--out FILE` writes bench/results/FILE, the committed results,
 * instead (args.ts).
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { pathToFileURL } from "node:url"

const name = process.argv[2]
const available = fs
  .readdirSync(import.meta.dirname)
  .filter((f) => f.endsWith(".ts") && !["run.ts", "harness.ts", "args.ts"].includes(f))
  .map((f) => f.slice(0, -3))
if (name === undefined || !available.includes(name)) {
  console.error(`usage: npm run bench -- <name> [flags]; benches: ${available.join(", ")}`)
  process.exit(2)
}
const module = (await import(pathToFileURL(path.join(import.meta.dirname, `${name}.ts`)).href)) as {
  run?: () => Promise<void>
}
// Benches that export `run` wait to be called; the others ran on import.
if (module.run !== undefined) await module.run()
