import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { MathBackendCPU } from "@tensorflow/tfjs-backend-cpu"
import * as Kl from "../../src/algo/Kl.ts"
import { assertClose, assertNoLeak, assertTensorClose, t2 } from "./assertions.ts"

describe("Kl.estimate", () => {
  // SkyRL test_compute_approx_kl: log π = [0.2, 0.3, 0.5], log π_ref = [0.1, 0.2, 0.4], mask [1, 1, 0] → δ = 0.1
  const logProbs = [[0.2, 0.3, 0.5]]
  const refLogProbs = [[0.1, 0.2, 0.4]]
  const mask = [[1, 1, 0]]

  it("k1 is the masked log-ratio δ", () => {
    assertClose(Kl.estimate("k1", logProbs, refLogProbs, mask), [[0.1, 0.1, 0]], 1e-6)
  })

  it("abs is |δ|, k2 is ½δ², masked", () => {
    assertClose(Kl.estimate("abs", [[-1, -2]], [[-2, -1]]), [[1, 1]], 1e-6)
    // ½ · 0.1² = 0.005
    assertClose(Kl.estimate("k2", logProbs, refLogProbs, mask), [[0.005, 0.005, 0]], 1e-6)
  })

  it("k3 is e^{−δ} − 1 + δ", () => {
    // δ = 0.1: e^{−0.1} − 1 + 0.1 = 0.0048374;  δ = 1: e^{−1} = 0.3678794
    assertClose(Kl.estimate("k3", logProbs, refLogProbs, mask), [[0.0048374, 0.0048374, 0]], 1e-6)
    assertClose(Kl.estimate("k3", [[-1]], [[-2]]), [[Math.exp(-1)]], 1e-6)
  })

  it("k3 clamps the log-ratio to ±20 and the estimate to ±10, as SkyRL", () => {
    // δ = 30: κ = −30 → −20, e^{−20} + 20 − 1 = 19.0 → 10;  δ = −30: κ = 20, e^{20} − 21 → 10;  δ = −2: e² − 3 = 4.389
    assertClose(Kl.estimate("k3", [[0, -30, -2]], [[-30, 0, 0]]), [[10, 10, Math.exp(2) - 3]], 1e-5)
  })

  // SkyRL test_compute_approx_kl_applies_loss_mask
  it("zeroes masked positions even when their inputs are NaN, and scales kept ones by a soft mask", () => {
    const lp = [[0.2, 0.3, 0.5, 0.7]]
    const ref = [[0.1, 0.2, 0.4, Number.NaN]]
    const soft = [[1, 0.5, 0.25, 0]]
    for (const estimator of ["k1", "k2", "k3", "abs"] as const) {
      const kl = Kl.estimate(estimator, lp, ref, soft)[0]!
      const unmasked = Kl.estimate(estimator, lp, ref)[0]!
      assert.strictEqual(kl[3], 0, `${estimator}: masked position`)
      assertClose(kl.slice(0, 3), [unmasked[0]!, unmasked[1]! * 0.5, unmasked[2]! * 0.25], 1e-6, 1e-6, estimator)
    }
  })
})

describe("Kl.estimateAsync", () => {
  it("reads the same estimates back asynchronously, for backends without synchronous reads", async () => {
    const [lp, ref, mask] = [[[0.2, 0.3, 0.5]], [[0.1, 0.2, 0.4]], [[1, 1, 0]]]
    const before = tf.memory().numTensors
    assert.deepStrictEqual(await Kl.estimateAsync("k3", lp, ref, mask), Kl.estimate("k3", lp, ref, mask))
    assert.strictEqual(tf.memory().numTensors, before)
  })

  it("is what Kl.estimate points to on webgpu, which cannot read synchronously in Node", async () => {
    // a stand-in registered under webgpu's name: the check reads the backend's name before any kernel runs
    tf.registerBackend("webgpu", () => new MathBackendCPU())
    await tf.setBackend("webgpu")
    try {
      assert.throws(() => Kl.estimate("k1", [[0]], [[0]]), /webgpu backend cannot do in Node: await Kl\.estimateAsync/)
    } finally {
      await tf.setBackend("cpu")
      tf.removeBackend("webgpu")
    }
  })
})

