/**
 * The fused transformer kernels (src/model/Fused.ts running native/ through src/native/NativeKernels.ts)
 * against the tfjs compositions they replace: same values to 1e-5 relative error on random shapes, forward and
 * gradients; the transformer's training loss/gradients and KV-cache decoding agree with stock kernels; 1,000 steps leak
 * no tensors and no native memory. Skipped, with the reason, when the addon did not build on this machine.
 */
import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import "@tensorflow/tfjs-backend-wasm"
import * as MissingKernels from "../../src/backend/MissingKernels.ts"
import * as Decoder from "../../src/model/Decoder.ts"
import * as Fused from "../../src/model/Fused.ts"
import * as KvCache from "../../src/model/KvCache.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as WeightView from "../../src/model/WeightView.ts"
import * as NativeKernels from "../../src/native/NativeKernels.ts"
import { randomTensor, rng } from "../fixtures/Random.ts"

const native = NativeKernels.status()
if (!native.available) console.warn(`fused kernel tests skipped: ${native.reason}`)

await tf.setBackend("wasm")
await tf.ready()
MissingKernels.register("wasm")

/** Run `f` with native kernels, then with stock ones (Fused falls back to tfjs compositions); both as arrays. */
const bothWays = (f: () => Array<tf.Tensor>): { native: Array<Float32Array>; stock: Array<Float32Array> } => {
  const run = () => {
    const out = tf.tidy(f)
    const values = out.map((t) => t.dataSync() as Float32Array)
    tf.dispose(out)
    return values
  }
  NativeKernels.register("wasm")
  assert.isTrue(Fused.nativeAvailable())
  const nativeValues = run()
  NativeKernels.unregister("wasm")
  assert.isFalse(Fused.nativeAvailable())
  return { native: nativeValues, stock: run() }
}

/** `bothWays` for async work that returns its values itself (KV-cache decoding reads its logits asynchronously). */
const bothWaysAsync = async (
  f: () => Promise<Array<Float32Array>>
): Promise<{ native: Array<Float32Array>; stock: Array<Float32Array> }> => {
  NativeKernels.register("wasm")
  assert.isTrue(Fused.nativeAvailable())
  const nativeValues = await f()
  NativeKernels.unregister("wasm")
  assert.isFalse(Fused.nativeAvailable())
  return { native: nativeValues, stock: await f() }
}

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

const assertClose = (label: string, result: ReturnType<typeof bothWays>, tolerance = 1e-5) => {
  assert.strictEqual(result.native.length, result.stock.length)
  result.native.forEach((got, i) => {
    const error = relativeError(got, result.stock[i]!)
    assert.isTrue(error <= tolerance, `${label} output ${i}: relative error ${error}`)
  })
}

/** The op's value and the gradients of Σ value·dy with respect to each input. */
const valueAndGrads = (op: (...xs: Array<tf.Tensor>) => tf.Tensor, inputs: Array<tf.Tensor>, dy: tf.Tensor) => {
  const value = op(...inputs)
  const grads = tf.grads((...xs: Array<tf.Tensor>) => tf.sum(tf.mul(op(...xs), dy)))(inputs)
  return [value, ...grads]
}

interface AttentionCase {
  readonly bias: tf.Tensor
  readonly q: tf.Tensor
  readonly k: tf.Tensor4D
  readonly v: tf.Tensor4D
  readonly dy: tf.Tensor
}

/** An attention case: the additive mask (0 where `visible(b, t, j)`, −1e9 elsewhere), then random q, k, v and dy. */
const attentionCase = (
  next: () => number,
  [B, T, L, H, Hkv, hd]: readonly [number, number, number, number, number, number],
  visible: (b: number, t: number, j: number) => boolean
): AttentionCase => {
  const bias = new Float32Array(B * T * L)
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      for (let j = 0; j < L; j++) bias[(b * T + t) * L + j] = visible(b, t, j) ? 0 : -1e9
    }
  }
  return {
    bias: tf.tensor(bias, [B, T, L]),
    q: randomTensor([B * T, H, hd], next, 2),
    k: randomTensor([B, L, Hkv, hd], next, 2) as tf.Tensor4D,
    v: randomTensor([B, L, Hkv, hd], next) as tf.Tensor4D,
    dy: randomTensor([B * T, H * hd], next)
  }
}

