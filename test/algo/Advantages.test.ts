import { assert, describe, it } from "@effect/vitest"
import * as Advantages from "../../src/algo/Advantages.ts"
import { assertClose } from "./assertions.ts"

const ones = (b: number, t: number) => Array.from({ length: b }, () => new Array<number>(t).fill(1))
/** Outcome rewards: r on the last token of each row. */
const outcome = (scores: ReadonlyArray<number>, t: number) =>
  scores.map((s) => Array.from({ length: t }, (_, i) => (i === t - 1 ? s : 0)))

describe("Advantages.grpo", () => {
  it("normalises each sequence's summed reward by its group's mean and unbiased std", () => {
    // group "a": s = [1, 0, 1] → mean 2/3, std √((1/9 + 4/9 + 1/9)/2) = 0.57735 → Â = [0.57735, −1.15470, 0.57735]
    const { advantages, returns } = Advantages.grpo({
      tokenLevelRewards: outcome([1, 0, 1], 2),
      responseMask: ones(3, 2),
      index: ["a", "a", "a"]
    })
    assertClose(advantages, [
      [0.5773493, 0.5773493],
      [-1.1546985, -1.1546985],
      [0.5773493, 0.5773493]
    ])
    assertClose(returns, advantages)
  })

  it("gives all-equal groups zero advantage instead of dividing by zero (std 0 + ε)", () => {
    const { advantages } = Advantages.grpo({
      tokenLevelRewards: outcome([2, 2], 1),
      responseMask: ones(2, 1),
      index: [7, 7]
    })
    assertClose(advantages, [[0], [0]])
  })

  it("gives a group of one mean 0 and std 1, as SkyRL: Â = s / (1 + 1e-6)", () => {
    const { advantages } = Advantages.grpo({ tokenLevelRewards: [[3]], responseMask: [[1]], index: ["solo"] })
    assertClose(advantages, [[3 / (1 + 1e-6)]], 0, 1e-12)
  })

  it("keeps groups apart and zeroes masked positions", () => {
    // group 0: s = [1, 0] → ±0.70711 (std √0.5);  group 1: s = [5, 5] → 0;  masked gap at [0][1]
    const { advantages } = Advantages.grpo({
      tokenLevelRewards: [
        [0, 0, 1],
        [0, 0, 0],
        [5, 0, 0],
        [0, 5, 0]
      ],
      responseMask: [
        [1, 0, 1],
        [1, 1, 1],
        [1, 1, 1],
        [1, 1, 0]
      ],
      index: ["p", "p", "q", "q"]
    })
    const a = 0.5 / (Math.SQRT1_2 + 1e-6)
    assertClose(advantages, [
      [a, 0, a],
      [-a, -a, -a],
      [0, 0, 0],
      [0, 0, 0]
    ])
  })

  it("scores a sequence by its reward summed over every position, masked or not (SkyRL's token_level_rewards.sum)", () => {
    // row 0 carries its reward on a masked token: s = [1, 0] still, so Â_0 ≠ 0 where the mask is 1
    const { advantages } = Advantages.grpo({
      tokenLevelRewards: [
        [0, 1],
        [0, 0]
      ],
      responseMask: [
        [1, 0],
        [1, 1]
      ],
      index: ["a", "a"]
    })
    const a = 0.5 / (Math.SQRT1_2 + 1e-6)
    assertClose(advantages, [
      [a, 0],
      [-a, -a]
    ])
  })

  // SkyRL test_compute_grpo_outcome_advantage_norm_std_false
  it("with normByStd false (Dr. GRPO) only subtracts the group mean: [6, 3 | 9, 12] → [1.5, −1.5 | −1.5, 1.5]", () => {
    const { advantages, returns } = Advantages.compute("grpo", {
      tokenLevelRewards: [
        [1, 2, 3],
        [1, 1, 1],
        [3, 3, 3],
        [4, 4, 4]
      ],
      responseMask: ones(4, 3),
      index: [0, 0, 1, 1],
      normByStd: false
    })
    assertClose(
      advantages,
      [1.5, -1.5, -1.5, 1.5].map((a) => [a, a, a])
    )
    assertClose(returns, advantages)
  })

  // SkyRL test_compute_grpo_outcome_advantage
  it("returns advantages equal to returns, shaped like the rewards", () => {
    const { advantages, returns } = Advantages.compute("grpo", {
      tokenLevelRewards: [[1, 2, 3]],
      responseMask: [[1, 1, 1]],
      index: ["0"]
    })
    assert.deepStrictEqual(advantages, returns)
    assert.strictEqual(advantages[0]!.length, 3)
  })
})

