import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import { InferenceEngine, type SamplingParams } from "../../src/inference/InferenceEngine.ts"
import * as LocalEngine from "../../src/inference/LocalEngine.ts"
import * as WorkerEngine from "../../src/inference/WorkerEngine.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as EngineWeightSync from "../../src/sync/EngineWeightSync.ts"
import { WeightSync } from "../../src/sync/WeightSync.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 64,
  hidden_size: 64,
  intermediate_size: 128,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 256,
  tie_word_embeddings: true
})
const backend = { name: "cpu", threads: 0, kernels: "stock" } as const
const greedy = (maxNewTokens: number): SamplingParams => ({ ...Sampling.defaultParams, temperature: 0, maxNewTokens })

const scopedModel = (seed: number) =>
  Effect.acquireRelease(
    Effect.sync(() => Transformer.init(config, seed, 0.3)),
    (m) => Effect.sync(() => Transformer.dispose(m))
  )

/** A WorkerEngine over seed 11's weights, for the scope. */
const withWorker = <A, E>(pauseMode: WorkerEngine.PauseMode, body: Effect.Effect<A, E, InferenceEngine | WeightSync>) =>
  Effect.scoped(
    Effect.gen(function* () {
      yield* TensorBackend.initialise(backend)
      const model = yield* scopedModel(11)
      return yield* body.pipe(
        Effect.provide(EngineWeightSync.layer({ weights: "copied" })),
        Effect.provide(WorkerEngine.layer({ model, backend, maxBatch: 4, pauseMode }))
      )
    })
  )

const snapshotOf = (seed: number, version: number) =>
  Effect.flatMap(scopedModel(seed), (m) => Effect.promise(() => Snapshot.fromModel(m, PolicyVersion.make(version))))

const localGreedy = (seed: number, prompt: ReadonlyArray<number>, n: number) =>
  Effect.scoped(
    Effect.gen(function* () {
      const model = yield* scopedModel(seed)
      const engine = yield* LocalEngine.make({ model })
      const [result] = yield* engine.generate([{ promptIds: prompt, sampling: greedy(n) }])
      return result!
    })
  )

const publish = (seed: number, version: number) =>
  Effect.gen(function* () {
    const sync = yield* WeightSync
    const snapshot = yield* Effect.scoped(snapshotOf(seed, version))
    yield* sync.publish({ version: PolicyVersion.make(version), snapshot: Effect.succeed(snapshot) })
  })

describe("WorkerEngine", () => {
  it.live("samples in a worker thread the same greedy tokens and log-probs as a LocalEngine on the same weights", () =>
    withWorker(
      "keep",
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
        const results = yield* engine.generate(prompts.map((promptIds) => ({ promptIds, sampling: greedy(12) })))
        for (const [i, prompt] of prompts.entries()) {
          const expected = yield* localGreedy(11, prompt, 12)
          assert.deepStrictEqual(results[i]!.tokens, expected.tokens)
          results[i]!.logprobs.forEach((lp, j) => assert.closeTo(lp, expected.logprobs[j]!, 1e-5))
          assert.deepStrictEqual([results[i]!.policyVersionFirst, results[i]!.policyVersionLast], [0, 0])
        }
      })
    )
  )

  it.live("applies a weight update between decode steps of a request in flight and records both versions", () =>
    withWorker(
      "keep",
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        // ~20 ms a token on the cpu backend: admitted well before 300 ms, far from done
        const fiber = yield* Effect.forkChild(engine.generate([{ promptIds: [1, 2, 3], sampling: greedy(150) }]))
        yield* Effect.sleep("300 millis")
        yield* engine.pause // keep: the request stays in the batch, mid-way
        yield* publish(12, 1)
        assert.strictEqual(yield* engine.version, 1)
        yield* engine.resume
        const [result] = yield* Fiber.join(fiber)
        assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [0, 1])
        assert.strictEqual(result!.tokens.length, 150)
        const after = yield* engine.generate([{ promptIds: [1, 2, 3], sampling: greedy(6) }])
        assert.deepStrictEqual(after[0]!.tokens, (yield* localGreedy(12, [1, 2, 3], 6)).tokens)
      })
    )
  )

  it.live("pause mode abort restarts a request in flight after resume, wholly on the new weights", () =>
    withWorker(
      "abort",
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const fiber = yield* Effect.forkChild(engine.generate([{ promptIds: [9, 8], sampling: greedy(150) }]))
        yield* Effect.sleep("50 millis")
        yield* engine.pause
        yield* publish(12, 1)
        yield* engine.resume
        const [result] = yield* Fiber.join(fiber)
        assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [1, 1])
        assert.deepStrictEqual(result!.tokens, (yield* localGreedy(12, [9, 8], 150)).tokens)
      })
    )
  )

  it.live("pause mode wait returns once the requests in flight finish and holds new ones until resume", () =>
    withWorker(
      "wait",
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const running = yield* Effect.forkChild(engine.generate([{ promptIds: [3], sampling: greedy(40) }]))
        yield* Effect.sleep("20 millis")
        yield* engine.pause
        yield* publish(12, 1) // lands after the request: it finished before pause returned
        const [finished] = yield* Fiber.join(running)
        assert.strictEqual(finished!.tokens.length, 40)
        assert.deepStrictEqual([finished!.policyVersionFirst, finished!.policyVersionLast], [0, 0])
        const held = yield* Effect.forkChild(engine.generate([{ promptIds: [3], sampling: greedy(4) }]))
        yield* Effect.sleep("100 millis")
        assert.isUndefined(held.pollUnsafe())
        yield* engine.resume
        const [late] = yield* Fiber.join(held)
        assert.deepStrictEqual([late!.policyVersionFirst, late!.tokens.length], [1, 4])
      })
    )
  )

  it.live("resolves its worker entry next to itself, with its own extension", () =>
    Effect.sync(() => {
      assert.match(WorkerEngine.workerUrl().pathname, /\/src\/inference\/worker\/engine-worker\.ts$/)
    })
  )
})
