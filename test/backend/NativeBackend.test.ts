/**
 * The `native` backend (tensors in JS memory, native kernels): a model's log-probs and gradients equal the wasm
 * backend's with the same kernels, and frozen weights stored as bfloat16 give what their float32 values give —
 * through the matmul that reads them as they are, and through every other op, which widens them first.
 */
import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import { assert, beforeEach, describe, it } from "vitest"
import * as NativeBackend from "../../src/backend/NativeBackend.ts"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as NativeKernels from "../../src/native/NativeKernels.ts"

const available = NativeKernels.status().available

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 300,
  hidden_size: 64,
  intermediate_size: 96,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 128,
  tie_word_embeddings: true
})
const ids = Array.from({ length: 3 }, (_, b) => Array.from({ length: 20 }, (_, t) => (b * 31 + t * 7) % 300))

const use = (name: "wasm" | "native") =>
  Effect.runPromise(TensorBackend.initialise({ name, threads: 0, kernels: "native" }))

/** Values that bfloat16 holds exactly: rounding them changes nothing. */
const bf16Exact = (n: number, seed: number): Float32Array => {
  const prng = Prng.make(seed)
  const bits = new Uint32Array(Float32Array.from({ length: n }, () => prng.normal()).buffer)
  for (let i = 0; i < n; i++) bits[i] = bits[i]! & 0xffff0000
  return new Float32Array(bits.buffer)
}

const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let d = 0
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!))
  return d
}

const lossAndGrads = async (model: Transformer.Transformer) => {
  const { value, grads } = tf.variableGrads(
    () => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar,
    Transformer.trainableVariables(model)
  )
  const out = {
    loss: (await value.data())[0]!,
    grads: await Promise.all(Object.values(grads).map(async (g) => Array.from(await g.data())))
  }
  tf.dispose([value, ...Object.values(grads)])
  return out
}

