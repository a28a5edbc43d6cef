import { describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import * as Entropy from "../../src/algo/Entropy.ts"
import { assertClose, assertNoLeak, assertTensorClose, t2 } from "./assertions.ts"

describe("Entropy.fromLogits", () => {
  it("is ln V for uniform logits, ~0 for a peaked one, and −Σ p ln p in between", () => {
    // uniform over 4: ln 4 = 1.386294;  [100, 0, 0, 0]: ≈ 0;  p = [1/4, 3/4, 0⁺, 0⁺] from [0, ln 3, −50, −50]:
    // −(¼ ln ¼ + ¾ ln ¾) = 0.562335
    const logits = tf.tensor3d([
      [
        [1, 1, 1, 1],
        [100, 0, 0, 0],
        [0, Math.log(3), -50, -50]
      ]
    ])
    assertTensorClose(Entropy.fromLogits(logits), [[Math.log(4), 0, 0.562335]], 1e-5)
    logits.dispose()
  })

  it("equals −Σ softmax · logSoftmax on random logits, without underflow at large magnitudes", () => {
    const logits = tf.randomNormal([2, 3, 7], 0, 30, "float32", 1) as tf.Tensor3D
    const direct = tf.tidy(() => tf.neg(tf.sum(tf.mul(tf.softmax(logits), tf.logSoftmax(logits)), -1)))
    assertClose(Entropy.fromLogits(logits).arraySync(), direct.arraySync() as number[][], 1e-4, 1e-4)
    tf.dispose([logits, direct])
  })
})

describe("Entropy.maskedMean", () => {
  it("averages over loss tokens only: mean(ln 4, ln 2) with the third token masked", () => {
    const logits = tf.tensor3d([
      [
        [0, 0, 0, 0],
        [0, 0, -1e9, -1e9],
        [5, 0, 0, 0]
      ]
    ])
    assertTensorClose(Entropy.maskedMean(logits, t2([[1, 1, 0]])), (Math.log(4) + Math.log(2)) / 2, 1e-5)
    logits.dispose()
  })

  it("is differentiable (∂H/∂z = −p(z − E_p z)) and leaves no tensors behind", () => {
    // z = [0, ln 3]: p = [¼, ¾], E_p z = ¾ ln 3 → ∂H/∂z = [−¼(0 − ¾ln3), −¾(ln3 − ¾ln3)] = [0.205986, −0.205986]
    const z = tf.variable(tf.tensor3d([[[0, Math.log(3)]]]))
    const mask = t2([[1]])
    const { value, grads } = tf.variableGrads(() => Entropy.maskedMean(z, mask), [z])
    assertClose(grads[z.name]!.arraySync() as number[][][], [[[0.205986, -0.205986]]], 1e-5)
    tf.dispose([value, grads])
    assertNoLeak(() => [Entropy.fromLogits(z), Entropy.maskedMean(z, mask)])
    tf.dispose([z, mask])
  })
})
