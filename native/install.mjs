// `npm ci` / `npm install` hook: build the native kernels with node-gyp and the machine's compiler (no Node headers or
// binaries are downloaded; as root on Debian/Ubuntu a missing libopenblas-dev is installed with apt-get, see
// ensureOpenBlas). It NEVER fails the install: without a compiler, headers or BLAS the build is skipped, fails or uses
// its own SGEMM, the reason is written to native/build/status.json, and the runtime falls back to tfjs' stock kernels
// with one warning. Set EFFECT_RL_SKIP_NATIVE=1 to skip the build.
import { spawnSync } from "node:child_process"
import { existsSync, mkdirSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const nativeDir = dirname(fileURLToPath(import.meta.url))
const statusFile = join(nativeDir, "build", "status.json")

const writeStatus = (status) => {
  try {
    mkdirSync(dirname(statusFile), { recursive: true })
    writeFileSync(statusFile, JSON.stringify({ ...status, at: new Date().toISOString() }, null, 2) + "\n")
  } catch {
    // status is advisory; never fail the install over it
  }
}

const findNodeGyp = () => {
  const fromNpm = process.env["npm_config_node_gyp"]
  if (fromNpm && existsSync(fromNpm)) return fromNpm
  try {
    return createRequire(import.meta.url).resolve("node-gyp/bin/node-gyp.js")
  } catch {}
  for (const candidate of [
    join(dirname(process.execPath), "..", "lib", "node_modules", "npm", "node_modules", "node-gyp", "bin", "node-gyp.js"),
    "/usr/lib/node_modules/npm/node_modules/node-gyp/bin/node-gyp.js",
    "/usr/share/nodejs/node-gyp/bin/node-gyp.js"
  ]) {
    if (existsSync(candidate)) return candidate
  }
  return undefined
}

// Local Node headers, so node-gyp never downloads them. N-API is ABI-stable: any Node >= 18 headers will do.
const findNodeDir = () => {
  const configured = process.env["npm_config_nodedir"]
  if (configured && existsSync(join(configured, "include", "node", "node_api.h"))) return configured
  for (const prefix of [join(dirname(process.execPath), ".."), "/usr", "/usr/local"]) {
    if (existsSync(join(prefix, "include", "node", "node_api.h"))) return prefix
  }
  return undefined
}

const run = (command, args, env = process.env, timeout = 120_000) =>
  spawnSync(command, args, { cwd: nativeDir, encoding: "utf8", timeout, env })

/** "openblas" when libopenblas links on this machine (what binding.gyp will use), else "builtin". */
const blasHere = () =>
  (run("sh", [join(nativeDir, "detect-blas.sh"), "defines"]).stdout ?? "").includes("EFFECT_RL_OPENBLAS")
    ? "openblas"
    : "builtin"

// OpenBLAS makes a training step about twice as fast as the addon's own SGEMM (bench/quickstart-sizes.ts, the
// quickstart policy: 0.20 s against 0.42 s for 8 x 480 tokens), and without it the quickstart's steps are
// training-bound. So where it is missing and this install runs as root on a Debian/Ubuntu machine (a container, CI),
// it is installed here, never failing the install. EFFECT_RL_NO_APT=1 skips this.
const ensureOpenBlas = () => {
  if (blasHere() === "openblas") return "present"
  if (process.env["EFFECT_RL_NO_BLAS"] === "1") return "not wanted (EFFECT_RL_NO_BLAS=1)"
  if (process.env["EFFECT_RL_NO_APT"] === "1") return "not installed (EFFECT_RL_NO_APT=1)"
  if (process.getuid?.() !== 0) return "not installed (not root: apt-get install libopenblas-dev)"
  if (run("sh", ["-c", "command -v apt-get"]).status !== 0) return "not installed (no apt-get)"
  console.log("effect-rl: installing libopenblas-dev with apt-get for the native kernels (EFFECT_RL_NO_APT=1 skips)")
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" }
  const install = () => run("apt-get", ["install", "-y", "-qq", "--no-install-recommends", "libopenblas-dev"], env)
  const started = Date.now()
  let result = install()
  // a refused install is retried once after fetching the package lists (a fresh container has none); an install that
  // already took a minute (a slow or unreachable mirror) is not: at most about 5 minutes in all, in that worst case
  if (result.status !== 0 && Date.now() - started < 60_000) {
    run("apt-get", ["update", "-qq"], env)
    result = install()
  }
  if (result.status === 0 && blasHere() === "openblas") return "installed with apt-get"
  const why = (result.stderr ?? String(result.error ?? "")).trim().split("\n").slice(-2).join(" ")
  console.warn(`effect-rl: could not install libopenblas-dev (${why}); the native kernels use their own SGEMM`)
  return `apt-get failed: ${why}`
}

// abi.generated.h is committed, but rendered afresh from the ABI table (src/native/Abi.ts) when this Node runs
// TypeScript, so an edited table is never built against a stale header. Without TypeScript (or src/), the committed
// header is built; an addon that disagrees with the table is then refused at load (its ABI hash differs).
const refreshAbiHeader = () => {
  const result = run(process.execPath, [join(nativeDir, "generate-abi.mjs")], process.env, 30_000)
  if (result.status === 0) return (result.stdout ?? "").includes("wrote") ? "regenerated" : "current"
  const why = (result.stderr ?? String(result.error ?? "")).trim().split("\n")[0]
  return `committed (not regenerated: ${why})`
}

const main = () => {
  if (process.env["EFFECT_RL_SKIP_NATIVE"] === "1") {
    writeStatus({ ok: false, reason: "skipped: EFFECT_RL_SKIP_NATIVE=1" })
    return
  }
  const nodeGyp = findNodeGyp()
  if (nodeGyp === undefined) {
    writeStatus({ ok: false, reason: "node-gyp not found (it ships with npm)" })
    return
  }
  const nodeDir = findNodeDir()
  if (nodeDir === undefined) {
    writeStatus({ ok: false, reason: "no local Node headers (include/node/node_api.h); install nodejs headers" })
    return
  }
  const abiHeader = refreshAbiHeader()
  const openblas = ensureOpenBlas()
  const blas = blasHere()
  // one compiler per core: the sources are independent translation units, and at -O3 they are most of `npm ci`'s time
  const result = spawnSync(process.execPath, [nodeGyp, "rebuild", `--nodedir=${nodeDir}`, "--jobs=max"], {
    cwd: nativeDir,
    encoding: "utf8",
    timeout: 600_000,
    env: { ...process.env, npm_config_nodedir: nodeDir }
  })
  const log = `${result.stdout ?? ""}\n${result.stderr ?? ""}`
  const built = join(nativeDir, "build", "Release", "effect_rl_kernels.node")
  if (result.status === 0 && existsSync(built)) {
    writeStatus({ ok: true, addon: built, blas, openblas, abiHeader })
    console.log(`effect-rl: native kernels built (${built}; BLAS: ${blas === "openblas" ? "OpenBLAS" : `built-in SGEMM, OpenBLAS ${openblas}`})`)
  } else {
    const lastLines = log.trim().split("\n").slice(-15).join("\n")
    const reason = result.error ? String(result.error) : `node-gyp exited with ${result.status}`
    writeStatus({ ok: false, reason, log: lastLines, blas, openblas, abiHeader })
    console.warn(`effect-rl: native kernels not built (${reason}); tfjs stock kernels will be used.\n${lastLines}`)
  }
}

try {
  main()
} catch (error) {
  writeStatus({ ok: false, reason: String(error) })
}
