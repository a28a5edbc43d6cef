/**
 * `npm run build`: compile src/ to dist/ with tsc (imports rewritten .ts → .js), then write the
 * `dist/main.js` entry that `node dist/main.js <command>` and `npm start` run.
 */
import { execFileSync } from "node:child_process"
import { chmodSync, mkdirSync, rmSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"

const require = createRequire(import.meta.url)
const tsc = join(dirname(require.resolve("typescript/package.json")), "bin", "tsc")

rmSync("dist", { recursive: true, force: true })
execFileSync(process.execPath, [tsc, "-p", "tsconfig.build.json"], { stdio: "inherit" })
mkdirSync("dist", { recursive: true })
writeFileSync("dist/main.js", '#!/usr/bin/env node\nimport "./src/main.js"\n')
chmodSync("dist/main.js", 0o755)
console.log("built dist/ (entry dist/main.js)")
