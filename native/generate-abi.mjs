// Writes native/abi.generated.h from the ABI table (src/native/Abi.ts, rendered by src/native/AbiHeader.ts). Run it
// after changing the table, then rebuild (`node native/install.mjs`). `--check` writes nothing and exits 1 when the
// header is stale. Needs a Node that runs TypeScript (>= 22.18); install.mjs runs it before building and falls back to
// the committed header where it fails.
import { readFileSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
let AbiHeader
try {
  AbiHeader = await import(join(root, "src", "native", "AbiHeader.ts"))
} catch (error) {
  console.error(`cannot render the ABI table: ${String(error).split("\n")[0]}`)
  process.exit(1)
}
const file = join(root, AbiHeader.path)
const text = AbiHeader.render()
let current = ""
try {
  current = readFileSync(file, "utf8")
} catch {}
if (process.argv.includes("--check")) {
  if (current !== text) {
    console.error(`${AbiHeader.path} is stale: run \`node native/generate-abi.mjs\``)
    process.exit(1)
  }
} else if (current !== text) {
  writeFileSync(file, text)
  console.log(`wrote ${AbiHeader.path}`)
}
