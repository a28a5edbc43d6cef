import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import * as StalenessManager from "../../src/pipeline/StalenessManager.ts"

const { admit, accept, abandon, step, canAdmit, capacity } = StalenessManager
const repeat = (n: number, f: (s: StalenessManager.State) => StalenessManager.State) => (s: StalenessManager.State) =>
  Array.from({ length: n }).reduce<StalenessManager.State>((x) => f(x), s)

describe("StalenessManager (pure state)", () => {
  it("admits (S + t + 1)·B groups before the first step: B = 2, S = 1 → 4", () => {
    let s = StalenessManager.initial({ batchSize: 2, maxStaleness: 1 })
    assert.strictEqual(capacity(s), 4) // (1 + 0 + 1) · 2
    s = repeat(4, admit)(s)
    assert.deepInclude(s, { running: 4, accepted: 0 })
    assert.isFalse(canAdmit(s)) // 0 + 4 < 4 is false
    s = repeat(2, accept)(s) // finishing generation frees nothing: accepted + running stays 4
    assert.deepInclude(s, { running: 2, accepted: 2 })
    assert.isFalse(canAdmit(s))
  })

  it("each training step admits B more: after step 1 capacity is 6, after step 2 it is 8", () => {
    let s = repeat(4, admit)(StalenessManager.initial({ batchSize: 2, maxStaleness: 1 }))
    s = repeat(2, accept)(s)
    s = step(s) // trains groups 0, 1
    assert.deepInclude(s, { trainerStep: 1, consumed: 2 })
    assert.strictEqual(capacity(s), 6)
    s = repeat(2, admit)(s)
    assert.isFalse(canAdmit(s)) // accepted 2 + running 4 = 6
    s = repeat(4, accept)(s)
    s = step(step(s))
    assert.deepInclude(s, { trainerStep: 3, accepted: 6, running: 0, consumed: 6 })
    assert.strictEqual(capacity(s), 10) // (1 + 3 + 1) · 2
  })

  it("with S = 0 admits exactly one batch per step: generation and training alternate", () => {
    let s = StalenessManager.initial({ batchSize: 3, maxStaleness: 0 })
    s = repeat(3, admit)(s)
    assert.isFalse(canAdmit(s))
    s = step(repeat(3, accept)(s))
    assert.isTrue(canAdmit(s))
    assert.strictEqual(capacity(s), 6)
  })

  it("an abandoned group frees its slot", () => {
    let s = repeat(2, admit)(StalenessManager.initial({ batchSize: 1, maxStaleness: 1 }))
    assert.isFalse(canAdmit(s))
    s = abandon(s)
    assert.isTrue(canAdmit(s))
    assert.deepInclude(s, { running: 1, accepted: 0 })
  })

  it("a resumed run counts the steps before it and its restored in-flight groups as accepted", () => {
    // step 5 done, B = 4, S = 2, 3 groups generated but untrained in the checkpoint
    const s = StalenessManager.initial({ batchSize: 4, maxStaleness: 2, trainerStep: 5, accepted: 23 })
    assert.deepInclude(s, { consumed: 20, accepted: 23, running: 0 })
    assert.strictEqual(capacity(s), 32) // (2 + 5 + 1) · 4: 9 more may start
    assert.isTrue(canAdmit(repeat(8, admit)(s)))
    assert.isFalse(canAdmit(repeat(9, admit)(s)))
  })

  it("breaking the invariant is a defect", () => {
    const s = StalenessManager.initial({ batchSize: 1, maxStaleness: 0 })
    assert.throws(() => admit(admit(s)), /admission past capacity 1/)
    assert.throws(() => accept(s), /accept with no group running/)
    assert.throws(() => step(admit(s)), /needs 1 accepted unconsumed/)
  })
})

describe("StalenessManager.make", () => {
  it.effect("admit suspends at capacity and resumes when the trainer steps", () =>
    Effect.gen(function* () {
      const manager = yield* StalenessManager.make(StalenessManager.initial({ batchSize: 2, maxStaleness: 0 }))
      yield* manager.admit
      yield* manager.admit
      const third = yield* Effect.forkChild(manager.admit)
      yield* Effect.yieldNow
      yield* Effect.yieldNow
      assert.isUndefined(third.pollUnsafe(), "the third group must wait for step 1")
      yield* manager.accept
      yield* manager.accept
      yield* Effect.yieldNow
      assert.isUndefined(third.pollUnsafe(), "accepting does not free capacity")
      yield* manager.step
      yield* Fiber.join(third)
      assert.deepInclude(yield* manager.state, { trainerStep: 1, running: 1, accepted: 2, consumed: 2 })
    })
  )

  it.effect("withAdmission accepts on success and frees the slot on failure", () =>
    Effect.gen(function* () {
      const manager = yield* StalenessManager.make(StalenessManager.initial({ batchSize: 1, maxStaleness: 1 }))
      const value = yield* manager.withAdmission(Effect.succeed(7))
      assert.strictEqual(value, 7)
      const failed = yield* manager.withAdmission(Effect.fail("tool server gone")).pipe(Effect.flip)
      assert.strictEqual(failed, "tool server gone")
      assert.deepInclude(yield* manager.state, { accepted: 1, running: 0 })
    })
  )

  it.effect("an interrupted waiter takes no slot", () =>
    Effect.gen(function* () {
      const manager = yield* StalenessManager.make(StalenessManager.initial({ batchSize: 1, maxStaleness: 0 }))
      yield* manager.admit
      const waiting = yield* Effect.forkChild(manager.withAdmission(Effect.never))
      yield* Effect.yieldNow
      yield* Fiber.interrupt(waiting)
      yield* manager.accept
      yield* manager.step
      assert.deepInclude(yield* manager.state, { running: 0, accepted: 1, trainerStep: 1 })
    })
  )
})
