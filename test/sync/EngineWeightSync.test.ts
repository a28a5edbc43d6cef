import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { InferenceError } from "../../src/domain/Errors.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import * as WeightSnapshot from "../../src/domain/WeightSnapshot.ts"
import { InferenceEngine } from "../../src/inference/InferenceEngine.ts"
import * as EngineWeightSync from "../../src/sync/EngineWeightSync.ts"
import { WeightSync } from "../../src/sync/WeightSync.ts"

/** An engine that records each snapshot it is given; `fail` makes every update fail. */
const recordingEngine = (received: Array<WeightSnapshot.WeightSnapshot>, fail = false) =>
  Layer.succeed(
    InferenceEngine,
    InferenceEngine.of({
      generate: () => Effect.succeed([]),
      updateWeights: (snapshot) =>
        fail
          ? Effect.fail(new InferenceError({ engine: "test", reason: "BadResponse", message: "no room on the board" }))
          : Effect.sync(() => void received.push(snapshot)),
      pause: Effect.void,
      resume: Effect.void,
      version: Effect.succeed(PolicyVersion.initial)
    })
  )

// two tensors: w [2, 2] and b [2]
const twoTensors = WeightSnapshot.make({
  version: PolicyVersion.make(3),
  names: ["w", "b"],
  shapes: [[2, 2], [2]],
  data: [new Float32Array([1, 2, 3, 4]), new Float32Array([5, 6])]
})

describe("EngineWeightSync", () => {
  it.effect("shared: hands the engine a tensor-less snapshot of the new version and never reads the weights", () => {
    const received: Array<WeightSnapshot.WeightSnapshot> = []
    return Effect.gen(function* () {
      const sync = yield* WeightSync
      yield* sync.publish({
        version: PolicyVersion.make(3),
        snapshot: Effect.die(new Error("a shared engine's weights must not be read"))
      })
      assert.strictEqual(received.length, 1)
      assert.strictEqual(received[0]!.version, 3)
      assert.deepStrictEqual(received[0]!.names, [])
      assert.deepStrictEqual(received[0]!.data, [])
    }).pipe(
      Effect.provide(EngineWeightSync.layer({ weights: "shared" }).pipe(Layer.provide(recordingEngine(received))))
    )
  })

  it.effect("copied: reads the snapshot and hands the engine all of it", () => {
    const received: Array<WeightSnapshot.WeightSnapshot> = []
    const timings: Array<{ readonly version: number; readonly seconds: number }> = []
    return Effect.gen(function* () {
      const sync = yield* WeightSync
      yield* sync.publish({ version: PolicyVersion.make(3), snapshot: Effect.succeed(twoTensors) })
      assert.strictEqual(received.length, 1)
      assert.strictEqual(received[0], twoTensors)
      assert.deepStrictEqual(
        timings.map((t) => t.version),
        [3]
      )
    }).pipe(
      Effect.provide(
        EngineWeightSync.layer({ weights: "copied", onSynced: (t) => timings.push(t) }).pipe(
          Layer.provide(recordingEngine(received))
        )
      )
    )
  })

  it.effect("an engine that refuses the update fails the publish with a WeightSyncError carrying its message", () =>
    Effect.gen(function* () {
      const sync = yield* WeightSync
      const error = yield* Effect.flip(
        sync.publish({ version: PolicyVersion.make(1), snapshot: Effect.succeed(twoTensors) })
      )
      assert.strictEqual(error._tag, "WeightSyncError")
      assert.include(error.message, "no room on the board")
    }).pipe(
      Effect.provide(EngineWeightSync.layer({ weights: "copied" }).pipe(Layer.provide(recordingEngine([], true))))
    )
  )
})
