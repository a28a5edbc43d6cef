/**
 * Native kernels (src/backend/NativeKernels.ts) against tfjs' stock wasm kernels: same results to 1e-5 relative error
 * on random shapes, every transpose and batch-broadcast case, forward and gradients; no leaked tensors or native
 * memory over many steps. Skipped, with the reason, when the addon did not build on this machine.
 */
import { assert, describe, it } from "@effect/vitest"
import * as tf from "@tensorflow/tfjs"
import "@tensorflow/tfjs-backend-wasm"
import * as NativeKernels from "../../src/backend/NativeKernels.ts"

const native = NativeKernels.status()
if (!native.available) console.warn(`native kernel tests skipped: ${native.reason}`)

await tf.setBackend("wasm")
await tf.ready()

/** Deterministic shapes and values: mulberry32. */
const rng = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}
const randomTensor = (shape: Array<number>, next: () => number): tf.Tensor =>
  tf.tensor(
    Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => next() * 2 - 1),
    shape
  )

/**
 * Run `f` with native kernels and `reference` (default: `f`) with stock kernels; return both results as arrays.
 * The reference differs where a stock wasm kernel is itself wrong: it mis-broadcasts batch dims such as [2,1]·[1,4],
 * and its _FusedMatMul adds the bias along the wrong axis when transposeB is set (tfjs 4.22).
 */
const bothWays = (
  f: () => tf.Tensor | Array<tf.Tensor>,
  reference: () => tf.Tensor | Array<tf.Tensor> = f
): { native: Array<Float32Array>; stock: Array<Float32Array> } => {
  const run = (g: () => tf.Tensor | Array<tf.Tensor>) => {
    const out = tf.tidy(g)
    const list = Array.isArray(out) ? out : [out]
    const values = list.map((t) => t.dataSync() as Float32Array)
    tf.dispose(list)
    return values
  }
  NativeKernels.register("wasm")
  const nativeValues = run(f)
  NativeKernels.unregister("wasm")
  const stockValues = run(reference)
  return { native: nativeValues, stock: stockValues }
}

/** max |got - want| / max(max |want|, 1e-6): 0 when equal. */
const relativeError = (got: Float32Array, want: Float32Array): number => {
  assert.strictEqual(got.length, want.length)
  let diff = 0
  let scale = 1e-6
  for (let i = 0; i < want.length; i++) {
    diff = Math.max(diff, Math.abs(got[i]! - want[i]!))
    scale = Math.max(scale, Math.abs(want[i]!))
  }
  return diff / scale
}

const assertClose = (label: string, result: ReturnType<typeof bothWays>, tolerance = 1e-5) => {
  result.native.forEach((got, i) => {
    const error = relativeError(got, result.stock[i]!)
    assert.isTrue(error <= tolerance, `${label} output ${i}: relative error ${error}`)
  })
}