describe("Advantages.rloo", () => {
  // SkyRL test_compute_rloo_outcome_advantage_basic
  it("centres on the leave-one-out mean: [6, 3] → [3, −3], [9, 12] → [−3, 3], a lone response → 0", () => {
    const { advantages, returns } = Advantages.rloo({
      tokenLevelRewards: outcome([6, 3, 9, 12, 1], 3),
      responseMask: ones(5, 3),
      index: [0, 0, 1, 1, 2]
    })
    assertClose(
      advantages,
      [3, -3, -3, 3, 0].map((a) => [a, a, a])
    )
    assertClose(returns, advantages)
  })

  it("equals s_i − mean of the others in a group of three: [3, 0, 0] → [3, −1.5, −1.5]", () => {
    const { advantages } = Advantages.rloo({
      tokenLevelRewards: outcome([3, 0, 0], 1),
      responseMask: ones(3, 1),
      index: [1, 1, 1]
    })
    assertClose(advantages, [[3], [-1.5], [-1.5]])
  })
})

describe("Advantages.maxrl", () => {
  // SkyRL test_compute_maxrl_advantage
  it("divides the centred score by the group mean: [6, 3] → ±1.5/(4.5 + ε), [9, 12] → ∓1.5/(10.5 + ε)", () => {
    const { advantages } = Advantages.maxrl({
      tokenLevelRewards: outcome([6, 3, 9, 12], 3),
      responseMask: ones(4, 3),
      index: [0, 0, 1, 1]
    })
    const [a, b] = [1.5 / (4.5 + 1e-6), 1.5 / (10.5 + 1e-6)]
    assertClose(
      advantages,
      [a, -a, -b, b].map((x) => [x, x, x])
    )
  })
})

describe("Advantages.reinforcePlusPlus", () => {
  // SkyRL test_compute_reinforce_plus_plus_outcome_advantage_returns_and_masking
  it("resets the return after the mask ends and zeroes masked advantages: r = [1, 2, 3], m = [1, 1, 0] → G = [3, 2, 3]", () => {
    // G_2 = 3 (then reset: m_2 = 0), G_1 = 2 + 0 = 2, G_0 = 1 + 2 = 3
    // whitened over the masked G [3, 2]: μ 2.5, var 0.5 → Â = [0.70711, −0.70711, 0]
    const { advantages, returns } = Advantages.reinforcePlusPlus(
      { tokenLevelRewards: [[1, 2, 3]], responseMask: [[1, 1, 0]] },
      { gamma: 1 }
    )
    assertClose(returns, [[3, 2, 3]])
    assertClose(advantages, [[0.5 / Math.sqrt(0.5 + 1e-8), -0.5 / Math.sqrt(0.5 + 1e-8), 0]])
  })

  // SkyRL test_compute_reinforce_plus_plus_outcome_advantage_gamma
  it("discounts with γ: r = [1, 2, 3], γ 0.5 → G = [2.75, 3.5, 3]", () => {
    const { returns } = Advantages.compute("reinforce++", {
      tokenLevelRewards: [[1, 2, 3]],
      responseMask: [[1, 1, 1]],
      index: [0],
      gamma: 0.5
    })
    assertClose(returns, [[2.75, 3.5, 3]])
  })

  it("refuses to whiten a single unmasked token (SkyRL's masked_var raises)", () => {
    assert.throws(
      () => Advantages.reinforcePlusPlus({ tokenLevelRewards: [[1, 2]], responseMask: [[1, 0]] }, { gamma: 1 }),
      /single unmasked token/
    )
  })
})

