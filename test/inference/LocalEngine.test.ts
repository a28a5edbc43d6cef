import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect, Fiber } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import { InferenceEngine, type SamplingParams } from "../../src/inference/InferenceEngine.ts"
import * as LocalEngine from "../../src/inference/LocalEngine.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 40,
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 128,
  tie_word_embeddings: true
})
const greedy = (maxNewTokens: number): SamplingParams => ({ ...Sampling.defaultParams, temperature: 0, maxNewTokens })

/** A fresh engine over a fresh model, the model disposed with the scope. */
const withEngine = <A, E>(
  body: (model: Transformer.Transformer) => Effect.Effect<A, E, InferenceEngine>,
  options: Partial<LocalEngine.LocalEngineOptions> = {}
) =>
  Effect.gen(function* () {
    yield* TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })
    const model = yield* Effect.acquireRelease(
      Effect.sync(() => Transformer.init(config, 11, 0.3)),
      (m) => Effect.sync(() => Transformer.dispose(m))
    )
    return yield* body(model).pipe(Effect.provide(LocalEngine.layer({ model, maxBatch: 2, ...options })))
  })

/** Let other fibers and the engine's decode steps run (the engine yields to the event loop between steps). */
const turns = (n: number) =>
  Effect.promise(async () => {
    for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve))
  })