/** Native attention's value and gradients against the stock composition. */
const assertAttention = (label: string, c: AttentionCase, scale: number) =>
  assertClose(
    label,
    bothWays(() =>
      valueAndGrads(
        (qi, ki, vi) => Fused.attention(qi!, ki as tf.Tensor4D, vi as tf.Tensor4D, c.bias, scale),
        [c.q, c.k, c.v],
        c.dy
      )
    )
  )

const tinyConfig = (overrides: Record<string, unknown> = {}) =>
  ModelConfig.fromInit({
    architecture: "qwen3",
    vocab_size: 61,
    hidden_size: 32,
    intermediate_size: 48,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 8,
    rope_theta: 10000,
    rms_norm_eps: 1e-6,
    max_position_embeddings: 64,
    tie_word_embeddings: true,
    ...overrides
  })

describe.skipIf(!native.available)("Fused kernels", () => {
  it("RMSNorm (no weight, one weight row, a weight per row group) matches, forward and gradients", () => {
    const next = rng(1)
    for (let trial = 0; trial < 6; trial++) {
      const rows = 1 + Math.floor(next() * 40)
      const groups = 1 + Math.floor(next() * 4)
      const n = 1 + Math.floor(next() * 70)
      const x = randomTensor([rows, groups, n], next, 3)
      const dy = randomTensor([rows, groups, n], next)
      for (const w of [undefined, randomTensor([n], next), randomTensor([groups, n], next)]) {
        const inputs = w === undefined ? [x] : [x, w]
        assertClose(
          `rmsNorm [${rows}, ${groups}, ${n}] w ${w?.shape ?? "none"}`,
          bothWays(() => valueAndGrads((xi, wi) => Fused.rmsNorm(xi!, wi, 1e-6), inputs, dy))
        )
        w?.dispose()
      }
      tf.dispose([x, dy])
    }
  })

  it("SiLU gating (separate and joined gate|up) matches, forward and gradients", () => {
    const next = rng(2)
    for (let trial = 0; trial < 5; trial++) {
      const rows = 1 + Math.floor(next() * 50)
      const n = 1 + Math.floor(next() * 90)
      const [gate, up, dy] = [
        randomTensor([rows, n], next, 6),
        randomTensor([rows, n], next),
        randomTensor([rows, n], next)
      ]
      assertClose(
        `swiglu [${rows}, ${n}]`,
        bothWays(() => valueAndGrads((g, u) => Fused.swiglu(g!, u!), [gate!, up!], dy!))
      )
      assertClose(
        `swigluJoined [${rows}, ${2 * n}]`,
        bothWays(() => [Fused.swigluJoined(tf.concat([gate!, up!], 1) as tf.Tensor2D)])
      )
      tf.dispose([gate!, up!, dy!])
    }
  })

  it("RoPE matches, forward and gradients", () => {
    const next = rng(3)
    for (let trial = 0; trial < 5; trial++) {
      const N = 1 + Math.floor(next() * 30)
      const heads = 1 + Math.floor(next() * 5)
      const hd = 2 * (1 + Math.floor(next() * 16))
      const positions = Array.from({ length: N }, () => Math.floor(next() * 200))
      const { cos, sin } = Decoder.ropeTables(positions, hd, 10000)
      const [x, dy] = [randomTensor([N, heads, hd], next), randomTensor([N, heads, hd], next)]
      const c = tf.tensor(cos, [N, 1, hd])
      const s = tf.tensor(sin, [N, 1, hd])
      assertClose(
        `rope [${N}, ${heads}, ${hd}]`,
        bothWays(() => valueAndGrads((xi) => Fused.rope(xi!, c, s), [x!], dy!))
      )
      tf.dispose([x!, dy!, c, s])
    }
  })

  it("attention over a cache (GQA, masks, fully masked rows, scale) matches, forward and gradients", () => {
    const next = rng(4)
    for (let trial = 0; trial < 6; trial++) {
      const B = 1 + Math.floor(next() * 3)
      const T = 1 + Math.floor(next() * 12)
      const L = T + Math.floor(next() * 10)
      const Hkv = 1 + Math.floor(next() * 3)
      const H = Hkv * (1 + Math.floor(next() * 3))
      const hd = 1 + Math.floor(next() * 20)
      const scale = trial % 2 === 0 ? 1 : 1 / Math.sqrt(hd)
      // causal over the last T slots, random padding; row 0 of batch 0 sees nothing (uniform weights)
      const c = attentionCase(
        next,
        [B, T, L, H, Hkv, hd],
        (b, t, j) => j <= L - T + t && next() > 0.2 && !(b === 0 && t === 0)
      )
      assertAttention(`attention B${B} T${T} L${L} H${H} Hkv${Hkv} hd${hd}`, c, scale)
      tf.dispose(Object.values(c))
    }
  })

  it("attention skips left padding exactly: rows of unequal lengths, decode and prefill, forward and gradients", () => {
    const next = rng(14)
    for (const T of [1, 1, 3, 7]) {
      const B = 3
      const L = T + 20
      const Hkv = 2
      const H = 4
      const hd = 8
      // row b's first pad[b] slots are padding for every query (row 2 has none); causal over the last T slots
      const pad = [Math.floor(next() * 15) + 1, Math.floor(next() * 15) + 1, 0]
      const c = attentionCase(next, [B, T, L, H, Hkv, hd], (b, t, j) => j >= pad[b]! && j <= L - T + t)
      const label = `padded attention T${T} pads ${pad.join(",")}`
      assertAttention(label, c, 1 / Math.sqrt(hd))
      // inference path (no probabilities kept), over a cache with spare slots
      const spare = tf.concat([c.k, tf.zeros([B, 5, Hkv, hd])], 1) as tf.Tensor4D
      const spareV = tf.concat([c.v, tf.zeros([B, 5, Hkv, hd])], 1) as tf.Tensor4D
      assertClose(
        `${label} (inference)`,
        bothWays(() => [Fused.attention(c.q, spare, spareV, c.bias, 1 / Math.sqrt(hd), L)])
      )
      tf.dispose([...Object.values(c), spare, spareV])
    }
  })

  it("attention skips the causal mask's tail per block of queries: right-padded rows over several blocks, forward and gradients", () => {
    const next = rng(15)
    // training layout (T = L, causal, rows right-padded to the longest) and a prefill over a cache (L > T)
    for (const [T, extra] of [
      [70, 0],
      [33, 0],
      [45, 9]
    ] as const) {
      const B = 3
      const L = T + extra
      const Hkv = 2
      const H = 4
      const hd = 8
      // row b holds len[b] tokens; a padding query sees only itself, as LogProbs' mask does; row 2 is full length
      const len = [Math.floor(next() * T) + 1, Math.floor(next() * T) + 1, T]
      const c = attentionCase(next, [B, T, L, H, Hkv, hd], (b, t, j) =>
        t < len[b]! ? j <= extra + t && j < extra + len[b]! : j === extra + t
      )
      const label = `causal attention T${T} L${L} lengths ${len.join(",")}`
      assertAttention(label, c, 1 / Math.sqrt(hd))
      assertClose(
        `${label} (inference)`,
        bothWays(() => [Fused.attention(c.q, c.k, c.v, c.bias, 1 / Math.sqrt(hd))])
      )
      tf.dispose(Object.values(c))
    }
  })

  it("q|k|v preparation (qk-norm, RoPE, cache append) and the norm + matmul + residual linear match", () => {
    const next = rng(5)
    for (const [B, T, P, H, Hkv, hd, withNorm] of [
      [2, 3, 0, 4, 2, 8, true],
      [3, 1, 5, 2, 2, 6, false],
      [1, 4, 2, 6, 3, 4, true]
    ] as const) {
      const N = B * T
      const qkv = randomTensor([N, (H + 2 * Hkv) * hd], next, 2) as tf.Tensor2D
      const positions = Array.from({ length: N }, () => Math.floor(next() * 50))
      const { cos, sin } = Decoder.ropeTables(positions, hd, 10000)
      const c = tf.tensor(cos, [N, 1, hd])
      const s = tf.tensor(sin, [N, 1, hd])
      const norm = withNorm ? (randomTensor([H + Hkv, hd], next) as tf.Tensor2D) : undefined
      const past =
        P === 0
          ? undefined
          : {
              keys: randomTensor([B, P, Hkv, hd], next) as tf.Tensor4D,
              values: randomTensor([B, P, Hkv, hd], next) as tf.Tensor4D,
              length: P
            }
      assertClose(
        `qkvPrep B${B} T${T} P${P}`,
        bothWays(() => {
          const out = Fused.qkvPrep(qkv, c, s, norm, past, { batch: B, heads: H, kvHeads: Hkv, headDim: hd }, 1e-6)
          return [out.q, out.keys, out.values]
        })
      )
      tf.dispose([
        qkv,
        c,
        s,
        ...(norm === undefined ? [] : [norm]),
        ...(past === undefined ? [] : [past.keys, past.values])
      ])
    }
    for (const [M, K, N] of [
      [1, 7, 5],
      [8, 256, 130],
      [9, 33, 64],
      [40, 70, 21]
    ] as const) {
      const [a, w, r] = [randomTensor([M, K], next), randomTensor([K, N], next), randomTensor([M, N], next)]
      assertClose(
        `linear [${M}, ${K}] @ [${K}, ${N}]`,
        bothWays(() => [
          Fused.linear(a as tf.Tensor2D, w as tf.Tensor2D),
          Fused.linear(a as tf.Tensor2D, w as tf.Tensor2D, { normEps: 1e-6, residual: r as tf.Tensor2D })
        ])
      )
      tf.dispose([a, w, r])
    }
  })

  it("a transformer's training loss and every gradient match stock, with left padding", () => {
    const model = Transformer.init(tinyConfig(), 3)
    // non-trivial norm weights, so their gradients are tested
    for (const [name, v] of model.params) {
      if (name.endsWith("norm.weight")) tf.tidy(() => v.assign(tf.randomUniform(v.shape, 0.5, 1.5, "float32", 2)))
    }
    const next = rng(6)
    const ids = Array.from({ length: 3 }, () => Array.from({ length: 9 }, () => Math.floor(next() * 61)))
    const attentionMask = [
      [0, 0, 1, 1, 1, 1, 1, 1, 1],
      [1, 1, 1, 1, 1, 1, 1, 1, 1],
      [0, 0, 0, 0, 1, 1, 1, 1, 1]
    ]
    const variables = Transformer.trainableVariables(model)
    assertClose(
      "transformer loss and gradients",
      bothWays(() => {
        const { value, grads } = tf.variableGrads(() => {
          const logp = LogProbs.ofSequences(model, { ids, attentionMask }).logprobs
          return tf.neg(tf.sum(tf.mul(logp, tf.tensor2d(attentionMask)))) as tf.Scalar
        }, variables)
        return [value, ...variables.map((v) => grads[v.name]!)]
      }),
      1e-4 // sums over the whole model: float32 rounding accumulates
    )
    Transformer.dispose(model)
  })

  it("KV-cache decoding (prefill, extend in place, select, merge, trim) gives the stock logits", async () => {
    const model = Transformer.init(tinyConfig(), 4)
    const prompts = [
      [1, 2, 3, 4, 5],
      [6, 7],
      [8, 9, 10]
    ]
    const run = async () => {
      const view = WeightView.inference(model)
      let { cache, logits } = await KvCache.prefill(model, view, prompts)
      const all = [logits]
      for (let i = 0; i < 4; i++) {
        const stepped = await KvCache.extend(model, view, cache, [i, i + 1, i + 2].slice(0, cache.batch))
        cache = stepped.cache
        all.push(stepped.logits)
        if (i === 1) cache = KvCache.select(cache, [2, 0])
        if (i === 2) {
          const joined = await KvCache.prefill(model, view, [[11, 12, 13, 14, 15, 16, 17, 18, 19]])
          cache = KvCache.merge(cache, joined.cache) // left-pads the shorter one
          all.push(joined.logits)
        }
      }
      cache = KvCache.trim(KvCache.select(cache, [1]))
      const last = await KvCache.extend(model, view, cache, [5])
      cache = last.cache
      all.push(last.logits)
      KvCache.dispose(cache)
      WeightView.dispose(view)
      return all
    }
    assertClose("decode logits", await bothWaysAsync(run))
    Transformer.dispose(model)
  })

  it("the thread pool survives thousands of back-to-back jobs whose chunk counts grow and shrink (no hang, exact)", () => {
    // Regression: a worker still in the previous job could claim a chunk of the next, larger job under the old
    // generation, so the done-count overshot and the caller waited forever (seen as RL runs hanging or crashing).
    NativeKernels.register("wasm", 2)
    try {
      const next = rng(11)
      const shapes: Array<[number, number, number]> = [
        [8, 256, 256],
        [512, 256, 64],
        [16, 64, 1024],
        [300, 96, 288],
        [1, 256, 512]
      ]
      const cases = shapes.map(([m, k, n]) => {
        const a = randomTensor([m, k], next)
        const b = randomTensor([k, n], next)
        return { a, b, want: tf.matMul(a, b).dataSync() as Float32Array }
      })
      for (let i = 0; i < 2000; i++) {
        const c = cases[(i * 7 + (i >> 3)) % cases.length]!
        const got = tf.tidy(() => tf.matMul(c.a, c.b))
        const values = got.dataSync() as Float32Array
        got.dispose()
        if (i % 97 === 0) assert.isBelow(relativeError(values, c.want), 1e-6, `job ${i}`)
      }
      for (const c of cases) tf.dispose([c.a, c.b])
    } finally {
      NativeKernels.unregister("wasm")
    }
  }, 120_000)

  it("1,000 training and decoding steps leak no tensors and no native memory", async () => {
    NativeKernels.register("wasm")
    const model = Transformer.init(
      tinyConfig({ num_hidden_layers: 1, hidden_size: 16, intermediate_size: 16, max_position_embeddings: 512 }),
      5
    )
    const optimizer = NativeKernels.adam(1e-3)
    const variables = Transformer.trainableVariables(model)
    const ids = [
      [1, 2, 3, 4, 5, 6],
      [7, 8, 9, 10, 11, 12]
    ]
    const trainStep = () =>
      optimizer
        .minimize(() => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar, true, variables)
        ?.dispose()
    trainStep() // optimizer slots are created on the first step
    const tensorsBefore = tf.memory().numTensors
    const callsBefore = NativeKernels.stats().calls
    for (let i = 0; i < 1000; i++) trainStep()
    assert.strictEqual(tf.memory().numTensors, tensorsBefore)
    // 1,000 decode steps: two generations of 2 rows × 500 tokens (cache growth to 503 slots)
    for (const seed of [0, 2]) {
      const out = await Sampling.generate(
        model,
        [seed, seed + 1].map((s) => ({
          promptIds: [1, 2, 3],
          sampling: { ...Sampling.defaultParams, maxNewTokens: 500, seed: s }
        }))
      )
      assert.strictEqual(
        out.reduce((n, c) => n + c.tokens.length, 0),
        1000
      )
    }
    assert.strictEqual(tf.memory().numTensors, tensorsBefore)
    assert.isAbove(NativeKernels.stats().calls - callsBefore, 1000 * 10)
    assert.strictEqual(NativeKernels.stats().scratchBytes, 0)
    optimizer.dispose()
    Transformer.dispose(model)
    NativeKernels.unregister("wasm")
  })
})