describe.skipIf(!available)("native backend", () => {
  beforeEach(() => use("native"))

  it("gives the wasm backend's log-probs and gradients (same native kernels), leaking no tensors", async () => {
    const results: Array<Awaited<ReturnType<typeof lossAndGrads>>> = []
    for (const name of ["wasm", "native"] as const) {
      await use(name)
      const before = tf.memory().numTensors
      const model = Transformer.init(config, 3, 0.3)
      results.push(await lossAndGrads(model))
      Transformer.dispose(model)
      assert.strictEqual(tf.memory().numTensors, before, `${name} leaked tensors`)
    }
    const [wasm, native] = results as [(typeof results)[0], (typeof results)[0]]
    assert.isTrue(Number.isFinite(wasm.loss))
    assert.approximately(native.loss, wasm.loss, 1e-6)
    wasm.grads.forEach((g, i) => assert.isAtMost(maxDiff(g, native.grads[i]!), 1e-6, `gradient ${i}`))
  })

  it("few-row products with a wide weight (an LM head's [D, V]) equal plain sums, both layouts", async () => {
    for (const [M, K, N] of [
      [8, 33, 5000],
      [5, 16, 4099],
      [1, 7, 4096]
    ] as const) {
      const a = bf16Exact(M * K, 7)
      const b = bf16Exact(K * N, 8)
      const expected = new Float64Array(M * N)
      for (let i = 0; i < M; i++)
        for (let k = 0; k < K; k++) for (let j = 0; j < N; j++) expected[i * N + j] += a[i * K + k]! * b[k * N + j]!
      const [x, w] = [tf.tensor2d(a, [M, K]), tf.tensor2d(b, [K, N])]
      const wT = tf.transpose(w)
      const [nn, nt] = [tf.matMul(x, w), tf.matMul(x, wT, false, true)]
      assert.isAtMost(maxDiff(await nn.data(), expected), 1e-3, `NN ${M}×${K}×${N}`)
      assert.isAtMost(maxDiff(await nt.data(), expected), 1e-3, `NT ${M}×${K}×${N}`)
      tf.dispose([x, w, wT, nn, nt])
    }
  })

  it("few-row products equal plain sums for every row count up to 16 and columns off every register tile", async () => {
    // M 1..16 covers each tile height (8 or 4 rows, then 4, then 1) and its leftovers; N = 203 leaves a remainder
    // after 16-, 24- and 32-column tiles and after one-vector ones; K = 45 runs past the rows prefetched ahead.
    const [K, N] = [45, 203]
    const b = bf16Exact(K * N, 11)
    const w = tf.tensor2d(b, [K, N])
    for (let M = 1; M <= 16; M++) {
      const a = bf16Exact(M * K, M)
      const expected = new Float64Array(M * N)
      for (let i = 0; i < M; i++)
        for (let k = 0; k < K; k++) for (let j = 0; j < N; j++) expected[i * N + j] += a[i * K + k]! * b[k * N + j]!
      const x = tf.tensor2d(a, [M, K])
      const y = tf.matMul(x, w)
      assert.isAtMost(maxDiff(await y.data(), expected), 1e-3, `${M}×${K}×${N}`)
      tf.dispose([x, y])
    }
    w.dispose()
  })

  it("a bfloat16-stored weight multiplies as its float32 values at decode shapes (few rows, K and N off the blocks)", async () => {
    for (const [M, K, N] of [
      [1, 9, 7],
      [2, 8, 8],
      [7, 257, 1031],
      [8, 1024, 520],
      [16, 24, 2048],
      [17, 40, 33]
    ] as const) {
      const wValues = bf16Exact(K * N, M + K)
      const x = tf.tensor2d(bf16Exact(M * K, N), [M, K])
      const plain = tf.tensor2d(wValues, [K, N])
      const stored = tf.tensor2d(new Float32Array(wValues), [K, N])
      NativeBackend.storeBf16(stored)
      const [y, y0] = [tf.matMul(x, stored), tf.matMul(x, plain)]
      assert.isTrue(NativeBackend.storedBf16(stored))
      assert.isAtMost(maxDiff(await y.data(), await y0.data()), 1e-4 * Math.sqrt(K), `${M}×${K}×${N}`)
      tf.dispose([x, plain, stored, y, y0])
    }
  })

  it("a bfloat16-stored weight multiplies as its float32 values, both ways round, and widens for other ops", async () => {
    const [M, K, N] = [5, 70, 131] // not multiples of the kernel's blocks
    const wValues = bf16Exact(K * N, 1)
    const x = tf.tensor2d(bf16Exact(M * K, 2), [M, K])
    const dy = tf.tensor2d(bf16Exact(M * N, 3), [M, N])
    const plain = tf.tensor2d(wValues, [K, N])
    const stored = tf.tensor2d(new Float32Array(wValues), [K, N])
    assert.strictEqual(NativeBackend.storeBf16(stored), K * N * 2)
    assert.isTrue(NativeBackend.storedBf16(stored))
    const [y, y0, dx, dx0] = [
      tf.matMul(x, stored),
      tf.matMul(x, plain),
      tf.matMul(dy, stored, false, true),
      tf.matMul(dy, plain, false, true)
    ]
    assert.isAtMost(maxDiff(await y.data(), await y0.data()), 1e-4)
    assert.isAtMost(maxDiff(await dx.data(), await dx0.data()), 1e-4)
    assert.isTrue(NativeBackend.storedBf16(stored), "the matmul read it as it is")
    assert.deepStrictEqual(Array.from(await stored.data()), Array.from(wValues), "downloads are float32")
    // another op (a JS kernel, then a native one) widens it first: same values, float32 from then on
    const summed = tf.sum(stored, 0)
    assert.isAtMost(maxDiff(await summed.data(), await tf.sum(plain, 0).data()), 1e-4)
    assert.isFalse(NativeBackend.storedBf16(stored))
    const stored2 = tf.tensor2d(new Float32Array(wValues), [K, N])
    NativeBackend.storeBf16(stored2)
    assert.isAtMost(maxDiff(await tf.add(stored2, 1).data(), await tf.add(plain, 1).data()), 1e-6)
    tf.dispose([x, dy, plain, stored, stored2, y, y0, dx, dx0, summed])
  })

  it("LoRA on a bfloat16 base trains the adapters as on a float32 base (base frozen, no gradient for it)", async () => {
    const runWith = async (bf16: boolean) => {
      const model = Transformer.init(config, 4, 0.3)
      // bfloat16-exact base weights, so storing them changes nothing but the storage
      for (const v of model.params.values()) tf.tidy(() => v.assign(tf.tensor(bf16Exact(v.size, v.size), v.shape)))
      const all = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
      Lora.attach(model, { rank: 4, alpha: 8, dropout: 0, targetModules: all }, 5)
      // B is zero at attach: make it non-zero so A gets a gradient too
      for (const a of model.adapters.values())
        tf.tidy(() => a.b.assign(tf.randomNormal(a.b.shape, 0, 0.1, "float32", 6)))
      const frozen = Transformer.frozenWeights(model)
      assert.strictEqual(frozen.length, 7 * config.numLayers)
      if (bf16) for (const w of frozen) NativeBackend.storeBf16(w)
      const out = await lossAndGrads(model)
      if (bf16)
        assert.isTrue(
          frozen.every((w) => NativeBackend.storedBf16(w)),
          "the step kept the base in bfloat16"
        )
      Transformer.dispose(model)
      return out
    }
    const f32 = await runWith(false)
    const bf16 = await runWith(true)
    assert.approximately(bf16.loss, f32.loss, 1e-5)
    assert.strictEqual(bf16.grads.length, f32.grads.length)
    f32.grads.forEach((g, i) => {
      assert.isAbove(Math.max(...g.map(Math.abs)), 0, `adapter gradient ${i} is non-zero`)
      assert.isAtMost(maxDiff(g, bf16.grads[i]!), 1e-4, `adapter gradient ${i}`)
    })
  })

  it("frees a kernel's output when its last tensor goes, never a caller's array, a download, or a shared buffer", async () => {
    const backend = tf.backend() as unknown as { data: { get(id: object): { values: Float32Array } } }
    const valuesOf = (t: tf.Tensor) => backend.data.get(t.dataId).values
    const given = new Float32Array([1, 2, 3, 4, 5, 6])
    const x = tf.tensor2d(given, [2, 3])
    const y = tf.mul(x, 2) // a kernel's output
    const yValues = valuesOf(y)
    const rows = tf.slice(y, [1, 0], [1, 3]) // the cpu Slice makes a view into y's buffer, a native one a copy
    const shared = valuesOf(rows).buffer === yValues.buffer
    y.dispose()
    assert.strictEqual(yValues.length, shared ? 6 : 0, shared ? "a slice still views it" : "nothing views it")
    assert.deepStrictEqual(Array.from(await rows.data()), [8, 10, 12])
    const z = tf.add(x, 1)
    const zValues = valuesOf(z)
    tf.dispose([rows, z])
    assert.strictEqual(zValues.length, 0, "no tensor holds it: freed at once")
    assert.strictEqual(yValues.length, 0, "its last view gone: freed")
    const w = tf.sub(x, 1)
    const downloaded = w.dataSync()
    w.dispose()
    assert.deepStrictEqual(Array.from(downloaded), [0, 1, 2, 3, 4, 5], "a download stays the caller's")
    const reshaped = tf.reshape(x, [3, 2]) // shares x's data
    x.dispose()
    reshaped.dispose()
    assert.deepStrictEqual(Array.from(given), [1, 2, 3, 4, 5, 6], "a caller's array is never freed")
  })
})
