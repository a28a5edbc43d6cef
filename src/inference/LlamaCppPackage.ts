/**
 * node-llama-cpp, the package llama.cpp comes through (the llamacpp engine, its worker, the GGUF round-trip tests):
 * where it is installed and how it is loaded. It is no dependency of effect-rl: with its prebuilt llama.cpp builds
 * (CUDA, Vulkan and other machines' among them) it would add about 700 MB to everyone's node_modules. Instead
 * `npm run setup:llamacpp` (scripts/setup-llamacpp.ts) installs it, with this machine's CPU build alone, into
 * `.llamacpp/` at the package root: beside node_modules, so `npm ci` and package-lock.json never see it. A
 * node-llama-cpp that Node resolves from here (one a user installed with npm themselves) is taken first.
 *
 * Loaded by file URL through domain/OptionalPackage.ts, never by a static import: effect-rl runs, builds and
 * type-checks without it (tsconfig.json maps its types to the installed package, else to scripts/llamacpp/absent.d.ts).
 */
import * as OptionalPackage from "../domain/OptionalPackage.ts"

export type Module = typeof import("node-llama-cpp")
export type Llama = Awaited<ReturnType<Module["getLlama"]>>

const llamaCpp = OptionalPackage.make<Module>({
  name: "node-llama-cpp",
  folder: ".llamacpp",
  setupCommand: "npm run setup:llamacpp"
})

/** What installs it: every error that finds it missing says this command. */
export const setupCommand = llamaCpp.setupCommand

/** Whether node-llama-cpp is installed where `load` looks (tests that need llama.cpp skip without it). */
export const available = llamaCpp.available

/** The node-llama-cpp module; fails saying `setupCommand` where it is not installed or does not load. */
export const load = llamaCpp.load

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

/**
 * llama.cpp on the CPU, logging errors only: what the engine and the tests run. Never builds llama.cpp from source
 * (that needs a compiler, cmake and a download); node-llama-cpp installed without this machine's prebuilt CPU build
 * fails here, saying `setupCommand`, which installs it.
 */
export const cpu = async (): Promise<Llama> => {
  const module = await load()
  try {
    return await module.getLlama({ gpu: false, build: "never", logLevel: module.LlamaLogLevel.error })
  } catch (e) {
    throw new Error(
      `node-llama-cpp has no llama.cpp build for ${process.platform}-${process.arch} (${messageOf(e)}): ` +
        `run \`${setupCommand}\``
    )
  }
}
