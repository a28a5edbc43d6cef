// Cross-check against SkyRL itself: skyrl-golden.json holds outputs of SkyRL's own `ppo_utils.py` /
// `off_policy_correction_utils.py` (NovaSky-AI/SkyRL a9564572, torch float32) on seeded random inputs: every
// policy loss × loss reduction × off-policy correction with the gradient w.r.t. log π_θ from torch autograd,
// the advantage estimators (float64), the KL estimators and the critic loss. Regenerate with skyrl-golden.py.
// SkyRL reduces by `apply_loss_reduction_to_advantages_minibatch` and then the loss's masked sum; we reduce
// after the per-token loss, so agreement also shows the two are the same.
import { readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import * as Advantages from "../../src/algo/Advantages.ts"
import * as Kl from "../../src/algo/Kl.ts"
import type * as OffPolicyCorrection from "../../src/algo/OffPolicyCorrection.ts"
import * as PolicyLoss from "../../src/algo/PolicyLoss.ts"
import type * as Reduction from "../../src/algo/Reduction.ts"
import * as ValueLoss from "../../src/algo/ValueLoss.ts"
import { assertClose, t2 } from "./assertions.ts"

type Rows = Array<Array<number>>

/** One case's SkyRL `AlgorithmConfig`, camelCased and flat, as skyrl-golden.py writes it: every loss's options. */
interface GoldenConfig {
  readonly epsClipLow: number
  readonly epsClipHigh: number
  readonly clipRatioC: number
  readonly lossReduction: Reduction.Reduction
  readonly maxSeqLen: number
  readonly cispoEpsClipLow: number
  readonly cispoEpsClipHigh: number
  readonly cispoAnchor: "old" | "rollout"
  readonly sapoTauPos: number
  readonly sapoTauNeg: number
  readonly dppoType: "binary_tv" | "binary_kl"
  readonly dppoDeltaLow: number
  readonly dppoDeltaHigh: number
  readonly offPolicyCorrection: OffPolicyCorrection.Config
}

/** The options of every loss from a golden config (each loss reads its own). */
const optionsOf = (c: GoldenConfig) => ({
  ...c,
  tauPos: c.sapoTauPos,
  tauNeg: c.sapoTauNeg,
  deltaLow: c.dppoDeltaLow,
  deltaHigh: c.dppoDeltaHigh
})

interface Golden {
  readonly inputs: ReadonlyArray<{
    logProbs: Rows
    oldLogProbs: Rows
    rolloutLogProbs: Rows
    advantages: Rows
    lossMask: Rows
  }>
  readonly losses: ReadonlyArray<{
    set: number
    name: PolicyLoss.Name
    config: GoldenConfig
    loss: number
    grad: Rows
    metrics: Record<string, number>
  }>
  readonly advantages: ReadonlyArray<{
    tokenLevelRewards: Rows
    responseMask: Rows
    index: Array<string | number>
    values: Rows
    expected: Record<string, { advantages: Rows; returns: Rows }>
  }>
  readonly kl: { logProbs: Rows; refLogProbs: Rows; mask: Rows; expected: Record<Kl.Estimator, Rows> }
  readonly critic: ReadonlyArray<{
    values: Rows
    oldValues: Rows
    returns: Rows
    lossMask: Rows
    valueClip: number | null
    loss: number
    grad: Rows
    clipfrac: number | null
  }>
}

const golden: Golden = JSON.parse(readFileSync(new URL("./skyrl-golden.json", import.meta.url), "utf8"))

/** Registers the cross-checks on whichever tfjs backend the calling test file selected. */
export const describeAgainstSkyrl = (backend: string): void => {
  describe(`PolicyLoss against SkyRL (${backend})`, () => {
    it(`matches loss, gradient and every metric on ${golden.losses.length} cases`, () => {
      const before = tf.memory().numTensors
      for (const c of golden.losses) {
        assert.strictEqual(tf.getBackend(), backend)
        const label = `${c.name} ${JSON.stringify(c.config)}`
        const data = golden.inputs[c.set]!
        const initial = t2(data.logProbs)
        const logProbs = tf.variable(initial)
        const [oldLogProbs, advantages, lossMask, rolloutLogProbs] = [
          data.oldLogProbs,
          data.advantages,
          data.lossMask,
          data.rolloutLogProbs
        ].map(t2) as [tf.Tensor2D, tf.Tensor2D, tf.Tensor2D, tf.Tensor2D]
        let metrics: Record<string, number> = {}
        const { value, grads } = tf.variableGrads(() => {
          const out = PolicyLoss.loss(
            c.name,
            { logProbs, oldLogProbs, advantages, lossMask, rolloutLogProbs },
            optionsOf(c.config)
          )
          metrics = Object.fromEntries(Object.entries(out.metrics).map(([k, v]) => [k, v.dataSync()[0]!]))
          return out.loss
        }, [logProbs])
        assertClose(value.dataSync()[0]!, c.loss, 1e-5, 1e-4, `${label} loss`)
        assertClose(grads[logProbs.name]!.arraySync() as Rows, c.grad, 1e-5, 1e-4, `${label} grad`)
        for (const [key, expected] of Object.entries(c.metrics)) {
          assert.property(metrics, key, `${label}: metric ${key}`)
          assertClose(metrics[key]!, expected, 1e-5, 1e-4, `${label} ${key}`)
        }
        tf.dispose([value, grads, initial, logProbs, oldLogProbs, advantages, lossMask, rolloutLogProbs])
      }
      assert.strictEqual(tf.memory().numTensors, before)
    })
  })

  describe(`Advantages against SkyRL (${backend})`, () => {
    it("matches grpo, Dr. GRPO, rloo, maxrl, reinforce++ (γ 0.9) and gae (γ 0.95, λ 0.9)", () => {
      for (const c of golden.advantages) {
        const input = { tokenLevelRewards: c.tokenLevelRewards, responseMask: c.responseMask, index: c.index }
        const got: Record<string, Advantages.Result> = {
          grpo: Advantages.compute("grpo", input),
          drgrpo: Advantages.compute("grpo", { ...input, normByStd: false }),
          rloo: Advantages.compute("rloo", input),
          maxrl: Advantages.compute("maxrl", input),
          "reinforce++": Advantages.compute("reinforce++", { ...input, gamma: 0.9 }),
          gae: Advantages.compute("gae", { ...input, values: c.values, gamma: 0.95, lambd: 0.9 })
        }
        for (const [name, expected] of Object.entries(c.expected)) {
          assertClose(got[name]!.advantages, expected.advantages, 1e-6, 1e-6, `${name} advantages`)
          assertClose(got[name]!.returns, expected.returns, 1e-6, 1e-6, `${name} returns`)
        }
      }
    })
  })

  describe(`Kl.estimate against SkyRL (${backend})`, () => {
    it("matches k1, k2, k3 (with its clamps) and abs under a mask", () => {
      const { logProbs, refLogProbs, mask, expected } = golden.kl
      for (const estimator of ["k1", "k2", "k3", "abs"] as const) {
        assertClose(Kl.estimate(estimator, logProbs, refLogProbs, mask), expected[estimator], 1e-5, 1e-5, estimator)
      }
    })
  })

  describe(`ValueLoss.ppo against SkyRL (${backend})`, () => {
    it("matches the clipped and unclipped critic loss, its gradient and values_clipfrac", () => {
      for (const c of golden.critic) {
        const initial = t2(c.values)
        const values = tf.variable(initial)
        const [oldValues, returns, lossMask] = [c.oldValues, c.returns, c.lossMask].map(t2) as [
          tf.Tensor2D,
          tf.Tensor2D,
          tf.Tensor2D
        ]
        let clipfrac: number | undefined
        const { value, grads } = tf.variableGrads(() => {
          const out = ValueLoss.ppo({ values, oldValues, returns, lossMask }, c.valueClip)
          clipfrac = out.metrics.valuesClipfrac?.dataSync()[0]
          return out.loss
        }, [values])
        assertClose(value.dataSync()[0]!, c.loss, 1e-5, 1e-4, `clip ${c.valueClip} loss`)
        assertClose(grads[values.name]!.arraySync() as Rows, c.grad, 1e-5, 1e-4, `clip ${c.valueClip} grad`)
        if (c.clipfrac === null) assert.isUndefined(clipfrac)
        else assertClose(clipfrac!, c.clipfrac, 1e-6)
        tf.dispose([value, grads, initial, values, oldValues, returns, lossMask])
      }
    })
  })
}
