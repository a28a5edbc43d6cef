import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import * as ValueLoss from "../../src/algo/ValueLoss.ts"
import { assertClose, assertNoLeak, t2 } from "./assertions.ts"

const inputs = () => ({
  // token 0: V moved 1.0 from V_old = 0 towards R = 2 → V^clip = 0.2: max((0.2 − 2)², (1 − 2)²) = 3.24, clipped
  // token 1: V moved 0.1 → inside the band: (0.1 − 0.5)² = 0.16;  token 2 masked
  values: t2([[1.0, 0.1, 9]]),
  oldValues: t2([[0, 0, 0]]),
  returns: t2([[2, 0.5, 0]]),
  lossMask: t2([[1, 1, 0]])
})

describe("ValueLoss.ppo", () => {
  it("takes the larger of the clipped and unclipped squared errors: ½·(3.24 + 0.16)/2 = 0.85", () => {
    const out = ValueLoss.ppo(inputs(), 0.2)
    assertClose([out.loss.dataSync()[0]!, out.metrics.valuesClipfrac!.dataSync()[0]!], [0.85, 0.5], 1e-6)
    assertClose(out.metrics.valuesMean.dataSync()[0]!, 0.55, 1e-6)
  })

  it("without a clip is ½ · masked mean of (V − R)²: ½·(1 + 0.16)/2 = 0.29, and reports no clipfrac", () => {
    const out = ValueLoss.ppo(inputs(), null)
    assertClose(out.loss.dataSync()[0]!, 0.29, 1e-6)
    assert.isUndefined(out.metrics.valuesClipfrac)
  })

  it("gives a clipped token no gradient: ∂L/∂V = [0, ½·2(0.1 − 0.5)/2, 0] = [0, −0.2, 0]", () => {
    const { values, ...rest } = inputs()
    const v = tf.variable(values)
    const { value, grads } = tf.variableGrads(() => ValueLoss.ppo({ values: v, ...rest }, 0.2).loss, [v])
    assertClose(grads[v.name]!.arraySync() as number[][], [[0, -0.2, 0]], 1e-6)
    tf.dispose([value, grads, v, values, ...Object.values(rest)])
  })

  it("leaves no tensors behind", () => {
    const data = inputs()
    assertNoLeak(() => ValueLoss.ppo(data, 0.2))
    assertNoLeak(() => ValueLoss.ppo(data, null))
    tf.dispose(Object.values(data))
  })
})