describe("LocalEngine", () => {
  it.live("generates per request, in order, over several batches, like the sampler", () =>
    withEngine((model) =>
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const requests = [[1, 2, 3], [4], [5, 6, 7, 8, 9]].map((promptIds, i) => ({
          promptIds,
          sampling: greedy(4 + i)
        }))
        const results = yield* engine.generate(requests)
        const expected = yield* Effect.promise(() => Sampling.generate(model, requests))
        assert.deepStrictEqual(
          results.map((r) => r.tokens),
          expected.map((c) => c.tokens)
        )
        assert.deepStrictEqual(
          results.map((r) => [r.finishReason, r.policyVersionFirst, r.policyVersionLast]),
          [
            ["length", 0, 0],
            ["length", 0, 0],
            ["length", 0, 0]
          ]
        )
      })
    )
  )

  it.live("applies a weight update between decode steps of a request in flight and reports both versions", () =>
    withEngine((model) =>
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const other = Transformer.init(config, 12, 0.3)
        const snapshot = yield* Effect.promise(() => Snapshot.fromModel(other, PolicyVersion.make(1)))
        Transformer.dispose(other)
        const fiber = yield* Effect.forkChild(engine.generate([{ promptIds: [1, 2, 3], sampling: greedy(40) }]))
        yield* turns(5)
        yield* engine.updateWeights(snapshot)
        assert.strictEqual(yield* engine.version, 1)
        const [result] = yield* Fiber.join(fiber)
        assert.strictEqual(result!.policyVersionFirst, 0)
        assert.strictEqual(result!.policyVersionLast, 1)
        assert.strictEqual(result!.tokens.length, 40)
        // the engine's model now holds the new weights
        assert.deepStrictEqual((yield* Effect.promise(() => Transformer.toHfArrays(model)))[0]!.data, snapshot.data[0])
      })
    )
  )

  it.live("pause holds decode steps; updates still apply; resume continues on the new version", () =>
    withEngine(() =>
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        yield* engine.pause
        const fiber = yield* Effect.forkChild(engine.generate([{ promptIds: [7, 8], sampling: greedy(5) }]))
        yield* turns(5)
        assert.isUndefined(fiber.pollUnsafe())
        yield* engine.updateWeights({ version: PolicyVersion.make(2), names: [], shapes: [], data: [] })
        yield* engine.resume
        const [result] = yield* Fiber.join(fiber)
        assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [2, 2])
      })
    )
  )

  it.live("rejects an empty prompt with InferenceError; a version going backwards is a defect", () =>
    withEngine(() =>
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const error = yield* Effect.flip(engine.generate([{ promptIds: [], sampling: greedy(3) }]))
        assert.strictEqual(error._tag, "InferenceError")
        yield* engine.updateWeights({ version: PolicyVersion.make(3), names: [], shapes: [], data: [] })
        const exit = yield* Effect.exit(
          engine.updateWeights({ version: PolicyVersion.make(2), names: [], shapes: [], data: [] })
        )
        assert.isTrue(exit._tag === "Failure")
      })
    )
  )

  it.live("concurrent calls share the running batch (joining mid-flight) and each gets what it would get alone", () =>
    withEngine((model) =>
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const sampled = (seed: number, n: number): SamplingParams => ({
          ...Sampling.defaultParams,
          temperature: 1,
          maxNewTokens: n,
          seed
        })
        const calls = [
          [{ promptIds: [1, 2, 3, 4, 5, 6, 7], sampling: sampled(1, 20) }],
          [
            { promptIds: [9], sampling: greedy(6) },
            { promptIds: [3, 3], sampling: sampled(2, 9) }
          ],
          [{ promptIds: [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], sampling: sampled(3, 4) }]
        ]
        const first = yield* Effect.forkChild(engine.generate(calls[0]!))
        yield* turns(4) // the first call is decoding when the others arrive
        const rest = yield* Effect.forkChild(
          Effect.all([engine.generate(calls[1]!), engine.generate(calls[2]!)], { concurrency: "unbounded" })
        )
        const results = [yield* Fiber.join(first), ...(yield* Fiber.join(rest))]
        for (const [i, call] of calls.entries()) {
          const alone = yield* Effect.promise(() => Sampling.generate(model, call))
          assert.deepStrictEqual(
            results[i]!.map((r) => r.tokens),
            alone.map((c) => c.tokens)
          )
          results[i]!.forEach((r, j) =>
            r.logprobs.forEach((lp, t) => assert.approximately(lp, alone[j]!.logprobs[t]!, 1e-4))
          )
        }
      })
    )
  )

  it.live("an interrupted call leaves the batch; the others finish", () =>
    withEngine(() =>
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const long = yield* Effect.forkChild(engine.generate([{ promptIds: [1, 2], sampling: greedy(100) }]))
        const short = yield* Effect.forkChild(engine.generate([{ promptIds: [3, 4], sampling: greedy(10) }]))
        yield* turns(3)
        yield* Fiber.interrupt(long)
        const [result] = yield* Fiber.join(short)
        assert.strictEqual(result!.tokens.length, 10)
      })
    )
  )

  it.live("releases every tensor (view, cache, model) when its scope closes", () =>
    Effect.gen(function* () {
      yield* TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })
      const before = tf.memory().numTensors
      yield* Effect.scoped(
        withEngine(() =>
          Effect.gen(function* () {
            const engine = yield* InferenceEngine
            yield* engine.generate([{ promptIds: [1, 2, 3], sampling: greedy(5) }])
            const interrupted = yield* Effect.forkChild(engine.generate([{ promptIds: [4], sampling: greedy(50) }]))
            yield* turns(3)
            yield* Fiber.interrupt(interrupted)
          })
        )
      )
      yield* turns(3) // the scheduler drops the interrupted row on its next iteration, or the finalizer frees it
      assert.strictEqual(tf.memory().numTensors, before)
    })
  )

  it.live(
    "the next turn reuses the previous turn's keys/values (prefix cache) and samples exactly as from scratch",
    () => {
      const stats = { prefilledTokens: 0, reusedTokens: 0 }
      return withEngine(
        (model) =>
          Effect.gen(function* () {
            const engine = yield* InferenceEngine
            const sampled = (seed: number, n: number): SamplingParams => ({
              ...Sampling.defaultParams,
              temperature: 1,
              maxNewTokens: n,
              seed
            })
            const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
            const [turn1, other] = yield* engine.generate([
              { promptIds: prompt, sampling: greedy(5) },
              { promptIds: [30, 31, 32, 33, 34], sampling: sampled(4, 3) }
            ])
            assert.strictEqual(stats.reusedTokens, 0)
            // turn 2 = prompt + response + "tool output"; a second row continues the other request
            const next = [
              { promptIds: [...prompt, ...turn1!.tokens, 20, 21, 22], sampling: sampled(9, 6) },
              { promptIds: [30, 31, 32, 33, 34, ...other!.tokens, 23], sampling: greedy(4) },
              { promptIds: [5, 5, 5], sampling: greedy(2) }
            ]
            const turn2 = yield* engine.generate(next)
            assert.strictEqual(stats.reusedTokens, prompt.length + 4 + 5 + 2) // all but each response's last token
            const fromScratch = yield* Effect.promise(() => Sampling.generate(model, next))
            assert.deepStrictEqual(
              turn2.map((r) => r.tokens),
              fromScratch.map((c) => c.tokens)
            )
            turn2.forEach((r, i) =>
              r.logprobs.forEach((lp, t) => assert.approximately(lp, fromScratch[i]!.logprobs[t]!, 1e-4))
            )
            // new weights invalidate every cached prefix
            yield* engine.updateWeights({ version: PolicyVersion.make(1), names: [], shapes: [], data: [] })
            const reusedBefore = stats.reusedTokens
            yield* engine.generate([{ promptIds: [...next[0]!.promptIds, ...turn2[0]!.tokens], sampling: greedy(2) }])
            assert.strictEqual(stats.reusedTokens, reusedBefore)
          }),
        { stats }
      )
    }
  )
})
