// Ports of SkyRL tests/train/algorithms/test_off_policy_correction.py (same inputs, same expected numbers).
import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import * as Diagnostics from "../../src/algo/Diagnostics.ts"
import * as OffPolicyCorrection from "../../src/algo/OffPolicyCorrection.ts"
import { assertClose, assertNoLeak, assertTensorClose, t2 } from "./assertions.ts"

const read = (metrics: OffPolicyCorrection.Metrics): Promise<Record<string, number>> => Diagnostics.read(metrics)

describe("OffPolicyCorrection.tisRatio", () => {
  // log ρ = old − rollout = [0.5, −0.5, 1.0] → ρ = [1.6487, 0.6065, 2.7183]
  const old = () => t2([[-1.0, -1.5, -0.5]])
  const rollout = () => t2([[-1.5, -1.0, -1.5]])

  it("token: caps each ρ_t at tokenTisRatioClipHigh: [1.6487, 0.6065, 2.0], 1 of 3 capped", async () => {
    const { ratio, metrics } = OffPolicyCorrection.tisRatio(old(), rollout(), t2([[1, 1, 1]]), "token", {
      tokenTisRatioClipHigh: 2.0
    })
    assertTensorClose(ratio, [[1.6487, 0.6065, 2.0]], 1e-4, 1e-3)
    assertClose((await read(metrics)).tisTokenClipHighRatio!, 1 / 3)
  })

  it("sequence: one weight per sequence, exp(0.5 − 0.5 + 1.0) = 2.7183, under the cap of 5", async () => {
    const { ratio, metrics } = OffPolicyCorrection.tisRatio(old(), rollout(), t2([[1, 1, 1]]), "sequence", {
      sequenceTisRatioClipHigh: 5.0
    })
    assertTensorClose(ratio, [[Math.E]], 1e-4, 1e-3)
    assert.strictEqual((await read(metrics)).tisSeqClipHighRatio, 0)
  })

  it("sequence: caps exp(3) = 20.09 at 5", async () => {
    const { ratio, metrics } = OffPolicyCorrection.tisRatio(
      t2([[-1, -1, -1]]),
      t2([[-2, -2, -2]]),
      t2([[1, 1, 1]]),
      "sequence",
      { sequenceTisRatioClipHigh: 5.0 }
    )
    assertTensorClose(ratio, [[5.0]])
    assert.strictEqual((await read(metrics)).tisSeqClipHighRatio, 1)
  })

  it("sequence: sums log ρ over unmasked tokens only: mask [1, 0, 1] → exp(1.5) = 4.4817", async () => {
    const { ratio, metrics } = OffPolicyCorrection.tisRatio(old(), rollout(), t2([[1, 0, 1]]), "sequence", {
      sequenceTisRatioClipHigh: 10.0
    })
    assertTensorClose(ratio, [[Math.exp(1.5)]], 1e-4, 1e-3)
    assert.strictEqual((await read(metrics)).tisSeqClipHighRatio, 0)
  })
})

