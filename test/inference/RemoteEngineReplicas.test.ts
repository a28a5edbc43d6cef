/**
 * RemoteEngine over two replicas, in process: two `serve`s of different weights (seeds 11 and 22), so greedy tokens
 * say which replica answered. New trajectories go to the least loaded replica, a trajectory's later turns to the
 * replica of its first, and a replica that cannot answer is taken out: the call goes on at the other and says so.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { FetchHttpClient } from "effect/http"
import type { SamplingParams } from "../../src/inference/InferenceEngine.ts"
import * as RemoteEngine from "../../src/inference/RemoteEngine.ts"
import * as Serve from "../../src/layers/Serve.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import { checkpointDir, config, tempDir } from "../fixtures/LoraServe.ts"

const greedy = (maxNewTokens: number): SamplingParams => ({ ...Sampling.defaultParams, temperature: 0, maxNewTokens })
const prompt = [72, 105, 33, 10]

/** A checkpoint of seed `seed` served in process; its URL. */
const serveSeed = (seed: number) =>
  Effect.gen(function* () {
    yield* checkpointDir // initialises the backend
    const dir = yield* tempDir(`replica-${seed}-`)
    const model = Transformer.init(config, seed, 0.3)
    yield* Effect.promise(() => Checkpoint.save(model, dir))
    Transformer.dispose(model)
    yield* AutoTokenizer.save(ByteTokenizer.make(), dir).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
    return yield* Serve.start({ model: dir, host: "127.0.0.1", port: 0, token: undefined, modelName: "tiny" }).pipe(
      Effect.provide(NodeServices.layer),
      Effect.orDie
    )
  })

const localGreedy = (seed: number, ids: ReadonlyArray<number>, n: number) =>
  Effect.promise(async () => {
    const model = Transformer.init(config, seed, 0.3)
    const [c] = await Sampling.generate(model, [{ promptIds: ids, sampling: greedy(n) }])
    Transformer.dispose(model)
    return c!.tokens
  })

describe("RemoteEngine over replicas", () => {
  it.live("routes new trajectories to the least loaded replica and keeps a trajectory's turns on its replica", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const a = yield* serveSeed(11)
        const b = yield* serveSeed(22)
        const engine = yield* RemoteEngine.make({ urls: [a, b], model: "tiny" })
        const fromA = yield* localGreedy(11, prompt, 6)
        const fromB = yield* localGreedy(22, prompt, 6)
        assert.notDeepEqual(fromA, fromB)
        const call = (trajectoryId: string) =>
          Effect.map(engine.generate([{ promptIds: prompt, sampling: greedy(6), trajectoryId }]), ([r]) => r!.tokens)
        // t1 and t2 at once: t1 takes the first (both idle), t2 the one with no call in flight
        const [t1, t2] = yield* Effect.all([call("t1"), call("t2")], { concurrency: "unbounded" })
        assert.deepStrictEqual([t1, t2], [fromA, fromB])
        // alone, both idle: t2's next turn stays on its replica; a new trajectory takes the first
        assert.deepStrictEqual(yield* call("t2"), fromB)
        assert.deepStrictEqual(yield* call("t3"), fromA)
        assert.deepStrictEqual(yield* call("t1"), fromA)
      }).pipe(Effect.provide(FetchHttpClient.layer))
    )
  )

  it.live("takes out a replica that cannot answer; the call goes on at another and records the move", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const b = yield* serveSeed(22)
        const dead = "http://127.0.0.1:9" // discard port: nothing listens
        const engine = yield* RemoteEngine.make({ urls: [dead, b], model: "tiny", maxRetries: 0 })
        const [result] = yield* engine.generate([{ promptIds: prompt, sampling: greedy(6), trajectoryId: "t1" }])
        assert.deepStrictEqual(result!.tokens, yield* localGreedy(22, prompt, 6))
        assert.strictEqual(result!.retries?.length, 1)
        assert.include(result!.retries![0]!, `replica ${dead} failed: `)
        // taken out: the next new trajectory goes straight to the live one, with nothing to record
        const [next] = yield* engine.generate([{ promptIds: prompt, sampling: greedy(6), trajectoryId: "t2" }])
        assert.isUndefined(next!.retries)
      }).pipe(Effect.provide(FetchHttpClient.layer))
    )
  )
})
