/**
 * The native LM head (Fused.headLogProbs running native/head.cc) against tfjs: log-probs and entropy equal
 * LogProbs.fromLogits on the explicit logits, and the gradients in h and W equal the chunked tfjs head's
 * (LogProbs.fusedHead) to 1e-4 relative error, for an untied head W [D, V] and a tied one read from the embedding
 * [V, D]; shapes where N is not a multiple of the kernel's row chunk (256) and V not a multiple of its vocabulary block
 * (256) or of any SIMD width. On the wasm backend with native kernels and on the `native` backend (tensors in JS
 * memory). No tensor and no native scratch memory is left behind. Skipped when the addon did not build here.
 */
import { assert, beforeAll, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as Fused from "../../src/model/Fused.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as NativeKernels from "../../src/native/NativeKernels.ts"
import { randomTensor, rng } from "../fixtures/Random.ts"

const native = NativeKernels.status()
if (!native.available) console.warn(`head kernel tests skipped: ${native.reason}`)

/** max |got − want| / max(max |want|, 1e-6). */
const relativeError = (got: Float32Array, want: Float32Array): number => {
  assert.strictEqual(got.length, want.length)
  let diff = 0
  let scale = 1e-6
  for (let i = 0; i < want.length; i++) {
    if (!Number.isFinite(got[i]!)) return Number.POSITIVE_INFINITY
    diff = Math.max(diff, Math.abs(got[i]! - want[i]!))
    scale = Math.max(scale, Math.abs(want[i]!))
  }
  return diff / scale
}

const valuesOf = (t: tf.Tensor): Float32Array => {
  const values = t.dataSync() as Float32Array
  t.dispose()
  return values
}

interface HeadCase {
  readonly h: tf.Tensor2D // [N, D]
  readonly w: tf.Tensor2D // [D, V], or [V, D] when tied
  readonly targets: tf.Tensor1D // [N]
  readonly dy: tf.Tensor2D // [N, 2]
  readonly tied: boolean
}

/** Uniform h in ±hScale and W in ±1: logits of spread ~hScale·√D; targets cover both ends of the vocabulary. */
const headCase = (next: () => number, N: number, D: number, V: number, tied: boolean, hScale: number): HeadCase => {
  const targets = Int32Array.from({ length: N }, (_, n) => (n === 0 ? 0 : n === 1 ? V - 1 : Math.floor(next() * V)))
  return {
    h: randomTensor([N, D], next, hScale) as tf.Tensor2D,
    w: randomTensor(tied ? [V, D] : [D, V], next) as tf.Tensor2D,
    targets: tf.tensor1d(targets, "int32"),
    dy: randomTensor([N, 2], next) as tf.Tensor2D,
    tied
  }
}

/** W as [D, V], for the tfjs references. */
const asDv = (c: HeadCase, w: tf.Tensor2D): tf.Tensor2D => (c.tied ? (tf.transpose(w) as tf.Tensor2D) : w)

const largest = { forward: 0, dh: 0, dw: 0 }

/** Native forward vs fromLogits, native gradients vs fusedHead's, within `tolerance`; no leaks. */
const assertHead = (label: string, c: HeadCase, tolerance = 1e-4) => {
  const tensorsBefore = tf.memory().numTensors
  const got = tf.tidy(() => Fused.headLogProbs(c.h, c.w, c.targets, { transposed: c.tied })) // [N, 2]
  const { logprobs, entropy } = tf.tidy(() => LogProbs.fromLogits(tf.matMul(c.h, asDv(c, c.w)), c.targets, true))
  const want = tf.tidy(() => tf.stack([logprobs, entropy!], 1))
  tf.dispose([logprobs, entropy!])
  const forward = relativeError(valuesOf(got), valuesOf(want))
  assert.isTrue(forward <= tolerance, `${label} forward: relative error ${forward}`)

  const loss = (out: tf.Tensor) => tf.sum(tf.mul(out, c.dy)) as tf.Scalar
  const [dh, dw] = tf.grads((h: tf.Tensor, w: tf.Tensor) =>
    loss(Fused.headLogProbs(h as tf.Tensor2D, w as tf.Tensor2D, c.targets, { transposed: c.tied }))
  )([c.h, c.w])
  const [dhWant, dwWant] = tf.grads((h: tf.Tensor, w: tf.Tensor) => {
    const out = LogProbs.fusedHead(h as tf.Tensor2D, asDv(c, w as tf.Tensor2D), c.targets, 64)
    return loss(tf.stack([out.logprobs, out.entropy], 1))
  })([c.h, c.w])
  assert.deepStrictEqual(dw!.shape, c.w.shape)
  const dhError = relativeError(valuesOf(dh!), valuesOf(dhWant!))
  const dwError = relativeError(valuesOf(dw!), valuesOf(dwWant!))
  assert.isTrue(dhError <= tolerance, `${label} dh: relative error ${dhError}`)
  assert.isTrue(dwError <= tolerance, `${label} dW: relative error ${dwError}`)
  largest.forward = Math.max(largest.forward, forward)
  largest.dh = Math.max(largest.dh, dhError)
  largest.dw = Math.max(largest.dw, dwError)

  assert.strictEqual(tf.memory().numTensors, tensorsBefore, `${label}: tensors leaked`)
  assert.strictEqual(NativeKernels.stats().scratchBytes, 0, `${label}: native scratch not freed`)
}

const disposeCase = (c: HeadCase) => tf.dispose([c.h, c.w, c.targets, c.dy])

for (const backend of ["wasm", "native"] as const) {
  describe.skipIf(!native.available)(`Fused.headLogProbs on ${backend}`, () => {
    beforeAll(async () => {
      await Effect.runPromise(TensorBackend.initialise({ name: backend, threads: 0, kernels: "native" }))
      NativeKernels.register(backend) // also under EFFECT_RL_KERNELS=stock: this file tests the kernel itself
    })

    it("matches fromLogits forward and fusedHead's gradients, tied and untied, over several row chunks and vocabulary blocks", () => {
      assert.strictEqual(tf.getBackend(), backend)
      assert.isTrue(Fused.headAvailable())
      Object.assign(largest, { forward: 0, dh: 0, dw: 0 })
      const next = rng(backend === "wasm" ? 21 : 22)
      // [N, D, V]: one row; a vocabulary below one block; N over the row chunk (256) with V = 11.7 blocks
      for (const [N, D, V] of [
        [1, 16, 37],
        [7, 33, 251],
        [300, 24, 3001]
      ] as const) {
        for (const tied of [false, true]) {
          for (const hScale of [0.3, 2]) {
            const c = headCase(next, N, D, V, tied, hScale)
            assertHead(`N${N} D${D} V${V} ${tied ? "tied" : "untied"} h±${hScale}`, c)
            disposeCase(c)
          }
        }
      }
      console.log(
        `${backend}: largest relative errors: forward ${largest.forward.toExponential(2)}, ` +
          `dh ${largest.dh.toExponential(2)}, dW ${largest.dw.toExponential(2)}`
      )
    })

    it("gives zeros in W for no rows, and rejects a target outside the vocabulary", () => {
      const next = rng(23)
      const w = randomTensor([8, 5], next) as tf.Tensor2D
      const h = tf.zeros([0, 8]) as tf.Tensor2D
      const targets = tf.tensor1d([], "int32")
      const [dh, dw] = tf.grads((hi: tf.Tensor, wi: tf.Tensor) =>
        tf.sum(Fused.headLogProbs(hi as tf.Tensor2D, wi as tf.Tensor2D, targets))
      )([h, w])
      assert.deepStrictEqual(dh!.shape, [0, 8])
      assert.deepStrictEqual(Array.from(valuesOf(dw!)), new Array(40).fill(0))
      tf.dispose(dh!)
      const bad = tf.tensor1d([1, 5], "int32")
      const h2 = randomTensor([2, 8], next) as tf.Tensor2D
      assert.throws(() => tf.tidy(() => Fused.headLogProbs(h2, w, bad)), /outside/)
      tf.dispose([w, h, targets, bad, h2])
      assert.strictEqual(NativeKernels.stats().scratchBytes, 0)
    })
  })
}
