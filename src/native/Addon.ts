/**
 * Finding and loading the addon (native/build/Release/effect_rl_kernels.node, built by `npm ci` through
 * native/install.mjs), once per process. When it is absent, did not build, or was built from another ABI table, the
 * status says why (from native/build/status.json when the build recorded a reason) and nothing native is registered.
 */
import { existsSync, readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import * as Abi from "./Abi.ts"

export type Status =
  | { readonly available: true; readonly blas: string; readonly simd: string; readonly path: string }
  | { readonly available: false; readonly reason: string }

const addonFile = join("native", "build", "Release", "effect_rl_kernels.node")
const rebuild = "rebuild it with `node native/install.mjs`"

/** The package root: the nearest ancestor of this file holding native/ (src/native in the repo, dist/src/native built). */
const packageRoot = (): string | undefined => {
  let dir = dirname(fileURLToPath(import.meta.url))
  for (let i = 0; i < 6; i++) {
    if (existsSync(join(dir, "native", "binding.gyp"))) return dir
    dir = dirname(dir)
  }
  return undefined
}

/** Why there is no addon file: the build's recorded reason when there is one. */
const notBuilt = (root: string | undefined): string => {
  try {
    const statusJson = JSON.parse(readFileSync(join(root ?? ".", "native", "build", "status.json"), "utf8")) as {
      reason?: string
    }
    if (statusJson.reason !== undefined) return `the native addon did not build: ${statusJson.reason}`
    return "the native addon was not built"
  } catch {
    return "the native addon was not built (no native/build/status.json: was `npm ci` run with scripts enabled?)"
  }
}

const unavailable = (reason: string) => ({ kernels: undefined, status: { available: false, reason } as const })

const open = (path: string): { kernels: Abi.Kernels | undefined; status: Status } => {
  let raw: Abi.RawAddon
  try {
    raw = createRequire(import.meta.url)(path) as Abi.RawAddon
  } catch (cause) {
    return unavailable(`loading ${path} failed: ${String(cause)}`)
  }
  return fromExports(raw, path)
}

/**
 * The loaded exports of the addon at `path`, bound to the ABI table when they were built from it: every function is
 * exported and `info().abi` is the table's hash. Else unavailable, saying to rebuild.
 */
export const fromExports = (raw: Abi.RawAddon, path: string): { kernels: Abi.Kernels | undefined; status: Status } => {
  const absent = Abi.missing(raw)
  if (absent.length > 0) return unavailable(`${path} lacks ${absent.join(", ")}: built from older sources; ${rebuild}`)
  const kernels = Abi.bind(raw)
  const info = kernels.info({})
  if (info.abi !== Abi.hash) {
    return unavailable(`${path} was built for another ABI (${info.abi ?? "unversioned"}, not ${Abi.hash}); ${rebuild}`)
  }
  return { kernels, status: { available: true, blas: info.blas, simd: info.simd, path } }
}

let loaded: { kernels: Abi.Kernels | undefined; status: Status } | undefined

/** The addon's functions, called by field name (undefined when unavailable), and its status. */
export const load = (): { readonly kernels: Abi.Kernels | undefined; readonly status: Status } => {
  if (loaded !== undefined) return loaded
  const root = packageRoot()
  const path = root === undefined ? undefined : join(root, addonFile)
  loaded =
    path === undefined || !existsSync(path)
      ? { kernels: undefined, status: { available: false, reason: notBuilt(root) } }
      : open(path)
  return loaded
}

/** Whether the addon loaded, and if not, why. */
export const status = (): Status => load().status

/** Native bookkeeping: scratch bytes currently held (0 between kernels) and kernel calls so far. */
export const stats = (): { readonly scratchBytes: number; readonly calls: number; readonly threads: number } => {
  const kernels = load().kernels
  if (kernels === undefined) return { scratchBytes: 0, calls: 0, threads: 0 }
  const info = kernels.info({})
  return { scratchBytes: info.scratchBytes, calls: info.calls, threads: info.threads }
}
