/**
 * Models by name: `org/name[@revision]` (e.g. `Qwen/Qwen3-0.6B`) found in the standard Hugging Face hub cache, the
 * directory `huggingface-cli download` / `hf download` and transformers fill. Nothing is ever downloaded here.
 *
 *   cache    = $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
 *   repo     = cache/models--org--name
 *   revision = the one after `@`, else main
 *   hash     = the commit in repo/refs/<revision>, or the revision itself when repo/snapshots/<revision> exists
 *   model    = repo/snapshots/<hash>/ (config.json, safetensors, tokenizer files: a checkpoint directory)
 *
 * A path that exists is always a path: the name is looked up only when nothing is at it.
 */
import { existsSync, readFileSync, statSync } from "node:fs"
import { homedir } from "node:os"
import * as path from "node:path"

export class HfCacheError extends Error {
  override readonly name = "HfCacheError"
}

/** The environment variables the cache location is read from. */
export type Env = Readonly<Record<string, string | undefined>>

/** `org/name[@revision]`: two path-safe segments, an optional revision (a branch, tag or commit). */
const namePattern = /^([A-Za-z0-9][\w.-]*)\/([A-Za-z0-9][\w.-]*)(?:@([\w./-]+))?$/

export interface Name {
  readonly repo: string // org/name
  readonly revision: string // main unless given
}

/** The model name in `spec`, or undefined when it is not `org/name[@revision]`. */
export const parseName = (spec: string): Name | undefined => {
  const m = namePattern.exec(spec)
  return m === null ? undefined : { repo: `${m[1]}/${m[2]}`, revision: m[3] ?? "main" }
}

/** The hub cache directory and the setting that chose it. */
export const cacheDir = (env: Env = process.env): { readonly dir: string; readonly from: string } => {
  if (env["HF_HUB_CACHE"] !== undefined && env["HF_HUB_CACHE"] !== "") {
    return { dir: env["HF_HUB_CACHE"], from: "HF_HUB_CACHE" }
  }
  if (env["HF_HOME"] !== undefined && env["HF_HOME"] !== "") {
    return { dir: path.join(env["HF_HOME"], "hub"), from: "HF_HOME/hub" }
  }
  return { dir: path.join(homedir(), ".cache", "huggingface", "hub"), from: "default: HF_HUB_CACHE and HF_HOME unset" }
}

const isDirectory = (p: string) => statSync(p, { throwIfNoEntry: false })?.isDirectory() === true

/**
 * The directory `spec` names: `spec` itself when something is there or it is not a model name, else the cached
 * snapshot of `org/name[@revision]`. Throws HfCacheError naming every place it looked and how to fill the cache.
 */
export const resolve = (spec: string, env: Env = process.env): string => {
  if (existsSync(spec)) return spec
  const name = parseName(spec)
  if (name === undefined) return spec
  const cache = cacheDir(env)
  const repoDir = path.join(cache.dir, `models--${name.repo.replace("/", "--")}`)
  const ref = path.join(repoDir, "refs", name.revision)
  const looked = [`${path.resolve(spec)} (no such directory)`]
  const refHash = existsSync(ref) ? readFileSync(ref, "utf8").trim() : undefined
  const candidates = [
    ...(refHash === undefined || refHash === "" ? [] : [refHash]),
    ...(/^[0-9a-f]{40}$/.test(name.revision) ? [name.revision] : [])
  ]
  for (const hash of candidates) {
    const snapshot = path.join(repoDir, "snapshots", hash)
    if (isDirectory(snapshot)) return snapshot
    looked.push(`${snapshot} (no such snapshot${hash === refHash ? `; ${ref} names it` : ""})`)
  }
  if (refHash === undefined) looked.push(`${ref} (no such ref${existsSync(repoDir) ? "" : `; no ${repoDir}`})`)
  const download = name.revision === "main" ? name.repo : `${name.repo} --revision ${name.revision}`
  throw new HfCacheError(
    `model "${spec}" is neither a directory nor in the Hugging Face cache ${cache.dir} (${cache.from}). Looked at: ` +
      `${looked.join("; ")}. Fill the cache with \`hf download ${download}\` (or \`huggingface-cli download ${download}\`) ` +
      "on a machine with network access, or point HF_HUB_CACHE / HF_HOME at a cache that has it; nothing is downloaded here"
  )
}