describe("Kl.loss", () => {
  it("averages each sequence's masked KL, then averages over sequences", () => {
    // k1 per token [[1, 3], [2, 7]], mask [[1, 1], [1, 0]] → row means 2 and 2 → 2
    assertTensorClose(
      Kl.loss(
        t2([
          [1, 3],
          [2, 7]
        ]),
        t2([
          [0, 0],
          [0, 0]
        ]),
        t2([
          [1, 1],
          [1, 0]
        ]),
        "k1"
      ),
      2,
      1e-6
    )
  })

  it("is differentiable: for k3, ∂L/∂log π_t = (1 − e^{log π_ref − log π})/n = [0.19673, −0.85914]", () => {
    const initial = t2([[-1, -2]])
    const logProbs = tf.variable(initial)
    const [ref, mask] = [t2([[-1.5, -1]]), t2([[1, 1]])]
    const { value, grads } = tf.variableGrads(() => Kl.loss(logProbs, ref, mask, "k3"), [logProbs])
    assertClose(grads[logProbs.name]!.arraySync() as number[][], [[(1 - Math.exp(-0.5)) / 2, (1 - Math.E) / 2]], 1e-6)
    tf.dispose([value, grads, initial, logProbs, ref, mask])
  })

  it("leaves no tensors behind", () => {
    const [lp, ref, mask] = [t2([[-1, -2]]), t2([[-1.5, -1]]), t2([[1, 1]])]
    for (const estimator of ["k1", "k2", "k3", "abs"] as const) {
      assertNoLeak(() => Kl.loss(lp, ref, mask, estimator))
      assertNoLeak(() => Kl.approx(lp, ref, estimator, mask))
    }
    lp.dispose()
    ref.dispose()
    mask.dispose()
  })
})

describe("Kl controllers", () => {
  // SkyRL test_adaptive_kl_controller_update
  it("adaptive: error (0.2/0.1 − 1) = 1 is clipped to 0.2, so β ← 0.2 · (1 + 0.2 · 10/100) = 0.204", () => {
    const stepped = Kl.update(Kl.adaptive({ initKlCoef: 0.2, target: 0.1, horizon: 100 }), 0.2, 10)
    assertClose(stepped.value, 0.204, 0, 1e-9)
  })

  it("adaptive: KL far below target lowers β by at most 20% of nSteps/horizon", () => {
    // current 0 → error −1 → −0.2 → β = 0.2 · (1 − 0.2 · 10/100) = 0.196
    assertClose(Kl.update(Kl.adaptive({ initKlCoef: 0.2, target: 0.1, horizon: 100 }), 0, 10).value, 0.196, 0, 1e-9)
  })

  it("fixed: β never moves (SkyRL test_fixed_kl_controller)", () => {
    assert.strictEqual(Kl.update(Kl.fixed(0.1), 1.0, 10).value, 0.1)
  })

  it("adaptive: refuses a horizon ≤ 0", () => {
    assert.throws(() => Kl.adaptive({ initKlCoef: 0.1, target: 0.1, horizon: 0 }), /horizon/)
  })
})

describe("Kl.applyKlPenalty", () => {
  // k1 = [[1, 0], [0, masked]]: r' = r − 0.5·kl; avgKl = mean(0.5, 0) = 0.25; avgKlMax = mean(1, 0) = 0.5
  const input = {
    tokenLevelRewards: [
      [0, 1],
      [0, 0]
    ],
    logProbs: [
      [-1, -1],
      [-1, -2]
    ],
    refLogProbs: [
      [-2, -1],
      [-1, -1]
    ],
    lossMask: [
      [1, 1],
      [1, 0]
    ]
  }

  it("subtracts β·kl from the per-token rewards and reports SkyRL's avg_kl and avg_kl_max", () => {
    const out = Kl.applyKlPenalty(input, { controller: Kl.fixed(0.5), estimator: "k1" })
    assertClose(out.tokenLevelRewards, [
      [-0.5, 1],
      [0, 0]
    ])
    assertClose([out.klCoef, out.avgKl, out.avgKlMax], [0.5, 0.25, 0.5])
  })

  it("steps an adaptive controller on avgKl with nSteps = batch size", () => {
    // error clip(0.25/0.1 − 1) = 0.2, nSteps = 2: β = 0.5 · (1 + 0.2 · 2/10) = 0.52
    const controller = Kl.adaptive({ initKlCoef: 0.5, target: 0.1, horizon: 10 })
    assertClose(Kl.applyKlPenalty(input, { controller, estimator: "k1" }).controller.value, 0.52, 0, 1e-9)
  })

  it("never rewards divergence: a negative β applies no penalty (SkyRL uses max(0, β))", () => {
    const out = Kl.applyKlPenalty(input, { controller: Kl.fixed(-1), estimator: "k1" })
    assertClose(out.tokenLevelRewards, input.tokenLevelRewards)
  })
})
