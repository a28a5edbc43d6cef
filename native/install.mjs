// `npm ci` / `npm install` hook: build the native kernels with node-gyp and the machine's compiler (nothing is
// downloaded). It NEVER fails the install: without a compiler, headers or BLAS the build is skipped or fails, the
// reason is written to native/build/status.json, and the runtime falls back to tfjs' stock kernels with one warning.
// Set EFFECT_RL_SKIP_NATIVE=1 to skip the build.
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
  const result = spawnSync(process.execPath, [nodeGyp, "rebuild", `--nodedir=${nodeDir}`], {
    cwd: nativeDir,
    encoding: "utf8",
    timeout: 600_000,
    env: { ...process.env, npm_config_nodedir: nodeDir }
  })
  const log = `${result.stdout ?? ""}\n${result.stderr ?? ""}`
  const built = join(nativeDir, "build", "Release", "effect_rl_kernels.node")
  if (result.status === 0 && existsSync(built)) {
    writeStatus({ ok: true, addon: built })
    console.log(`effect-rl: native kernels built (${built})`)
  } else {
    const lastLines = log.trim().split("\n").slice(-15).join("\n")
    const reason = result.error ? String(result.error) : `node-gyp exited with ${result.status}`
    writeStatus({ ok: false, reason, log: lastLines })
    console.warn(`effect-rl: native kernels not built (${reason}); tfjs stock kernels will be used.\n${lastLines}`)
  }
}

try {
  main()
} catch (error) {
  writeStatus({ ok: false, reason: String(error) })
}