describe.skipIf(!native.available)("NativeKernels", () => {
  it("registers the matmul kernels and reports its BLAS", () => {
    const names = NativeKernels.register("wasm")
    NativeKernels.unregister("wasm")
    assert.includeMembers([...names], ["BatchMatMul", "_FusedMatMul"])
    assert.isTrue(native.available && (native.blas === "openblas" || native.blas === "builtin"))
  })

  it("BatchMatMul matches stock on random shapes, every transpose combination and batch broadcast", () => {
    const next = rng(1)
    const dim = (max: number) => 1 + Math.floor(next() * max)
    // [batch dims of a, batch dims of b]: equal, broadcast one side, broadcast both ways, rank mismatch, none.
    const batchCases: Array<[Array<number>, Array<number>]> = [
      [[], []],
      [[3], [3]],
      [[4], [1]],
      [[1], [5]],
      [[2, 3], [3]],
      [
        [2, 1],
        [1, 4]
      ],
      [[], [2, 3]],
      [
        [2, 2, 3],
        [2, 1, 3]
      ]
    ]
    for (const [aBatch, bBatch] of batchCases) {
      for (const transposeA of [false, true]) {
        for (const transposeB of [false, true]) {
          const m = dim(70)
          const n = dim(70)
          const k = dim(300)
          const aShape = [...aBatch, ...(transposeA ? [k, m] : [m, k])]
          const bShape = [...bBatch, ...(transposeB ? [n, k] : [k, n])]
          const a = randomTensor(aShape, next)
          const b = randomTensor(bShape, next)
          const label = `a${JSON.stringify(aShape)}${transposeA ? "ᵀ" : ""} · b${JSON.stringify(bShape)}${transposeB ? "ᵀ" : ""}`
          const batch = tf.broadcast_util.assertAndGetBroadcastShape(aBatch, bBatch)
          assertClose(
            label,
            bothWays(
              () => tf.matMul(a, b, transposeA, transposeB),
              () =>
                tf.matMul(
                  tf.broadcastTo(a, [...batch, ...aShape.slice(-2)]),
                  tf.broadcastTo(b, [...batch, ...bShape.slice(-2)]),
                  transposeA,
                  transposeB
                )
            )
          )
          tf.dispose([a, b])
        }
      }
    }
  })

  // (tfjs' BatchMatMul gradient does not sum over broadcast batch dims, so gradients use equal batches.)
  it("matmul gradients match stock for every transpose combination", () => {
    const next = rng(2)
    for (const transposeA of [false, true]) {
      for (const transposeB of [false, true]) {
        const [m, n, k] = [17, 23, 45]
        const a = randomTensor([3, ...(transposeA ? [k, m] : [m, k])], next)
        const b = randomTensor([3, ...(transposeB ? [n, k] : [k, n])], next)
        const dy = randomTensor([3, m, n], next)
        const grads = tf.grads((x: tf.Tensor, y: tf.Tensor) => tf.matMul(x, y, transposeA, transposeB))
        assertClose(
          `d(a${transposeA ? "ᵀ" : ""}·b${transposeB ? "ᵀ" : ""})`,
          bothWays(() => grads([a, b], dy))
        )
        tf.dispose([a, b, dy])
      }
    }
  })

  it("fused matmul (bias + activation) matches stock, forward and gradients", () => {
    const next = rng(3)
    for (const activation of ["linear", "relu", "relu6", "elu", "leakyrelu", "sigmoid"] as const) {
      for (const transposeB of [false, true]) {
        const [m, n, k] = [31, 19, 64]
        const a = randomTensor([m, k], next)
        const b = randomTensor(transposeB ? [n, k] : [k, n], next)
        const bias = randomTensor([n], next)
        const fused = (x: tf.Tensor, y: tf.Tensor, z: tf.Tensor) =>
          tf.fused.matMul({ a: x as tf.Tensor2D, b: y as tf.Tensor2D, transposeB, bias: z, activation })
        const unfused = (x: tf.Tensor, y: tf.Tensor, z: tf.Tensor) =>
          activate(tf.add(tf.matMul(x, y, false, transposeB), z))
        const activate = (x: tf.Tensor): tf.Tensor =>
          activation === "relu"
            ? tf.relu(x)
            : activation === "relu6"
              ? tf.relu6(x)
              : activation === "elu"
                ? tf.elu(x)
                : activation === "leakyrelu"
                  ? tf.leakyRelu(x, 0.2)
                  : activation === "sigmoid"
                    ? tf.sigmoid(x)
                    : x
        assertClose(
          `fused ${activation}`,
          bothWays(
            () => fused(a, b, bias),
            () => unfused(a, b, bias)
          )
        )
        if (activation !== "relu6") {
          // (tfjs has no relu6 gradient for fused matmul.)
          const dy = randomTensor([m, n], next)
          assertClose(
            `d fused ${activation}`,
            bothWays(
              () => tf.grads(fused)([a, b, bias], dy),
              () => tf.grads(unfused)([a, b, bias], dy)
            )
          )
          dy.dispose()
        }
        tf.dispose([a, b, bias])
      }
    }
  })

  it("runs many steps without leaking tensors or native memory", () => {
    NativeKernels.register("wasm")
    const next = rng(4)
    const w = tf.variable(randomTensor([64, 64], next))
    const x = randomTensor([128, 64], next)
    const optimizer = tf.train.adam(1e-3)
    const step = () =>
      optimizer.minimize(() => tf.mean(tf.square(tf.matMul(tf.relu(tf.matMul(x, w)), w, false, true))), false)
    step() // optimizer slots are created on the first step
    const tensorsBefore = tf.memory().numTensors
    const callsBefore = NativeKernels.stats().calls
    for (let i = 0; i < 200; i++) step()
    assert.strictEqual(tf.memory().numTensors, tensorsBefore)
    assert.isAbove(NativeKernels.stats().calls - callsBefore, 200 * 3)
    assert.strictEqual(NativeKernels.stats().scratchBytes, 0)
    NativeKernels.unregister("wasm")
    tf.dispose([w, x])
    optimizer.dispose()
  })
})
