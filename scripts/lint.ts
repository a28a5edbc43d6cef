/**
 * `npm run lint` (check) and `npm run format` (`--write`): Biome's formatter and linter over the project, run through
 * Biome's WebAssembly build (`@biomejs/wasm-nodejs` + `@biomejs/js-api`). The native `@biomejs/biome` CLI ships one
 * optional package per platform, and registries that carry only some of them leave `npm ci` refusing the lock file;
 * the wasm build is one package for every platform. Rules and formatting come from biome.json.
 */
import { execFileSync } from "node:child_process"
import { readFileSync, writeFileSync } from "node:fs"
import { Biome } from "@biomejs/js-api/nodejs"

interface Diagnostic {
  readonly severity: string
  readonly category?: string
  readonly description?: string
  readonly location?: { readonly span?: [number, number] | null }
}

/** `file:line:col severity category: description`, the form editors turn into links. */
const describe = (file: string, source: string, d: Diagnostic): string => {
  let where = file
  const span = d.location?.span
  if (span != null) {
    // spans are UTF-8 byte offsets
    const before = Buffer.from(source, "utf8").subarray(0, span[0]).toString("utf8").split("\n")
    where = `${file}:${before.length}:${before[before.length - 1]!.length + 1}`
  }
  return `${where} ${d.severity} ${d.category ?? ""}: ${d.description ?? ""}`
}

const write = process.argv.includes("--write")
const only = process.argv.slice(2).filter((a) => !a.startsWith("--"))

const config = JSON.parse(readFileSync("biome.json", "utf8")) as Record<string, unknown>
delete config["$schema"]
const files = (
  only.length > 0
    ? only
    : execFileSync("git", ["ls-files", "-co", "--exclude-standard"], { encoding: "utf8" }).split("\n")
).filter(
  (f) =>
    /\.(ts|mts|js|mjs)$/.test(f) &&
    /^(src|test|bench|scripts)\/|^[^/]+\.ts$/.test(f) &&
    !/^(bench\/results|data|dist|native\/build)\//.test(f) &&
    !f.includes("node_modules/")
)

const biome = new Biome()
const { projectKey } = biome.openProject(process.cwd())
biome.applyConfiguration(projectKey, config as never)

let errors = 0
let warnings = 0
let unformatted = 0
for (const file of files) {
  let source: string
  try {
    source = readFileSync(file, "utf8")
  } catch {
    continue // listed by git but deleted in the work tree
  }
  const linted = biome.lintContent(projectKey, source, {
    filePath: file,
    ...(write ? { fixFileMode: "safeFixes" } : {})
  })
  const fixed = write ? linted.content : source
  const formatted = biome.formatContent(projectKey, fixed, { filePath: file })
  for (const d of linted.diagnostics as ReadonlyArray<Diagnostic>) {
    if (d.severity === "warning") warnings++
    else if (d.severity === "error" || d.severity === "fatal") errors++
    else continue
    console.error(describe(file, fixed, d))
  }
  if (formatted.content !== source) {
    if (write) writeFileSync(file, formatted.content)
    else {
      unformatted++
      console.error(`${file}: not formatted (npm run format)`)
    }
  }
}
biome.shutdown()
console.log(`lint: ${files.length} files, ${errors} errors, ${warnings} warnings, ${unformatted} unformatted`)
if (errors > 0 || unformatted > 0) process.exit(1)
