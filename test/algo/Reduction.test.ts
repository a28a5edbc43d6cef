import { assert, describe, it } from "@effect/vitest"
import * as Reduction from "../../src/algo/Reduction.ts"
import { assertNoLeak, assertTensorClose, t2 } from "./assertions.ts"

describe("Reduction.maskedMean", () => {
  it("averages only the unmasked entries", () => {
    // (1 + 2 + 4) / 3 = 7/3
    assertTensorClose(
      Reduction.maskedMean(
        t2([
          [1, 2, 3],
          [4, 5, 6]
        ]),
        t2([
          [1, 1, 0],
          [1, 0, 0]
        ])
      ),
      7 / 3
    )
  })

  it("gives 0, not NaN, when everything is masked (SkyRL clamps the count to 1)", () => {
    assertTensorClose(Reduction.maskedMean(t2([[1, 2]]), t2([[0, 0]])), 0)
  })
})

describe("Reduction.maskedRowMean", () => {
  it("averages each sequence over its own unmasked tokens, as a column", () => {
    // row 0: (1 + 2) / 2 = 1.5;  row 1: all masked → 0 / max(0, 1) = 0
    assertTensorClose(
      Reduction.maskedRowMean(
        t2([
          [1, 2, 9],
          [4, 5, 6]
        ]),
        t2([
          [1, 1, 0],
          [0, 0, 0]
        ])
      ),
      [[1.5], [0]]
    )
  })
})

describe("Reduction.reduceLoss", () => {
  // ℓ = [[1, 2, 3], [4, 5, 6]], m = [[1, 1, 0], [1, 1, 1]]: kept tokens 1, 2 | 4, 5, 6
  const loss = () =>
    t2([
      [1, 2, 3],
      [4, 5, 6]
    ])
  const mask = () =>
    t2([
      [1, 1, 0],
      [1, 1, 1]
    ])

  it("token_mean divides the masked sum by the token count of the batch", () => {
    // (1 + 2 + 4 + 5 + 6) / 5 = 3.6
    assertTensorClose(Reduction.reduceLoss(loss(), mask(), "token_mean"), 3.6)
  })

  it("sequence_mean averages per-sequence token means", () => {
    // ((1 + 2)/2 + (4 + 5 + 6)/3) / 2 = (1.5 + 5) / 2 = 3.25
    assertTensorClose(Reduction.reduceLoss(loss(), mask(), "sequence_mean"), 3.25)
  })

  it("seq_mean_token_sum_norm divides each sequence's token sum by maxSeqLen (Dr. GRPO)", () => {
    // ((1 + 2)/10 + (4 + 5 + 6)/10) / 2 = (0.3 + 1.5) / 2 = 0.9
    assertTensorClose(Reduction.reduceLoss(loss(), mask(), "seq_mean_token_sum_norm", 10), 0.9)
  })

  it("sum is SkyRL's reduce_loss: the plain masked sum", () => {
    // SkyRL test_reduce_loss: mask [[1,1,1],[1,0,0]] → 1 + 2 + 3 + 4 = 10
    assertTensorClose(
      Reduction.reduceLoss(
        loss(),
        t2([
          [1, 1, 1],
          [1, 0, 0]
        ]),
        "sum"
      ),
      10
    )
  })

  it("counts tokens on countMask, so tokens dropped after counting still dilute the mean", () => {
    // lossMask drops sequence 1 (off-policy correction); countMask is the original all-ones mask
    // token_mean = (1 + 2 + 3) / 6 = 1;  sequence_mean = ((1 + 2 + 3)/3 + 0/3) / 2 = 1
    const ones = t2([
      [1, 1, 1],
      [1, 1, 1]
    ])
    const dropped = t2([
      [1, 1, 1],
      [0, 0, 0]
    ])
    assertTensorClose(Reduction.reduceLoss(loss(), dropped, "token_mean", undefined, ones), 1)
    assertTensorClose(Reduction.reduceLoss(loss(), dropped, "sequence_mean", undefined, ones), 1)
  })

  it("refuses seq_mean_token_sum_norm without a maxSeqLen", () => {
    assert.throws(() => Reduction.reduceLoss(loss(), mask(), "seq_mean_token_sum_norm"), /maxSeqLen/)
  })

  it("leaves no tensors behind", () => {
    const [l, m] = [loss(), mask()]
    for (const reduction of ["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "sum"] as const) {
      assertNoLeak(() => Reduction.reduceLoss(l, m, reduction, 4))
      assertNoLeak(() => Reduction.scaleAdvantages(l, m, reduction === "sum" ? "token_mean" : reduction, 4))
    }
    assertNoLeak(() => [Reduction.maskedMean(l, m), Reduction.maskedSum(l, m), Reduction.maskedRowMean(l, m)])
    l.dispose()
    m.dispose()
  })
})

// SkyRL tests/backends/skyrl_train/utils/test_ppo_utils.py::TestApplyLossReductionToAdvantagesMinibatch:
// scale the advantages once, then reduce with a plain masked sum.
describe("Reduction.scaleAdvantages", () => {
  const scaledSum = (adv: number[][], mask: number[][], reduction: Reduction.LossReduction, maxSeqLen: number) => {
    const m = t2(mask)
    return Reduction.reduceLoss(Reduction.scaleAdvantages(t2(adv), m, reduction, maxSeqLen), m, "sum")
  }

  it("token_mean: valid tokens 1 + 2 + 4 + 5 + 6 = 18 over 5 → 3.6", () => {
    assertTensorClose(
      scaledSum(
        [
          [1, 2, 3],
          [4, 5, 6]
        ],
        [
          [1, 1, 0],
          [1, 1, 1]
        ],
        "token_mean",
        3
      ),
      3.6
    )
  })

  it("token_mean with an all-zero mask gives 0, not NaN", () => {
    assertTensorClose(scaledSum([[1, 2]], [[0, 0]], "token_mean", 2), 0)
  })

  it("sequence_mean: (1.5 + 3.0) / 2 = 2.25", () => {
    assertTensorClose(
      scaledSum(
        [
          [1, 2],
          [3, 4]
        ],
        [
          [1, 1],
          [1, 0]
        ],
        "sequence_mean",
        2
      ),
      2.25
    )
  })

  it("seq_mean_token_sum_norm: ((2 + 3)/10 + 9/10) / 2 = 0.7", () => {
    assertTensorClose(
      scaledSum(
        [
          [2, 3],
          [9, 12]
        ],
        [
          [1, 1],
          [1, 0]
        ],
        "seq_mean_token_sum_norm",
        10
      ),
      0.7
    )
  })
})
