import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { TestClock, TestConsole } from "effect/testing"
import * as Metrics from "../../src/metrics/Metrics.ts"

describe("the progress line", () => {
  it("paces the ETA by the training steps' own times, not by the evaluation or start-up before them", () => {
    // 130 s elapsed at step 1 of 40 (a 120 s evaluation ran first), each step 2.5 s: 39 steps left → 1:38
    const line = Metrics.progressLine({ step: 1, totalSteps: 40, values: { "timing/step": 2.5 } }, 130, 2.5)
    assert.include(line, "ETA 1:38 (39 steps left)")
    assert.include(line, "2:10 elapsed")
    // without step times: elapsed over steps done
    assert.include(Metrics.progressLine({ step: 10, totalSteps: 20, values: {} }, 100), "ETA 1:40 (10 steps left)")
  })

  it("counts down to the time budget when it ends the run before the last step", () => {
    // step 180 of 240 at 2.2 s a step, 12 s of trainer.max_train_seconds left: the loop stops after the step during
    // which the budget passes, ⌈12 / 2.2⌉ = 6 steps on → 13.2 s, not the 60 steps' 132 s
    const line = Metrics.progressLine({ step: 180, totalSteps: 240, values: {} }, 453, 2.2, 12)
    assert.include(line, "ETA 0:13 (time budget)")
  })

  it("shows no ETA before a step was timed", () => {
    assert.include(Metrics.progressLine({ step: 0, totalSteps: 20, values: {} }, 5, undefined, 60), "ETA -")
  })
})

describe("Metrics.eta", () => {
  it("is the steps left at the steps' pace when the time budget would allow more", () => {
    // 20 steps left × 3 s = 60 s; 100 s of budget would allow ⌈100 / 3⌉ = 34 steps
    assert.deepStrictEqual(Metrics.eta(20, 3, 100), { seconds: 60, limit: "steps", steps: 20 })
    // no budget at all
    assert.deepStrictEqual(Metrics.eta(20, 3), { seconds: 60, limit: "steps", steps: 20 })
  })

  it("is the steps the time budget leaves when it ends the run first, its last step finished", () => {
    // 60 steps left × 2 s = 120 s, but 45 s of budget: ⌈45 / 2⌉ = 23 steps (the 23rd passes the budget) → 46 s
    assert.deepStrictEqual(Metrics.eta(60, 2, 45), { seconds: 46, limit: "time budget", steps: 23 })
    // a budget that ends on a step's end: 44 s → 22 steps, 44 s
    assert.deepStrictEqual(Metrics.eta(60, 2, 44), { seconds: 44, limit: "time budget", steps: 22 })
  })

  it("is zero once the budget has passed: the step just trained is the last", () => {
    assert.deepStrictEqual(Metrics.eta(60, 2, -3), { seconds: 0, limit: "time budget", steps: 0 })
  })
})

describe("Metrics.progress", () => {
  it.effect("counts the budget left from the loop's deadline on the run's clock", () =>
    Effect.gen(function* () {
      const metrics = yield* Metrics.make(mkdtempSync(join(tmpdir(), "effect-rl-progress-")), { progress: true })
      // the clock at 0 s, the deadline at 12 s, steps of 2.2 s: ⌈12 / 2.2⌉ = 6 steps → 13.2 s
      const p = { step: 180, totalSteps: 240, values: { "timing/step": 2.2 }, deadline: 12_000 }
      yield* metrics.progress(p)
      // 6 s later, the next step: ⌈6 / 2.2⌉ = 3 steps → 6.6 s
      yield* TestClock.adjust("6 seconds")
      yield* metrics.progress({ ...p, step: 181 })
      // without a budget: the 58 steps left → 127.6 s
      const { deadline: _, ...unbounded } = p
      yield* metrics.progress({ ...unbounded, step: 182 })
      const lines = (yield* TestConsole.errorLines).map(String)
      assert.include(lines[0], "ETA 0:13 (time budget)")
      assert.include(lines[1], "ETA 0:07 (time budget)")
      assert.include(lines[2], "ETA 2:08 (58 steps left)")
    }).pipe(Effect.provide(Layer.merge(NodeServices.layer, TestConsole.layer)))
  )
})
