// SkyRL cross-check on the wasm backend, the default for `npm start`: its kernels (and their gradients) differ
// from `cpu`'s, so the losses are checked there too. Vitest runs each file in its own process (pool: forks),
// so switching the global backend here does not affect other files.
import { beforeAll } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import "@tensorflow/tfjs-backend-wasm"
import { describeAgainstSkyrl } from "./skyrlGolden.ts"

beforeAll(async () => {
  await tf.setBackend("wasm")
  await tf.ready()
})

describeAgainstSkyrl("wasm")
