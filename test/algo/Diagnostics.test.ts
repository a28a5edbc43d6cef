import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import * as Diagnostics from "../../src/algo/Diagnostics.ts"
import * as PolicyLoss from "../../src/algo/PolicyLoss.ts"
import { assertClose, t2 } from "./assertions.ts"

describe("Diagnostics.variableGrads", () => {
  it("returns the gradient together with the loss's metrics, which tf.variableGrads alone would dispose", async () => {
    // ρ = [2, 1]: token 0 clipped (Â = 1 → −1.2, zero gradient), token 1 inside (−1·1); token_mean over 2
    const before = tf.memory().numTensors
    const initial = t2([[Math.log(2), 0]])
    const logProbs = tf.variable(initial)
    const [oldLogProbs, advantages, lossMask] = [t2([[0, 0]]), t2([[1, 1]]), t2([[1, 1]])]
    const result = Diagnostics.variableGrads(
      () =>
        PolicyLoss.regular(
          { logProbs, oldLogProbs, advantages, lossMask },
          { epsClipLow: 0.2, epsClipHigh: 0.2, lossReduction: "token_mean" }
        ),
      [logProbs]
    )
    assertClose(result.value.dataSync()[0]!, (-1.2 - 1) / 2, 1e-6)
    assertClose(result.grads[logProbs.name]!.arraySync() as number[][], [[0, -0.5]], 1e-6)
    const metrics = await Diagnostics.read(result.metrics)
    assertClose([metrics.clipRatio, metrics.approxKl], [0.5, (1 - Math.log(2)) / 2], 1e-6)
    // read() freed the metrics; the rest is the caller's
    result.value.dispose()
    tf.dispose(result.grads)
    tf.dispose([initial, logProbs, oldLogProbs, advantages, lossMask])
    assert.strictEqual(tf.memory().numTensors, before)
  })

  it("dispose() frees value, gradients and metrics together", () => {
    const initial = t2([[0.1, -0.2]])
    const logProbs = tf.variable(initial)
    const inputs = { logProbs, oldLogProbs: t2([[0, 0]]), advantages: t2([[1, -1]]), lossMask: t2([[1, 1]]) }
    const before = tf.memory().numTensors
    const options = { lossReduction: "token_mean", cispoEpsClipLow: 1, cispoEpsClipHigh: 4 } as const
    const result = Diagnostics.variableGrads(() => PolicyLoss.loss("cispo", inputs, options), [logProbs])
    Diagnostics.dispose(result)
    assert.strictEqual(tf.memory().numTensors, before)
    tf.dispose([initial, ...Object.values(inputs)])
  })
})
