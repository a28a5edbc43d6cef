/**
 * The tensor library, the one place that imports it: tfjs-core with the cpu backend and every gradient registered,
 * re-exported as `tf` (`import * as tf from "../tensor/Tf.ts"`).
 *
 * Why not the `@tensorflow/tfjs` union package: it adds Layers, the graph-model converter, tf.data and the WebGL
 * backend (229 MB installed, none of it used here), and it is the only published file that registers the gradients
 * and the chained ops (`x.reshape(…)`). tfjs-core ships both as ES modules whose imports have no file extension
 * (`import { Abs } from '../kernel_names'`), which Node's ESM resolution refuses. `npm ci` bundles them into one file
 * (scripts/tfjs-registrations.mjs), loaded here in about 15 ms. Without that bundle (an install without dev
 * dependencies, or EFFECT_RL_TFJS_UNBUNDLED=1) they load as published, through a resolve hook that adds `.js` to the
 * relative imports of tfjs-core's own `dist/` files and nothing else (about 0.5 s). Either copy shares the engine, the
 * kernel and gradient registries and the Tensor class with the CommonJS build everything else loads: tfjs keeps them on
 * the global object for exactly this, and the union package's own copy of these modules relied on it too.
 *
 * tfjs' cpu backend greets its first tensor in Node with a banner advising `@tensorflow/tfjs-node` (console.warn).
 * effect-rl chooses backends itself (`auto` takes tfjs-node when it is installed), and a library prints nothing of
 * its own accord: at import, the cpu backend is registered again with the same factory and priority, its first-use
 * banner already spent. Only while no cpu backend instance exists (replacing one would dispose its tensors); every
 * other tfjs warning still shows, which `tf.enableProdMode()` would silence along with it.
 */
import { existsSync } from "node:fs"
import { createRequire, registerHooks } from "node:module"
import { dirname, join } from "node:path"
import { pathToFileURL } from "node:url"
import { MathBackendCPU } from "@tensorflow/tfjs-backend-cpu"
import * as tf from "@tensorflow/tfjs-core"
// the chained ops (`x.cast(…)`, `x.reshape(…)`): registered at run time by tfjs-core, typed by this declaration file
import type {} from "@tensorflow/tfjs-core/dist/public/chained_ops/register_all_chained_ops.js"

export * from "@tensorflow/tfjs-core"

const registered = Symbol.for("effect-rl/tensor/registered")

/**
 * Where `npm ci` bundles the registrations (scripts/tfjs-registrations.mjs writes the same path): one file per
 * tfjs-core version, beside the node_modules that holds it.
 */
const registrationsBundle = (coreDir: string, version: string): string =>
  join(coreDir, "..", "..", ".cache", "effect-rl", `tfjs-core-${version}-registrations.cjs`)

const registerGradientsAndChainedOps = (): void => {
  const global = globalThis as { [registered]?: true }
  if (global[registered]) return // once per thread: the registries are per thread, whichever copy of the module runs
  global[registered] = true
  // Node's own require (Vitest's module runner would transform and re-run these modules per test file)
  const require = createRequire(import.meta.url)
  const corePackage = require.resolve("@tensorflow/tfjs-core/package.json")
  const coreDir = dirname(corePackage)
  const bundle = registrationsBundle(coreDir, (require(corePackage) as { version: string }).version)
  if (process.env["EFFECT_RL_TFJS_UNBUNDLED"] !== "1" && existsSync(bundle)) {
    require(bundle)
    return
  }
  const coreDist = pathToFileURL(join(coreDir, "dist/")).href
  registerHooks({
    resolve: (specifier, context, next) =>
      context.parentURL?.startsWith(coreDist) && specifier.startsWith(".") && !specifier.endsWith(".js")
        ? next(`${specifier}.js`, context)
        : next(specifier, context)
  })
  require("@tensorflow/tfjs-core/dist/register_all_gradients.js")
  require("@tensorflow/tfjs-core/dist/public/chained_ops/register_all_chained_ops.js")
}

const quietCpuBackend = (): void => {
  const engine = tf.engine()
  const registered = engine.registryFactory["cpu"]
  if (registered === undefined || "cpu" in engine.registry) return
  tf.removeBackend("cpu")
  tf.registerBackend(
    "cpu",
    () => {
      const backend = registered.factory()
      if (backend instanceof MathBackendCPU) (backend as unknown as { firstUse: boolean }).firstUse = false
      return backend
    },
    registered.priority
  )
}

registerGradientsAndChainedOps()
quietCpuBackend()
