import { Schema } from "effect"
import { NonNegativeInt, withDefault } from "./Field.ts"

/**
 * Which tfjs backend runs the tensors. `auto` = tensorflow-gpu, then webgpu (a hardware adapter only), then
 * tensorflow, then native (effect-rl's kernels, when they built), then wasm, then cpu.
 */
export const BackendName = Schema.Literals(["auto", "tensorflow-gpu", "webgpu", "tensorflow", "native", "wasm", "cpu"])
export type BackendName = typeof BackendName.Type

/** The tensor backend that trains and samples: which one, its threads and its CPU kernels. */
export const BackendConfig = Schema.Struct({
  name: BackendName.pipe(withDefault("auto")),
  threads: NonNegativeInt.pipe(withDefault(0)), // 0 = as many as the backend's default (cores)
  // native: effect-rl's N-API CPU kernels (native/, built by npm ci) on the wasm and native backends; on wasm, falls
  // back to stock with one warning when they did not build. stock: tfjs's own kernels.
  kernels: Schema.Literals(["native", "stock"]).pipe(withDefault("native"))
})
export type BackendConfig = typeof BackendConfig.Type