describe("OffPolicyCorrection.sequenceMask", () => {
  const mask = (
    old: number[][],
    rollout: number[][],
    metric: "product" | "geometric",
    config: OffPolicyCorrection.Config
  ) => OffPolicyCorrection.sequenceMask(t2(old), t2(rollout), t2([[1, 1, 1]]), metric, config)

  it("geometric: keeps a sequence whose geometric-mean ratio exp(0/3) = 1 is within [0.9, 1.1]", async () => {
    const out = mask([[-1.0, -1.1, -1.0]], [[-1.1, -1.0, -1.0]], "geometric", { geoMaskHigh: 1.1, geoMaskLow: 0.9 })
    assertTensorClose(out.mask, [[1]])
    const m = await read(out.metrics)
    assert.deepStrictEqual(
      [m.geoSequenceMaskMaskedRatio, m.geoSequenceMaskOverHighRatio, m.geoSequenceMaskUnderLowRatio],
      [0, 0, 0]
    )
  })

  it("geometric: drops a sequence at exp(1.5/3) = 1.6487 > 1.1", async () => {
    const out = mask([[-1, -1, -1]], [[-1.5, -1.5, -1.5]], "geometric", { geoMaskHigh: 1.1, geoMaskLow: 0.9 })
    assertTensorClose(out.mask, [[0]])
    const m = await read(out.metrics)
    assert.deepStrictEqual(
      [m.geoSequenceMaskMaskedRatio, m.geoSequenceMaskOverHighRatio, m.geoSequenceMaskUnderLowRatio],
      [1, 1, 0]
    )
  })

  it("product: keeps exp(0.3) = 1.35 within [0.5, 2.0], drops exp(3.0) = 20.09", async () => {
    const config = { productMaskHigh: 2.0, productMaskLow: 0.5 }
    const kept = mask([[-1.0, -1.1, -1.2]], [[-1.2, -1.2, -1.2]], "product", config)
    assertTensorClose(kept.mask, [[1]])
    assert.strictEqual((await read(kept.metrics)).productSequenceMaskMaskedRatio, 0)
    const dropped = mask([[-1, -1, -1]], [[-2, -2, -2]], "product", config)
    assertTensorClose(dropped.mask, [[0]])
    const m = await read(dropped.metrics)
    assert.deepStrictEqual(
      [m.productSequenceMaskMaskedRatio, m.productSequenceMaskOverHighRatio, m.productSequenceMaskUnderLowRatio],
      [1, 1, 0]
    )
  })
})

describe("OffPolicyCorrection.outlierTokenMask", () => {
  // token ratios [1, 1, e^5 = 148.4]
  const old = [[-1, -1, -1]]
  const rollout = [[-1, -1, -6]]
  const run = async (lossMask: number[][], config: OffPolicyCorrection.Config, o = old, r = rollout) => {
    const out = OffPolicyCorrection.outlierTokenMask(t2(o), t2(r), t2(lossMask), config)
    return { mask: out.mask.arraySync(), m: await read(out.metrics) }
  }

  it("drops the whole sequence when one token's ratio 148.4 exceeds 100", async () => {
    const out = await run([[1, 1, 1]], { outlierTokenIsThresholdLow: 1e-4, outlierTokenIsThresholdHigh: 100 })
    assert.deepStrictEqual(out.mask, [[0]])
    assert.deepStrictEqual(
      [out.m.outlierSeqMaskedRatio, out.m.outlierSeqOverHighRatio, out.m.outlierSeqUnderLowRatio],
      [1, 1, 0]
    )
  })

  it("keeps a sequence whose ratios [1.65, 0.61, 1.0] are all in bounds", async () => {
    const out = await run(
      [[1, 1, 1]],
      { outlierTokenIsThresholdLow: 1e-4, outlierTokenIsThresholdHigh: 100 },
      [[-1, -1.5, -1]],
      [[-1.5, -1, -1]]
    )
    assert.deepStrictEqual(out.mask, [[1]])
    assert.strictEqual(out.m.outlierSeqMaskedRatio, 0)
  })

  it("ignores an out-of-bounds token that the loss mask already excludes", async () => {
    const out = await run([[1, 1, 0]], { outlierTokenIsThresholdLow: 1e-4, outlierTokenIsThresholdHigh: 100 })
    assert.deepStrictEqual(out.mask, [[1]])
    assert.strictEqual(out.m.outlierSeqMaskedRatio, 0)
  })

  it("accepts everything when both thresholds are unset", async () => {
    const out = await run([[1, 1, 1]], { outlierTokenIsThresholdLow: null, outlierTokenIsThresholdHigh: null })
    assert.deepStrictEqual(out.mask, [[1]])
    assert.deepStrictEqual(
      [out.m.outlierSeqMaskedRatio, out.m.outlierSeqOverHighRatio, out.m.outlierSeqUnderLowRatio],
      [0, 0, 0]
    )
  })

  it("with only a high threshold, drops on 148.4 > 100 and never reports under-low", async () => {
    const out = await run([[1, 1, 1]], { outlierTokenIsThresholdHigh: 100 })
    assert.deepStrictEqual(out.mask, [[0]])
    assert.deepStrictEqual([out.m.outlierSeqOverHighRatio, out.m.outlierSeqUnderLowRatio], [1, 0])
  })

  it("with only a low threshold, drops on e^−10 = 4.5e-5 < 1e-4", async () => {
    const out = await run([[1, 1, 1]], { outlierTokenIsThresholdLow: 1e-4 }, [[-1, -1, -11]], [[-1, -1, -1]])
    assert.deepStrictEqual(out.mask, [[0]])
    assert.deepStrictEqual(
      [out.m.outlierSeqMaskedRatio, out.m.outlierSeqOverHighRatio, out.m.outlierSeqUnderLowRatio],
      [1, 0, 1]
    )
  })
})

