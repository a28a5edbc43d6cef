/** A runner's slots: at most `capacity` groups at once, the lowest waiting cursor first, no slot lost to interruption. */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import * as RunnerHost from "../../src/cluster/RunnerHost.ts"

describe("RunnerHost.makeSlots", () => {
  it.effect("hands a freed slot to the lowest waiting cursor, and an interrupted waiter gives its turn up", () =>
    Effect.gen(function* () {
      const slots = RunnerHost.makeSlots(1)
      const order: Array<number> = []
      const hold = yield* Deferred.make<void>()
      const first = yield* Effect.forkChild(slots.withSlot(7, Deferred.await(hold)))
      yield* Effect.yieldNow
      const waiters = yield* Effect.forEach([5, 2, 9, 3], (cursor) =>
        Effect.forkChild(
          slots.withSlot(
            cursor,
            Effect.sync(() => order.push(cursor))
          )
        )
      )
      yield* Effect.yieldNow
      yield* Fiber.interrupt(waiters[3]!) // cursor 3 stops waiting
      yield* Deferred.succeed(hold, undefined)
      yield* Fiber.join(first)
      yield* Effect.forEach(waiters.slice(0, 3), Fiber.join)
      assert.deepStrictEqual(order, [2, 5, 9])
      // all slots are free again: two at once now finish without waiting on each other
      const both = RunnerHost.makeSlots(2)
      const gate = yield* Deferred.make<void>()
      const a = yield* Effect.forkChild(both.withSlot(1, Deferred.await(gate)))
      const b = yield* Effect.forkChild(both.withSlot(2, Deferred.succeed(gate, undefined)))
      yield* Fiber.join(b)
      yield* Fiber.join(a)
    })
  )
})
