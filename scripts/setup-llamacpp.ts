/**
 * `npm run setup:llamacpp [-- --gpu cuda|vulkan]`: installs node-llama-cpp, for the llamacpp engine and the GGUF
 * round-trip tests, into `.llamacpp/` (ignored by git; src/inference/LlamaCppPackage.ts loads it from there), with
 * this machine's prebuilt llama.cpp CPU build alone: `@node-llama-cpp/<os>-<arch>`, about 85 MB in all. node-llama-cpp
 * lists every platform's and GPU's build as optional dependencies, and npm installs each whose `os`/`cpu` match
 * (on linux-x64: the CUDA, CUDA-ext, Vulkan, arm64 and armv7l builds too, about 680 MB); here they are omitted and
 * the one build wanted is a dependency of its own.
 *
 * The versions are pinned by scripts/llamacpp/ (package.json: node-llama-cpp 3.21.1; package-lock.json: its whole
 * tree), copied into `.llamacpp/` with the chosen builds added; npm installs from its cache when it has the packages
 * (offline too) and fetches what it lacks. node-llama-cpp's install script is not run: it would build llama.cpp from
 * source where no prebuilt build fits, and the engine only takes prebuilt ones.
 *
 * `--gpu cuda` (and/or `--gpu vulkan`, repeatable) adds that backend's build for linux-x64 or win-x64 as well. The
 * engine and the tests run llama.cpp on the CPU either way; a GPU build serves code of your own that calls
 * node-llama-cpp's `getLlama()` from `.llamacpp/`. Running the command again makes `.llamacpp/` match its flags.
 */
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"
import { parseArgs } from "node:util"
import { npmInstall } from "./npm-install.ts"

const root = resolve(import.meta.dirname, "..")
const pinned = join(root, "scripts", "llamacpp")
const prefix = join(root, ".llamacpp")

/** The builds each `--gpu` value adds (CUDA comes in two packages: `-cuda-ext` holds the rest of its kernels). */
const gpuSuffixes: Record<string, ReadonlyArray<string>> = { cuda: ["-cuda", "-cuda-ext"], vulkan: ["-vulkan"] }

const { values } = parseArgs({ options: { gpu: { type: "string", multiple: true, default: [] } } })
const fail = (message: string): never => {
  console.error(`setup:llamacpp: ${message}`)
  process.exit(1)
}

const manifest = JSON.parse(readFileSync(join(pinned, "package.json"), "utf8"))
const lock = JSON.parse(readFileSync(join(pinned, "package-lock.json"), "utf8"))
const version: string = manifest.dependencies["node-llama-cpp"]
const builds = Object.keys(lock.packages)
  .filter((key) => key.startsWith("node_modules/@node-llama-cpp/"))
  .map((key) => key.slice("node_modules/@node-llama-cpp/".length))

// node-llama-cpp's names: mac/win rather than darwin/win32, armv7l for arm; the only macOS arm64 build is Metal's
const os = ({ darwin: "mac", win32: "win" } as Record<string, string>)[process.platform] ?? process.platform
const arch = process.arch === "arm" ? "armv7l" : process.arch
const cpu = builds.find((b) => b === `${os}-${arch}`) ?? builds.find((b) => b === `${os}-${arch}-metal`)
if (cpu === undefined) {
  fail(
    `node-llama-cpp ${version} has no prebuilt llama.cpp for ${process.platform}-${process.arch} (it has: ${builds.join(", ")})`
  )
}
const wanted = [cpu!]
for (const gpu of values.gpu) {
  const suffixes = gpuSuffixes[gpu] ?? fail(`--gpu ${gpu}: expected one of ${Object.keys(gpuSuffixes).join(", ")}`)
  for (const build of suffixes.map((suffix) => `${os}-${arch}${suffix}`)) {
    if (!builds.includes(build)) fail(`--gpu ${gpu}: node-llama-cpp ${version} has no ${build} build`)
    wanted.push(build)
  }
}

mkdirSync(prefix, { recursive: true })
copyFileSync(join(pinned, "package-lock.json"), join(prefix, "package-lock.json"))
const dependencies = { ...manifest.dependencies }
for (const build of wanted) dependencies[`@node-llama-cpp/${build}`] = version
writeFileSync(join(prefix, "package.json"), `${JSON.stringify({ ...manifest, dependencies }, null, 2)}\n`)

console.log(`setup:llamacpp: node-llama-cpp ${version} with ${wanted.map((b) => `@node-llama-cpp/${b}`).join(", ")}`)
npmInstall(prefix, ["--omit=optional", "--ignore-scripts"], "setup:llamacpp")
console.log(`setup:llamacpp: installed into ${prefix}`)
