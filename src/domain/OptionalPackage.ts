/**
 * A heavy package effect-rl can use but does not depend on (node-llama-cpp for the llamacpp engine, Dawn's `webgpu` for
 * the webgpu backend): installed by its own command (`npm run setup:<name>`) into a folder at the package root
 * (`.llamacpp/`, `.webgpu/`), beside node_modules, so `npm ci` and package-lock.json never see it. A copy that Node
 * resolves from effect-rl itself (one the user installed with npm, or a kit's node_modules) is taken first.
 *
 * Loaded by file URL, never by a static import: effect-rl runs, builds and type-checks without it.
 */
import * as fs from "node:fs"
import { createRequire } from "node:module"
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

export interface OptionalPackage<A> {
  /** The npm package name. */
  readonly name: string
  /** What installs it: every error that finds it missing says this command. */
  readonly setupCommand: string
  /** Where the setup command installs it. */
  readonly prefix: () => string
  /** Its entry file: from node_modules as Node resolves it from effect-rl, else from `prefix()`; undefined if absent. */
  readonly resolve: () => string | undefined
  /** Whether it is installed where `load` looks (tests that need it skip without it). */
  readonly available: () => boolean
  /** The module; rejects saying `setupCommand` where it is not installed or does not load. */
  readonly load: () => Promise<A>
}

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

/** The package root: the nearest folder above this file with a package.json (this file is in src/ or dist/src/). */
const packageRoot = (): string => {
  let dir = path.dirname(fileURLToPath(import.meta.url))
  while (!fs.existsSync(path.join(dir, "package.json")) && path.dirname(dir) !== dir) dir = path.dirname(dir)
  return dir
}

/** `name`, installed by `setupCommand` into `<package root>/<folder>`. */
export const make = <A>(options: {
  readonly name: string
  readonly folder: string
  readonly setupCommand: string
}): OptionalPackage<A> => {
  const { name, setupCommand } = options
  const prefix = () => path.join(packageRoot(), options.folder)
  const resolve = (): string | undefined => {
    for (const from of [fileURLToPath(import.meta.url), path.join(prefix(), "package.json")]) {
      try {
        return createRequire(from).resolve(name)
      } catch {
        // not installed there
      }
    }
    return undefined
  }
  const load = async (): Promise<A> => {
    const entry = resolve()
    if (entry === undefined) {
      throw new Error(`${name} is not installed (in node_modules or ${prefix()}): run \`${setupCommand}\``)
    }
    try {
      return (await import(pathToFileURL(entry).href)) as A
    } catch (e) {
      throw new Error(`${name} (${entry}) does not load: ${messageOf(e)}; \`${setupCommand}\` installs it again`)
    }
  }
  return { name, setupCommand, prefix, resolve, available: () => resolve() !== undefined, load }
}
