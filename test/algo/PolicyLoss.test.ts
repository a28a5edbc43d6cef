import { describe, expect, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import * as PolicyLoss from "../../src/algo/PolicyLoss.ts"
import { assertClose, assertNoLeak, t2 } from "./assertions.ts"

type Rows = Array<Array<number>>

/** Loss value and gradient d loss / d log π_θ, through tf.variableGrads. */
const lossAndGrad = <N extends PolicyLoss.Name>(
  name: N,
  data: { logProbs: Rows; oldLogProbs: Rows; advantages: Rows; lossMask?: Rows; rolloutLogProbs?: Rows },
  options: PolicyLoss.Options[N]
): { loss: number; grad: Rows } => {
  const initial = t2(data.logProbs)
  const logProbs = tf.variable(initial)
  const inputs = {
    logProbs,
    oldLogProbs: t2(data.oldLogProbs),
    advantages: t2(data.advantages),
    lossMask: t2(data.lossMask ?? data.logProbs.map((row) => row.map(() => 1))),
    rolloutLogProbs: data.rolloutLogProbs === undefined ? undefined : t2(data.rolloutLogProbs)
  }
  const { value, grads } = tf.variableGrads(() => PolicyLoss.loss(name, inputs, options).loss, [logProbs])
  const out = { loss: value.dataSync()[0]!, grad: grads[logProbs.name]!.arraySync() as Rows }
  tf.dispose([value, grads, initial, logProbs, ...Object.values(inputs).filter((x) => x !== undefined)])
  return out
}

// SkyRL's PPO band ε 0.2/0.2, losses summed over tokens: the worked numbers below are for it
const sum = { lossReduction: "sum", epsClipLow: 0.2, epsClipHigh: 0.2 } as const

/** Every loss's options at once (each loss reads its own): SkyRL's values, with `lossReduction` to choose. */
const every = (lossReduction: PolicyLoss.ReduceOptions["lossReduction"]) =>
  ({
    lossReduction,
    epsClipLow: 0.2,
    epsClipHigh: 0.2,
    clipRatioC: 3,
    cispoEpsClipLow: 1,
    cispoEpsClipHigh: 4,
    tauPos: 1,
    tauNeg: 1.05,
    dppoType: "binary_tv",
    deltaLow: 0.2,
    deltaHigh: 0.2
  }) as const

// SkyRL's shared fixture (from NeMo-RL): ρ = exp(log π − log π_old) ≈ [0.5, 1.0, 10.0]
const nemo = {
  advantages: [[1.0, -1.0, -4.0]],
  oldLogProbs: [[-1.0, -1.0, -3.0]],
  logProbs: [[-1.69315, -1.0, -0.69741]],
  lossMask: [[1, 1, 1]]
}

describe("PolicyLoss.regular", () => {
  it("clips ratios far outside the band and gives those tokens zero gradient", () => {
    // ρ = 10, Â = +1: min(10, 1.2) → ℓ = −1.2;   ρ = 0.5, Â = −1: min(−0.5, −0.8) → ℓ = 0.8;   both clipped
    const data = { logProbs: [[Math.log(10) - 1, Math.log(0.5) - 1]], oldLogProbs: [[-1, -1]], advantages: [[1, -1]] }
    const values = PolicyLoss.compute("regular", { ...data, lossMask: [[1, 1]] }, sum)
    assertClose([values.loss, values.clipRatio], [-0.4, 1], 1e-5)
    assertClose(lossAndGrad("regular", data, sum).grad, [[0, 0]])
  })

  it("inside the band is the plain surrogate −ρÂ, with gradient −ρÂ", () => {
    // ρ = 1.1, Â = 2 → ℓ = −2.2, dℓ/dlog π = −2.2
    const out = lossAndGrad("regular", { logProbs: [[Math.log(1.1)]], oldLogProbs: [[0]], advantages: [[2]] }, sum)
    assertClose([out.loss, out.grad[0]![0]!], [-2.2, -2.2], 1e-5)
  })

  it("uses an asymmetric band: ρ = 1.25 passes εhigh = 0.28 but is clipped at εhigh = 0.2", () => {
    const data = { logProbs: [[Math.log(1.25)]], oldLogProbs: [[0]], advantages: [[1]], lossMask: [[1]] }
    assertClose(PolicyLoss.compute("regular", data, { ...sum, epsClipHigh: 0.28 }).loss, -1.25, 1e-5)
    assertClose(PolicyLoss.compute("regular", data, { ...sum, epsClipHigh: 0.2 }).loss, -1.2, 1e-5)
  })

  it("reduces −Â by each of SkyRL's loss reductions (ρ = 1)", () => {
    // Â = [[1, 2, ·], [3, ·, ·]]: token_mean −6/3 = −2; sequence_mean −(1.5 + 3)/2 = −2.25;
    // seq_mean_token_sum_norm (maxSeqLen 3) −(3/3 + 3/3)/2 = −1; sum −6
    const data = {
      logProbs: [
        [-1, -1, -1],
        [-1, -1, -1]
      ],
      oldLogProbs: [
        [-1, -1, -1],
        [-1, -1, -1]
      ],
      advantages: [
        [1, 2, 0],
        [3, 0, 0]
      ],
      lossMask: [
        [1, 1, 0],
        [1, 0, 0]
      ]
    }
    const loss = (lossReduction: PolicyLoss.ReduceOptions["lossReduction"]) =>
      PolicyLoss.compute("regular", data, { ...sum, lossReduction, maxSeqLen: 3 }).loss
    assertClose(
      [loss("token_mean"), loss("sequence_mean"), loss("seq_mean_token_sum_norm"), loss("sum")],
      [-2, -2.25, -1, -6],
      1e-6
    )
  })

  it("reports approxKl = mean of (ρ − 1) − log ρ: ρ = 2 → 1 − ln 2 = 0.30685", () => {
    const values = PolicyLoss.compute(
      "regular",
      { logProbs: [[Math.log(2) - 1]], oldLogProbs: [[-1]], advantages: [[1]], lossMask: [[1]] },
      sum
    )
    assertClose(values.approxKl, 1 - Math.log(2), 1e-6)
  })
})

describe("PolicyLoss.dualClip", () => {
  // SkyRL test_policy_loss_dual_clip
  it("bounds the loss of negative advantages by −c·Â: ℓ = [−0.5, 1.0, 12.0], sum 12.5", () => {
    // PPO ℓ = max(−ρÂ, −clip(ρ)Â) = [−0.5, 1.0, 40.0]; Â < 0 → min(−3Â, ℓ) = [·, 1.0, min(12, 40) = 12]
    assertClose(PolicyLoss.compute("dual_clip", nemo, { ...sum, clipRatioC: 3 }).loss, 12.5, 1e-4)
  })

  it("leaves positive advantages to plain PPO-clip and gives dual-clipped tokens zero gradient", () => {
    // Â = +1, ρ = 10 → −1.2 (PPO);  Â = −1, ρ = 10 → min(3, 10) = 3;  Â = −1, ρ = 0.5 → min(3, 0.8) = 0.8
    const data = {
      logProbs: [[Math.log(10), Math.log(10), Math.log(0.5)]],
      oldLogProbs: [[0, 0, 0]],
      advantages: [[1, -1, -1]]
    }
    const out = lossAndGrad("dual_clip", data, { ...sum, clipRatioC: 3 })
    assertClose(out.loss, -1.2 + 3 + 0.8, 1e-5)
    assertClose(out.grad, [[0, 0, 0]])
  })
})

describe("PolicyLoss.gspo", () => {
  it("uses one sequence ratio for every token, with each token's own gradient", () => {
    // log s = mean(0.5, −1) = −0.25 → s = 0.7788 for both tokens (token 0 alone would be ρ = 1.65, clipped);
    // s inside the Â > 0 region where the unclipped term wins → ℓ_t = −s, dℓ/dlog π_t = −s
    const out = lossAndGrad("gspo", { logProbs: [[-1, -2]], oldLogProbs: [[-1.5, -1]], advantages: [[1, 1]] }, sum)
    const s = Math.exp(-0.25)
    assertClose(out.loss, -2 * s, 1e-5)
    assertClose(out.grad, [[-s, -s]], 1e-5)
  })

  // SkyRL test_gspo_importance_sampling_levels: same inputs, sum reduction
  it("differs from token-level PPO on sequences of different lengths: −18.0716 vs −15.1868", () => {
    const data = {
      advantages: [
        [1.5, 2.0, 1.0, 0.8, 0.5, 0.0, 0.0, 0.0],
        [3.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.5, 0.8, 1.2, 2.5, 0.0, 0.0, 0.0, 0.0]
      ],
      oldLogProbs: Array.from({ length: 3 }, () => new Array<number>(8).fill(-1)),
      logProbs: [
        [0.2, -2.5, -0.3, 0.1, -1.8, -1.0, -1.0, -1.0],
        [0.8, -0.2, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
        [-0.5, 0.3, -1.7, 0.4, -1.0, -1.0, -1.0, -1.0]
      ],
      lossMask: [
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0]
      ]
    }
    const token = PolicyLoss.compute("regular", data, sum)
    const sequence = PolicyLoss.compute("gspo", data, sum)
    assertClose([token.loss, token.clipRatio], [-15.186828, 8 / 11], 1e-5, 1e-5)
    assertClose([sequence.loss, sequence.clipRatio], [-18.071587, 6 / 11], 1e-5, 1e-5)
  })
})

describe("PolicyLoss.cispo", () => {
  const band = { ...sum, cispoEpsClipLow: 0.2, cispoEpsClipHigh: 0.2 }

  // SkyRL test_policy_loss_cispo
  it("weights −Â·log π by the clipped ratio: clip([0.5, 1, 10], 0.8, 1.2) = [0.8, 1, 1.2] → −2.9930", () => {
    // 1·0.8·1.69315 − 1·1·1 − 4·1.2·0.69741 = 1.35452 − 1 − 3.34757 = −2.99305
    const values = PolicyLoss.compute("cispo", nemo, band)
    assertClose(values.loss, -2.993, 1e-4)
    assertClose(values.clipRatio, 2 / 3, 1e-6)
  })

  it("keeps a gradient on clipped tokens: dℓ/dlog π = −Â·clip(ρ) = [−0.8, 1, 4.8]", () => {
    assertClose(lossAndGrad("cispo", nemo, band).grad, [[-0.8, 1, 4.8]], 1e-5)
  })

  // SkyRL test_policy_loss_cispo_rollout_anchor
  it("anchored on the rollout: ρ = π_θ/π_rollout ≈ [0.6796, 1.6487, 1.3566] → −3.1930 and its ratio metrics", () => {
    const rolloutLogProbs = [[-1.30685, -1.5, -1.0]]
    const values = PolicyLoss.compute("cispo", { ...nemo, rolloutLogProbs }, { ...band, cispoAnchor: "rollout" })
    assertClose(values.loss, -3.193048, 1e-5)
    assertClose(
      [values.cispoRatioMean!, values.cispoRatioClampedMean!, values.cispoRatioMax!, values.cispoRatioMin!],
      [1.2272158, 1.0666667, 1.6487212, 0.6795666],
      1e-5
    )
    const old = PolicyLoss.compute("cispo", { ...nemo, rolloutLogProbs }, { ...band, cispoAnchor: "old" })
    assertClose(old.loss, -2.993048, 1e-5)
  })

  // SkyRL test_policy_loss_cispo_ratio_min_max_ignore_masked_tokens
  it("takes ratio min/max over unmasked tokens only, not the zeros of masked ones", () => {
    const values = PolicyLoss.compute("cispo", { ...nemo, lossMask: [[1, 0, 1]] }, band)
    assertClose([values.cispoRatioMin!, values.cispoRatioMax!], [0.5, 10], 1e-4, 1e-3)
  })

  it("refuses the rollout anchor without rollout log-probs, or stacked with TIS (it would double-count)", () => {
    expect(() => PolicyLoss.compute("cispo", nemo, { ...band, cispoAnchor: "rollout" })).toThrow(/rolloutLogProbs/)
    expect(() =>
      PolicyLoss.compute(
        "cispo",
        { ...nemo, rolloutLogProbs: [[-1.2, -1.2, -1.2]] },
        { ...band, cispoAnchor: "rollout", offPolicyCorrection: { tisRatioType: "token" } }
      )
    ).toThrow(/double-count/)
  })
})

describe("PolicyLoss.rolloutIs", () => {
  it("hard-zeroes tokens whose rollout ratio leaves (1 − εlow, 1 + εhigh), and stops the ratio's gradient", () => {
    // ρ = π_θ/π_rollout = [1, 2]: f = [1, 0];  ℓ = −f·Â·log π = [−1·1·(−1), 0] = [1, 0];  dℓ/dlog π = −f·Â = [−1, 0]
    const data = {
      logProbs: [[-1, -0.5]],
      oldLogProbs: [[-1, -0.5]],
      rolloutLogProbs: [[-1, -0.5 - Math.log(2)]],
      advantages: [[1, 1]]
    }
    const out = lossAndGrad("rollout_is", data, sum)
    assertClose([out.loss, ...out.grad[0]!], [1, -1, 0], 1e-5)
    assertClose(PolicyLoss.compute("rollout_is", { ...data, lossMask: [[1, 1]] }, sum).clipRatio, 0.5)
  })

  it("needs rollout log-probs", () => {
    expect(() => PolicyLoss.compute("rollout_is", nemo, sum)).toThrow(/rolloutLogProbs/)
  })
})

describe("PolicyLoss.sapo", () => {
  // SkyRL test_sapo_policy_loss_basic: τpos 1, τneg 2, ρ = [e^−0.5, e^0.2, e^−0.1]
  it("replaces the clip by the soft gate σ(τ(ρ − 1))·4/τ: −1.3461, clipRatio 0", () => {
    const values = PolicyLoss.compute(
      "sapo",
      {
        logProbs: [[-1.5, -0.8, -1.1]],
        oldLogProbs: [[-1, -1, -1]],
        advantages: [[1, -1, 0.5]],
        lossMask: [[1, 1, 1]]
      },
      { ...sum, tauPos: 1, tauNeg: 2 }
    )
    assertClose([values.loss, values.clipRatio], [-1.3461294, 0], 1e-5)
  })
})

describe("PolicyLoss.dppo", () => {
  // SkyRL test_dppo_policy_loss cases, sum reduction
  const run = (dppoType: "binary_tv" | "binary_kl", delta: number, old: Rows, lp: Rows, adv: Rows, rollout?: Rows) =>
    PolicyLoss.compute(
      "dppo",
      {
        logProbs: lp,
        oldLogProbs: old,
        advantages: adv,
        lossMask: lp.map((row) => row.map(() => 1)),
        rolloutLogProbs: rollout
      },
      { ...sum, dppoType, deltaLow: delta, deltaHigh: delta }
    )

  it("binary_tv drops tokens whose probability moved past δ in the advantage's direction", () => {
    // p − μ = [e^−0.3 − e^−1, e^−2 − e^−1, …] = [0.373, −0.233, 0.039]: tokens 0 (Â > 0) and 1 (Â < 0) dropped
    const out = run("binary_tv", 0.2, [[-1, -1, -1]], [[-0.3, -2.0, -0.9]], [[1, -1, 1]])
    assertClose([out.loss, out.clipRatio], [-Math.exp(0.1), 2 / 3], 1e-5)
  })

  it("binary_tv keeps tokens that moved against the advantage's direction", () => {
    const out = run("binary_tv", 0.2, [[-1, -1]], [[-2.0, -0.3]], [[1, -1]])
    assertClose([out.loss, out.clipRatio], [1.6458733, 0], 1e-5)
  })

  it("binary_tv measures the move from the rollout policy when given", () => {
    assertClose(run("binary_tv", 0.2, [[-1, -1]], [[-0.3, -0.95]], [[1, 1]], [[-0.35, -1]]).loss, -2.1025422, 1e-5)
    assertClose(run("binary_tv", 0.2, [[-1, -1]], [[-0.3, -0.95]], [[1, 1]]).loss, -1.0512711, 1e-5)
  })

  it("binary_kl drops by the Bernoulli KL of the token probability", () => {
    const masked = run("binary_kl", 0.05, [[-1, -1]], [[-0.1, -0.95]], [[1, 1]])
    assertClose([masked.loss, masked.clipRatio], [-1.0512711, 0.5], 1e-5)
    const within = run("binary_kl", 0.5, [[-1, -1]], [[-1.01, -0.99]], [[1, -1]])
    assertClose([within.loss, within.clipRatio], [0.0200003, 0], 1e-5)
  })
})

describe("PolicyLoss off-policy correction", () => {
  it("token TIS multiplies each token's loss by min(π_old/π_rollout, cap): −(1.6487 + 2) = −3.6487", () => {
    const values = PolicyLoss.compute(
      "regular",
      {
        logProbs: [[-1, -1]],
        oldLogProbs: [[-1, -1]],
        rolloutLogProbs: [[-1.5, -3]],
        advantages: [[1, 1]],
        lossMask: [[1, 1]]
      },
      { ...sum, offPolicyCorrection: { tisRatioType: "token", tokenTisRatioClipHigh: 2 } }
    )
    assertClose([values.loss, values.tisTokenClipHighRatio!], [-(Math.exp(0.5) + 2), 0.5], 1e-5)
  })

  it("sequence TIS weights the whole sequence by exp(Σ log ρ) = e: −2e", () => {
    const values = PolicyLoss.compute(
      "regular",
      {
        logProbs: [[-1, -1]],
        oldLogProbs: [[-1, -1]],
        rolloutLogProbs: [[-1.5, -1.5]],
        advantages: [[1, 1]],
        lossMask: [[1, 1]]
      },
      { ...sum, offPolicyCorrection: { tisRatioType: "sequence", sequenceTisRatioClipHigh: 5 } }
    )
    assertClose(values.loss, -2 * Math.E, 1e-5)
  })

  it("drops an outlier sequence but still counts its tokens in token_mean, as SkyRL: −(1 + 1)/4", () => {
    // sequence 1 has a token with ρ = e^5 = 148 > 100 → dropped; the denominator stays 4 tokens
    const values = PolicyLoss.compute(
      "regular",
      {
        logProbs: [
          [-1, -1],
          [-1, -1]
        ],
        oldLogProbs: [
          [-1, -1],
          [-1, -1]
        ],
        rolloutLogProbs: [
          [-1, -1],
          [-1, -6]
        ],
        advantages: [
          [1, 1],
          [2, 2]
        ],
        lossMask: [
          [1, 1],
          [1, 1]
        ]
      },
      { ...sum, lossReduction: "token_mean", offPolicyCorrection: { outlierTokenIsThresholdHigh: 100 } }
    )
    assertClose([values.loss, values.outlierSeqMaskedRatio!], [-0.5, 0.5], 1e-6)
  })

  // SkyRL test_ppo_policy_loss_with_off_policy_correction
  it("changes the PPO loss when enabled: −0.3150 with token TIS vs −0.2997 without", () => {
    const data = {
      advantages: [[1.0, -1.0, 0.5]],
      oldLogProbs: [[-1.0, -1.0, -1.0]],
      logProbs: [[-1.1, -0.9, -1.0]],
      rolloutLogProbs: [[-1.05, -1.05, -1.05]],
      lossMask: [[1, 1, 1]]
    }
    const corrected = PolicyLoss.compute("regular", data, {
      ...sum,
      offPolicyCorrection: {
        tisRatioType: "token",
        tokenTisRatioClipHigh: 2.0,
        outlierTokenIsThresholdLow: 1e-4,
        outlierTokenIsThresholdHigh: 100.0
      }
    })
    const plain = PolicyLoss.compute("regular", data, sum)
    assertClose([corrected.loss, corrected.isRatioMean!, plain.loss], [-0.3150306, 1.0512711, -0.2996664], 1e-5)
  })
})

describe("PolicyLoss gradients", () => {
  // Smooth points only (away from the clip band's edges): the analytic gradient must match central differences.
  const data = {
    logProbs: [
      [-1.7, -1.05, -0.9, -0.5],
      [-2.0, -1.3, -0.2, -1.0]
    ],
    oldLogProbs: [
      [-1.0, -1.0, -1.0, -1.0],
      [-1.5, -1.5, -0.3, -1.2]
    ],
    advantages: [
      [1.0, -1.0, 2.0, -0.5],
      [0.7, -1.2, 0.3, 0.0]
    ],
    lossMask: [
      [1, 1, 1, 1],
      [1, 1, 1, 0]
    ]
  }

  for (const name of ["regular", "dual_clip", "sapo", "dppo"] as const) {
    it(`${name}: tf.variableGrads matches finite differences (h = 1e-3)`, () => {
      const config = { ...every("sequence_mean"), clipRatioC: 1.5, deltaLow: 0.5, deltaHigh: 0.5 } as const
      const { grad } = lossAndGrad(name, data, config)
      const h = 1e-3
      const numeric = data.logProbs.map((row, b) =>
        row.map((_, t) => {
          const shifted = (d: number) =>
            PolicyLoss.compute(
              name,
              { ...data, logProbs: data.logProbs.map((r, i) => r.map((x, j) => (i === b && j === t ? x + d : x))) },
              config
            ).loss
          return (shifted(h) - shifted(-h)) / (2 * h)
        })
      )
      assertClose(grad, numeric, 2e-3, 1e-2)
    })
  }
})

describe("PolicyLoss memory", () => {
  it("leaves no tensors behind, for every loss, with and without off-policy correction", () => {
    const inputs = {
      logProbs: t2([[-1.2, -0.8, -2.0]]),
      oldLogProbs: t2([[-1.0, -1.0, -1.5]]),
      advantages: t2([[1, -2, 0.5]]),
      lossMask: t2([[1, 1, 0]]),
      rolloutLogProbs: t2([[-1.1, -0.9, -1.6]])
    }
    const correction = {
      tisRatioType: "sequence",
      sequenceMaskMetric: "geometric",
      outlierTokenIsThresholdHigh: 100,
      tokenMaskIsThresholdLow: 0.1,
      tokenMaskIsThresholdHigh: 10
    } as const
    for (const name of ["regular", "dual_clip", "gspo", "cispo", "rollout_is", "sapo", "dppo"] as const) {
      assertNoLeak(() => PolicyLoss.loss(name, inputs, every("token_mean")))
      assertNoLeak(() => PolicyLoss.loss(name, inputs, { ...every("sequence_mean"), offPolicyCorrection: correction }))
    }
    tf.dispose(Object.values(inputs))
  })
})

describe("PolicyLoss.compute", () => {
  it("names the ragged argument", () => {
    expect(() => PolicyLoss.compute("regular", { ...nemo, advantages: [[1, 2]] }, sum)).toThrow(
      /advantages must have the shape of logProbs/
    )
  })
})