describe("OffPolicyCorrection.tokenMask", () => {
  const config = { tokenMaskIsThresholdLow: 0.5, tokenMaskIsThresholdHigh: 2.0 }
  const run = async (old: number[][], rollout: number[][], lossMask: number[][]) => {
    const out = OffPolicyCorrection.tokenMask(t2(old), t2(rollout), t2(lossMask), config)
    return { mask: out.mask.arraySync(), ratio: (await read(out.metrics)).tokenMaskRatio! }
  }

  it("keeps tokens with ratios [1.105, 0.905, 1.0] inside [0.5, 2.0]", async () => {
    const out = await run([[-1, -1.1, -1]], [[-1.1, -1, -1]], [[1, 1, 1]])
    assert.deepStrictEqual(out.mask, [[1, 1, 1]])
    assert.strictEqual(out.ratio, 0)
  })

  it("drops single tokens above (e² = 7.39) or below (e^−2 = 0.135) the band, not their sequence", async () => {
    const high = await run([[-1, -1, -1]], [[-1, -1, -3]], [[1, 1, 1]])
    assert.deepStrictEqual(high.mask, [[1, 1, 0]])
    assertClose(high.ratio, 1 / 3)
    const low = await run([[-1, -1, -3]], [[-1, -1, -1]], [[1, 1, 1]])
    assert.deepStrictEqual(low.mask, [[1, 1, 0]])
    assertClose(low.ratio, 1 / 3)
  })

  it("leaves already-masked tokens at 1 and does not count them", async () => {
    const out = await run([[-1, -1, -1]], [[-1, -1, -6]], [[1, 1, 0]])
    assert.deepStrictEqual(out.mask, [[1, 1, 1]])
    assert.strictEqual(out.ratio, 0)
  })

  it("works per token across a batch: 2 of 4 dropped", async () => {
    const out = await run(
      [
        [-1, -1],
        [-3, -1]
      ],
      [
        [-1, -3],
        [-1, -1]
      ],
      [
        [1, 1],
        [1, 1]
      ]
    )
    assert.deepStrictEqual(out.mask, [
      [1, 0],
      [0, 1]
    ])
    assertClose(out.ratio, 0.5)
  })

  it("keeps ratios exactly on the bounds (≥ low, ≤ high)", async () => {
    const out = await run([[0, 0]], [[-Math.log(0.5), -Math.log(2.0)]], [[1, 1]])
    assert.deepStrictEqual(out.mask, [[1, 1]])
    assert.strictEqual(out.ratio, 0)
  })
})

