/**
 * node-llama-cpp, the package llama.cpp comes through (the llamacpp engine, its worker, the GGUF round-trip tests):
 * where it is installed and how it is loaded. It is no dependency of effect-rl: with its prebuilt llama.cpp builds
 * (CUDA, Vulkan and other machines' among them) it would add about 700 MB to everyone's node_modules. Instead
 * `npm run setup:llamacpp` (scripts/setup-llamacpp.ts) installs it, with this machine's CPU build alone, into
 * `.llamacpp/` at the package root: beside node_modules, so `npm ci` and package-lock.json never see it. A
 * node-llama-cpp that Node resolves from here (one a user installed with npm themselves) is taken first.
 *
 * Loaded by file URL, never by a static import: effect-rl runs, builds and type-checks without it (tsconfig.json maps
 * its types to the installed package, else to scripts/llamacpp/absent.d.ts).
 */
import * as fs from "node:fs"
import { createRequire } from "node:module"
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

export type Module = typeof import("node-llama-cpp")
export type Llama = Awaited<ReturnType<Module["getLlama"]>>

/** What installs it: every error that finds it missing says this command. */
export const setupCommand = "npm run setup:llamacpp"

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

/** The package root: the nearest folder above this file with a package.json (this file is in src/ or dist/src/). */
const packageRoot = (): string => {
  let dir = path.dirname(fileURLToPath(import.meta.url))
  while (!fs.existsSync(path.join(dir, "package.json")) && path.dirname(dir) !== dir) dir = path.dirname(dir)
  return dir
}

/** Where `npm run setup:llamacpp` installs it. */
export const prefix = (): string => path.join(packageRoot(), ".llamacpp")

/** node-llama-cpp's entry file: from node_modules as Node resolves it from here, else from `.llamacpp/`. */
export const resolve = (): string | undefined => {
  for (const from of [fileURLToPath(import.meta.url), path.join(prefix(), "package.json")]) {
    try {
      return createRequire(from).resolve("node-llama-cpp")
    } catch {
      // not installed there
    }
  }
  return undefined
}

/** Whether node-llama-cpp is installed where `load` looks (tests that need llama.cpp skip without it). */
export const available = (): boolean => resolve() !== undefined

/** The node-llama-cpp module; fails saying `setupCommand` where it is not installed or does not load. */
export const load = async (): Promise<Module> => {
  const entry = resolve()
  if (entry === undefined) {
    throw new Error(`node-llama-cpp is not installed (in node_modules or ${prefix()}): run \`${setupCommand}\``)
  }
  try {
    return (await import(pathToFileURL(entry).href)) as Module
  } catch (e) {
    throw new Error(`node-llama-cpp (${entry}) does not load: ${messageOf(e)}; \`${setupCommand}\` installs it again`)
  }
}

/**
 * llama.cpp on the CPU, logging errors only: what the engine and the tests run. Never builds llama.cpp from source
 * (that needs a compiler, cmake and a download); node-llama-cpp installed without this machine's prebuilt CPU build
 * fails here, saying `setupCommand`, which installs it.
 */
export const cpu = async (): Promise<Llama> => {
  const llamaCpp = await load()
  try {
    return await llamaCpp.getLlama({ gpu: false, build: "never", logLevel: llamaCpp.LlamaLogLevel.error })
  } catch (e) {
    throw new Error(
      `node-llama-cpp has no llama.cpp build for ${process.platform}-${process.arch} (${messageOf(e)}): ` +
        `run \`${setupCommand}\``
    )
  }
}
