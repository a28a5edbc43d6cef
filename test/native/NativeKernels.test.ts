/**
 * Native kernels (src/native/NativeKernels.ts) against tfjs' stock wasm kernels: same results to 1e-5 relative error
 * on random shapes, every transpose and batch-broadcast case, forward and gradients; no leaked tensors or native
 * memory over many steps. Skipped, with the reason, when the addon did not build on this machine.
 */
import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import "@tensorflow/tfjs-backend-wasm"
import * as MissingKernels from "../../src/backend/MissingKernels.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as NativeKernels from "../../src/native/NativeKernels.ts"
import { randomTensor, rng } from "../fixtures/Random.ts"

const native = NativeKernels.status()
if (!native.available) console.warn(`native kernel tests skipped: ${native.reason}`)

await tf.setBackend("wasm")
await tf.ready()
MissingKernels.register("wasm")

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

/** max |got - want| / max(max |want|, 1e-6) over finite values: 0 when equal; Infinity when non-finite values differ. */
const relativeError = (got: Float32Array, want: Float32Array): number => {
  assert.strictEqual(got.length, want.length)
  let diff = 0
  let scale = 1e-6
  for (let i = 0; i < want.length; i++) {
    if (!Number.isFinite(want[i]!) || !Number.isFinite(got[i]!)) {
      if (!Object.is(got[i], want[i])) return Number.POSITIVE_INFINITY
      continue
    }
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

  it("element-wise binary ops and comparisons match stock under broadcasting", () => {
    const next = rng(5)
    const shapes: Array<[Array<number>, Array<number>]> = [
      [
        [7, 33],
        [7, 33]
      ],
      [[7, 33], [33]],
      [
        [7, 33],
        [7, 1]
      ],
      [[], [5, 4]],
      [
        [3, 1, 5],
        [1, 4, 5]
      ],
      [
        [2, 3, 4, 5, 6],
        [3, 1, 5, 1]
      ],
      [
        [2, 1, 3, 1, 5, 1],
        [1, 4, 1, 6, 1, 7]
      ], // too many dims after collapsing: handed to the stock kernel
      [[0, 3], [3]]
    ]
    const ops: Array<[string, (a: tf.Tensor, b: tf.Tensor) => tf.Tensor]> = [
      ["add", tf.add],
      ["sub", tf.sub],
      ["mul", tf.mul],
      ["div", tf.div],
      ["maximum", tf.maximum],
      ["minimum", tf.minimum],
      ["squaredDifference", tf.squaredDifference],
      ["equal", (a, b) => tf.cast(tf.equal(a, b), "float32")],
      ["notEqual", (a, b) => tf.cast(tf.notEqual(a, b), "float32")],
      ["greater", (a, b) => tf.cast(tf.greater(a, b), "float32")],
      ["greaterEqual", (a, b) => tf.cast(tf.greaterEqual(a, b), "float32")],
      ["less", (a, b) => tf.cast(tf.less(a, b), "float32")],
      ["lessEqual", (a, b) => tf.cast(tf.lessEqual(a, b), "float32")]
    ]
    for (const [aShape, bShape] of shapes) {
      // Rounded values so that comparisons see ties.
      const a = tf.round(tf.mul(randomTensor(aShape, next), 4))
      const b = tf.add(tf.round(tf.mul(randomTensor(bShape, next), 4)), 0.5)
      for (const [name, op] of ops) {
        assertClose(
          `${name} ${JSON.stringify(aShape)} ${JSON.stringify(bShape)}`,
          bothWays(() => [op(a, b), op(b, a)])
        )
      }
      tf.dispose([a, b])
    }
  })

  it("unary ops, reductions, transposes, casts and softmax match stock", () => {
    const next = rng(6)
    const x = tf.mul(randomTensor([4, 6, 37], next), 5) // [4, 6, 37]
    const positive = tf.add(tf.abs(x), 0.1)
    const unary: Array<[string, () => tf.Tensor]> = [
      ["exp", () => tf.exp(x)],
      ["log", () => tf.log(positive)],
      ["sqrt", () => tf.sqrt(positive)],
      ["rsqrt", () => tf.rsqrt(positive)],
      ["square", () => tf.square(x)],
      ["neg", () => tf.neg(x)],
      ["sigmoid", () => tf.sigmoid(x)],
      ["tanh", () => tf.tanh(x)],
      ["abs", () => tf.abs(x)],
      ["relu", () => tf.relu(x)],
      ["reciprocal", () => tf.reciprocal(positive)],
      ["step", () => tf.step(x, 0.3)],
      ["exp extremes", () => tf.exp(tf.tensor([-100, -87, -20, 0, 1e-8, 20, 88, 100]))]
    ]
    for (const [name, f] of unary) assertClose(name, bothWays(f))
    const axes: Array<number | Array<number>> = [0, 1, 2, -1, [0, 1], [1, 2], [0, 1, 2], [0, 2]]
    for (const axis of axes) {
      for (const keepDims of [false, true]) {
        const label = `reduce axis ${JSON.stringify(axis)} keepDims ${keepDims}`
        assertClose(
          label,
          bothWays(() => [
            tf.sum(x, axis, keepDims),
            tf.mean(x, axis, keepDims),
            tf.max(x, axis, keepDims),
            tf.min(x, axis, keepDims),
            tf.prod(tf.div(x, 5), axis, keepDims)
          ])
        )
      }
    }
    const cube = randomTensor([3, 4, 5, 6], next)
    for (const perm of [
      [1, 0, 2, 3],
      [0, 2, 1, 3],
      [0, 1, 3, 2],
      [3, 2, 1, 0],
      [0, 2, 3, 1],
      [2, 0, 3, 1],
      [0, 1, 2, 3]
    ]) {
      assertClose(
        `transpose ${perm}`,
        bothWays(() => [tf.transpose(cube, perm), tf.cast(tf.transpose(tf.greater(cube, 0), perm), "float32")])
      )
    }
    assertClose(
      "casts",
      bothWays(() => [
        tf.cast(tf.tensor([1, -2, 3, 2147483647], [4], "int32"), "float32"),
        tf.cast(tf.greater(x, 0), "float32"),
        tf.cast(tf.cast(tf.greater(x, 0), "int32"), "float32"),
        tf.cast(x, "float32")
      ])
    )
    assertClose(
      "softmax",
      bothWays(() => [tf.softmax(x), tf.logSoftmax(x), tf.softmax(tf.tensor([[-1e9, 0, -1e9, 3]]))])
    )
    tf.dispose([x, positive, cube])
  })

  it("gather (embedding lookup) and its gradient match stock; bad indices still raise", () => {
    const next = rng(9)
    const table = randomTensor([50, 3, 8], next) // [V, …]
    const ids = tf.tensor2d(
      Int32Array.from({ length: 4 * 6 }, () => Math.floor(next() * 50)),
      [4, 6],
      "int32"
    )
    const dy = randomTensor([4, 6, 3, 8], next)
    const rows = randomTensor([5, 4], next)
    assertClose(
      "gather",
      bothWays(() => [
        tf.gather(table, ids),
        tf.gather(table, tf.tensor1d([2, 0], "int32"), 1),
        tf.gather(table, tf.tensor1d([7, 7, 1], "int32"), 2),
        tf.cast(tf.gather(tf.tensor1d([5, 6, 7], "int32"), tf.tensor1d([2, 2, 0], "int32")), "float32"),
        tf.grad((t: tf.Tensor) => tf.gather(t, ids))(table, dy),
        tf.unsortedSegmentSum(rows, tf.tensor1d([3, -1, 3, 9, 0], "int32"), 4)
      ])
    )
    NativeKernels.register("wasm")
    assert.throws(() => tf.gather(table, tf.tensor1d([50], "int32")), /not in/)
    NativeKernels.unregister("wasm")
    tf.dispose([table, ids, dy, rows])
  })

  it("concat and split match stock on every axis", () => {
    const next = rng(11)
    const a = randomTensor([2, 3, 4], next)
    const b = randomTensor([2, 3, 5], next)
    const c = randomTensor([2, 1, 4], next)
    assertClose(
      "concat/split",
      bothWays(() => [
        tf.concat([a, b], 2),
        tf.concat([a, c, a], 1),
        tf.concat([a, a], 0),
        tf.concat([tf.zeros([2, 0, 4]), a], 1),
        tf.cast(tf.concat([tf.greater(a, 0), tf.greater(c, 0)], 1), "float32"),
        tf.concat([tf.tensor1d([1, 2], "int32"), tf.tensor1d([3], "int32")]).cast("float32"),
        ...tf.split(b, [2, 3], 2),
        ...tf.split(a, 3, 1),
        ...tf.split(a, [1, -1], 0)
      ])
    )
    tf.dispose([a, b, c])
  })

  it("slice matches stock on every axis, with size -1, size-0 and int32/bool inputs", () => {
    const next = rng(12)
    const x = randomTensor([3, 7, 2, 5], next)
    const i = tf.tensor2d([1, 2, 3, 4, 5, 6], [2, 3], "int32")
    assertClose(
      "slice",
      bothWays(() => [
        tf.slice(x, [0, 0, 0, 0], [-1, 4, -1, -1]), // KvCache.validSlots
        tf.slice(x, [1, 2, 0, 0], [2, 5, 2, 5]),
        tf.slice(x, [0, 3, 1, 2], [3, 1, 1, 3]),
        tf.slice(x, [2, 6, 1, 4], [1, 1, 1, 1]),
        tf.slice(x, [0, 0, 0, 0], [3, 7, 2, 5]),
        tf.slice(x, [1, 0, 0, 0], [1, 0, 2, 5]),
        tf.slice(tf.reshape(x, [21, 10]), [4, 3], [10, -1]),
        tf.slice(tf.reshape(x, [210]), 17, 40),
        tf.cast(tf.slice(i, [0, 1], [2, 2]), "float32"),
        tf.cast(tf.slice(tf.greater(x, 0), [0, 2, 1, 0], [2, 3, 1, 5]), "float32")
      ])
    )
    tf.dispose([x, i])
  })

  it("a transformer's loss and gradients match stock", () => {
    const config = ModelConfig.fromInit({
      architecture: "qwen3",
      vocab_size: 97,
      hidden_size: 64,
      intermediate_size: 96,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      num_key_value_heads: 2,
      head_dim: 16,
      rope_theta: 10000,
      rms_norm_eps: 1e-6,
      max_position_embeddings: 64,
      tie_word_embeddings: true
    })
    const model = Transformer.init(config, 7)
    const next = rng(8)
    const ids = tf.tensor2d(
      Int32Array.from({ length: 3 * 11 }, () => Math.floor(next() * 97)),
      [3, 11],
      "int32"
    )
    const variables = Transformer.trainableVariables(model)
    const lossAndGrads = () => {
      const { value, grads } = tf.variableGrads(
        () => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar,
        variables
      )
      return [value, ...variables.map((v) => grads[v.name]!)]
    }
    assertClose("transformer loss and gradients", bothWays(lossAndGrads), 1e-4)
    ids.dispose()
    Transformer.dispose(model)
  })

  it("NativeAdam updates variables and moments as tf.train.adam does", () => {
    const next = rng(10)
    const initial = [randomTensor([33, 17], next), randomTensor([17], next)]
    const target = randomTensor([5, 17], next)
    const x = randomTensor([5, 33], next)
    const train = (makeOptimizer: () => tf.Optimizer) => () => {
      const [w, b] = initial.map((t) => tf.variable(t.clone()))
      const optimizer = makeOptimizer()
      for (let i = 0; i < 5; i++) {
        optimizer.minimize(() => tf.mean(tf.square(tf.sub(tf.add(tf.matMul(x, w!), b!), target))), false, [w!, b!])
      }
      const out = [w!.clone(), b!.clone()]
      tf.dispose([w!, b!])
      optimizer.dispose()
      return out
    }
    assertClose(
      "NativeAdam",
      bothWays(
        train(() => NativeKernels.adam(0.01)),
        train(() => tf.train.adam(0.01))
      )
    )
    tf.dispose([...initial, target, x])
  })

  it("runs many steps without leaking tensors or native memory", () => {
    NativeKernels.register("wasm")
    const next = rng(4)
    const w = tf.variable(randomTensor([64, 64], next))
    const x = randomTensor([128, 64], next)
    const optimizer = NativeKernels.adam(1e-3)
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