describe("Advantages.gae", () => {
  // SkyRL advantage_test_data: r = [1, 2, 3], V = [0.5, 1, 1.5]
  const input = (mask: number[][]) => ({ tokenLevelRewards: [[1, 2, 3]], values: [[0.5, 1, 1.5]], responseMask: mask })

  it("with γ = λ = 1 has returns equal to the reward-to-go: [6, 5, 3]", () => {
    const { advantages, returns } = Advantages.gae(input([[1, 1, 1]]), { gamma: 1, lambd: 1 })
    assertClose(returns, [[6, 5, 3]])
    // raw Â = [5.5, 4, 1.5] → μ 11/3, unbiased var 4.0833 → whitened, not all zero
    assert.isTrue(advantages[0]!.some((a) => Math.abs(a) > 0.1))
  })

  // SkyRL test_compute_gae_advantage_return_with_masking
  it("whitens over the masked tokens only but leaves masked positions un-zeroed: [0.7071, 0.1768, −0.7071]", () => {
    // raw Â = [5.5, 4, 1.5]; masked μ = 3.5, var = 4 · 2/1 = 8 → (Â − 3.5)/√8
    const { advantages, returns } = Advantages.gae(input([[1, 0, 1]]), { gamma: 1, lambd: 1 })
    assertClose(returns, [[6, 5, 3]])
    assertClose(advantages, [[2 / Math.sqrt(8), 0.5 / Math.sqrt(8), -2 / Math.sqrt(8)]], 1e-6)
  })

  // SkyRL test_compute_gae_advantage_return_gamma / _lam
  it("discounts with γ and λ: γ 0.5 → returns [2.75, 3.5, 3]; λ 0.5 → returns [3.625, 4.25, 3]", () => {
    assertClose(Advantages.gae(input([[1, 1, 1]]), { gamma: 0.5, lambd: 1 }).returns, [[2.75, 3.5, 3]])
    assertClose(Advantages.gae(input([[1, 1, 1]]), { gamma: 1, lambd: 0.5 }).returns, [[3.625, 4.25, 3]])
  })

  it("is refused by compute without values", () => {
    assert.throws(
      () => Advantages.compute("gae", { tokenLevelRewards: [[1]], responseMask: [[1]], index: [0] }),
      /needs values/
    )
  })
})

describe("Advantages.advantageBatchNormalize", () => {
  it("centres on the mean of all entries and scales by the masked std, as SkyRL's trainer", () => {
    // μ = (1 + 1 + 0 − 1 + 0 + 0)/6 = 1/6;  σ² = ((5/6)² · 2 + (7/6)²)/3 = 0.91667 → Â' = (Â − 1/6)/0.95743
    const out = Advantages.advantageBatchNormalize(
      [
        [1, 1, 0],
        [-1, 0, 0]
      ],
      [
        [1, 1, 0],
        [1, 0, 0]
      ]
    )
    assertClose(out, [
      [0.8703883, 0.8703883, -0.1740777],
      [-1.2185436, -0.1740777, -0.1740777]
    ])
  })

  it("leaves all-equal advantages at 0 without dividing by zero (σ² floored at 1e-8)", () => {
    assertClose(Advantages.advantageBatchNormalize([[2, 2]], [[1, 1]]), [[0, 0]])
  })
})

describe("Advantages input checks", () => {
  it("rejects an index that does not match the batch, and ragged masks", () => {
    assert.throws(
      () => Advantages.grpo({ tokenLevelRewards: [[1], [2]], responseMask: [[1], [1]], index: [0] }),
      /index/
    )
    assert.throws(
      () => Advantages.rloo({ tokenLevelRewards: [[1, 2]], responseMask: [[1]], index: [0] }),
      /responseMask/
    )
  })
})
