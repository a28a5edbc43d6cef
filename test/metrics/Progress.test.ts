import { assert, describe, it } from "@effect/vitest"
import * as Metrics from "../../src/metrics/Metrics.ts"

describe("the progress line", () => {
  it("paces the ETA by the training steps' own times, not by the evaluation or start-up before them", () => {
    // 130 s elapsed at step 1 of 40 (a 120 s evaluation ran first), each step 2.5 s: 39 steps left → 1:38
    const line = Metrics.progressLine({ step: 1, totalSteps: 40, values: { "timing/step": 2.5 } }, 130, 2.5)
    assert.include(line, "ETA 1:38")
    assert.include(line, "2:10 elapsed")
    // without step times: elapsed over steps done
    assert.include(Metrics.progressLine({ step: 10, totalSteps: 20, values: {} }, 100), "ETA 1:40")
  })
})