describe("OffPolicyCorrection.compute", () => {
  const ones = () => t2([[1, 1, 1]])

  it("does nothing and reports nothing when no part is enabled", () => {
    const out = OffPolicyCorrection.compute(t2([[-1, -1, -1]]), t2([[-2, -2, -2]]), ones(), {
      tisRatioType: null,
      sequenceMaskMetric: null
    })
    assert.isUndefined(out.tisRatio)
    assert.deepStrictEqual(out.metrics, {})
    assertTensorClose(out.lossMask, [[1, 1, 1]])
  })

  it("with token TIS only gives ρ = e^0.5 = 1.6487 per token and the IS-ratio metrics", async () => {
    const out = OffPolicyCorrection.compute(t2([[-1, -1, -1]]), t2([[-1.5, -1.5, -1.5]]), ones(), {
      tisRatioType: "token",
      tokenTisRatioClipHigh: 2.0,
      outlierTokenIsThresholdLow: 1e-4,
      outlierTokenIsThresholdHigh: 100
    })
    assertTensorClose(out.tisRatio!, [[Math.exp(0.5), Math.exp(0.5), Math.exp(0.5)]], 1e-4, 1e-3)
    const m = await read(out.metrics)
    assert.property(m, "isRatioMean")
    assert.property(m, "tisTokenClipHighRatio")
  })

  it("with a geometric sequence mask only keeps the mask when the ratio is 1", async () => {
    const out = OffPolicyCorrection.compute(t2([[-1, -1, -1]]), t2([[-1, -1, -1]]), ones(), {
      sequenceMaskMetric: "geometric",
      geoMaskHigh: 1.1,
      geoMaskLow: 0.9,
      outlierTokenIsThresholdLow: 1e-4,
      outlierTokenIsThresholdHigh: 100
    })
    assert.isUndefined(out.tisRatio)
    assertTensorClose(out.lossMask, [[1, 1, 1]])
    assert.property(await read(out.metrics), "geoSequenceMaskMaskedRatio")
  })

  it("with TIS and a geometric mask both on gives ρ = e^0.1 and both sets of metrics", async () => {
    const out = OffPolicyCorrection.compute(t2([[-1, -1, -1]]), t2([[-1.1, -1.1, -1.1]]), ones(), {
      tisRatioType: "token",
      tokenTisRatioClipHigh: 2.0,
      sequenceMaskMetric: "geometric",
      geoMaskHigh: 1.2,
      geoMaskLow: 0.8
    })
    assertTensorClose(out.tisRatio!, [[Math.exp(0.1), Math.exp(0.1), Math.exp(0.1)]], 1e-4, 1e-3)
    const m = await read(out.metrics)
    assert.property(m, "tisTokenClipHighRatio")
    assert.property(m, "geoSequenceMaskMaskedRatio")
  })

  it("can zero the whole loss mask: geometric ratio e = 2.718 outside [0.9, 1.1]", async () => {
    const out = OffPolicyCorrection.compute(t2([[-1, -1, -1]]), t2([[-2, -2, -2]]), ones(), {
      sequenceMaskMetric: "geometric",
      geoMaskHigh: 1.1,
      geoMaskLow: 0.9
    })
    assertTensorClose(out.lossMask, [[0, 0, 0]])
    assert.strictEqual((await read(out.metrics)).geoSequenceMaskMaskedRatio, 1)
  })

  it("applies the token mask through the whole pipeline: ratio 7.389 > 2 is zeroed", async () => {
    const out = OffPolicyCorrection.compute(t2([[-1, -1, -1]]), t2([[-1, -1, -3]]), ones(), {
      tokenMaskIsThresholdLow: 0.5,
      tokenMaskIsThresholdHigh: 2.0
    })
    assertTensorClose(out.lossMask, [[1, 1, 0]])
    assertClose((await read(out.metrics)).tokenMaskRatio!, 1 / 3)
  })
})

describe("OffPolicyCorrection.apply", () => {
  it("passes loss and mask through when there are no rollout log-probs", () => {
    const out = OffPolicyCorrection.apply(t2([[1, 2]]), t2([[-1, -1]]), undefined, t2([[1, 0]]), {
      tisRatioType: "token"
    })
    assertTensorClose(out.loss, [[1, 2]])
    assertTensorClose(out.lossMask, [[1, 0]])
    assert.deepStrictEqual(out.metrics, {})
  })

  it("leaves no tensors behind with every part enabled", () => {
    const [old, rollout, mask, loss] = [t2([[-1, -2, -1]]), t2([[-1.2, -1.5, -3]]), t2([[1, 1, 0]]), t2([[1, 2, 3]])]
    const all: OffPolicyCorrection.Config = {
      tisRatioType: "sequence",
      sequenceMaskMetric: "product",
      outlierTokenIsThresholdLow: 0.01,
      outlierTokenIsThresholdHigh: 100,
      tokenMaskIsThresholdLow: 0.5,
      tokenMaskIsThresholdHigh: 2
    }
    assertNoLeak(() => OffPolicyCorrection.apply(loss, old, rollout, mask, all))
    assertNoLeak(() => OffPolicyCorrection.apply(loss, old, rollout, mask, { ...all, tisRatioType: "token" }))
    assertNoLeak(() => OffPolicyCorrection.apply(loss, old, undefined, mask, all))
    assertNoLeak(() => OffPolicyCorrection.apply(loss, old, rollout, mask, {}))
    tf.dispose([old, rollout, mask, loss])
  })
})
