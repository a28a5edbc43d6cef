/**
 * `npm run setup:webgpu`: installs Dawn's Node binding (the `webgpu` package), for the webgpu tensor backend and its
 * tests, into `.webgpu/` (ignored by git; src/backend/WebGpu.ts loads it from there through domain/OptionalPackage.ts).
 * The package carries Dawn for five platforms (132 MB); after the install every platform's build but this one's is
 * removed, leaving about 25 MB. Without it effect-rl runs on the CPU backends, and `backend.name: auto` says on a
 * machine with a GPU that this command would let it use it.
 *
 * The version is pinned by scripts/webgpu/ (package.json: webgpu 0.6.2; package-lock.json: its tree), copied into
 * `.webgpu/`; npm installs from its cache when it has the packages and fetches what it lacks. The package's own install
 * script runs (on macOS it clears the download quarantine from dawn.node). Running the command again reinstalls.
 */
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { join, resolve } from "node:path"
import { npmInstall } from "./npm-install.ts"

const root = resolve(import.meta.dirname, "..")
const pinned = join(root, "scripts", "webgpu")
const prefix = join(root, ".webgpu")

const version: string = JSON.parse(readFileSync(join(pinned, "package.json"), "utf8")).dependencies["webgpu"]
// the package's own folder name for this platform's build (its index.js: one universal build for macOS)
const platform = `${process.platform}-${process.platform === "darwin" ? "universal" : process.arch}`

mkdirSync(prefix, { recursive: true })
for (const file of ["package.json", "package-lock.json"]) copyFileSync(join(pinned, file), join(prefix, file))
console.log(`setup:webgpu: webgpu ${version} (Dawn) for ${platform}`)
npmInstall(prefix, [], "setup:webgpu")

const builds = join(prefix, "node_modules", "webgpu", "dist")
if (!existsSync(join(builds, platform, "dawn.node"))) {
  const has = existsSync(builds) ? readdirSync(builds).join(", ") : "none"
  console.error(`setup:webgpu: webgpu ${version} has no Dawn build for ${platform} (it has: ${has})`)
  process.exit(1)
}
for (const other of readdirSync(builds)) {
  if (other !== platform) rmSync(join(builds, other), { recursive: true, force: true })
}
console.log(`setup:webgpu: installed into ${prefix}`)
