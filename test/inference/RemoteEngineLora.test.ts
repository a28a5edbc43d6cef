import * as fs from "node:fs/promises"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { FetchHttpClient } from "effect/http"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import type { AdapterWeights } from "../../src/domain/WeightSnapshot.ts"
import * as WeightSnapshot from "../../src/domain/WeightSnapshot.ts"
import type { GenerateRequest } from "../../src/inference/InferenceEngine.ts"
import * as RemoteEngine from "../../src/inference/RemoteEngine.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import { inProcessLogprobs, models, randomAdapter, serve, servedName, tempDir } from "../fixtures/LoraServe.ts"

const prompt = [3, 1, 4, 1, 5]
const request = (maxNewTokens: number, seed: number): GenerateRequest => ({
  promptIds: prompt,
  sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens, seed }
})
const adapterSnapshot = (version: number, adapter: AdapterWeights) =>
  WeightSnapshot.make({ version: PolicyVersion.make(version), names: [], shapes: [], data: [], adapter })

describe("RemoteEngine syncing LoRA adapters through serve's runtime LoRA API", () => {
  it.live("loads each version as <prefix>-v<N>, samples with the newest, keeps the newest `keep`", () =>
    Effect.gen(function* () {
      const url = yield* serve()
      const dir = yield* tempDir("remote-adapters-")
      const synced: Array<{ readonly version: number; readonly bytes: number; readonly seconds: number }> = []
      const engine = yield* RemoteEngine.make({ url, lora: { dir, keep: 2 }, onSynced: (t) => synced.push(t) }).pipe(
        Effect.provide(FetchHttpClient.layer)
      )
      const adapters = yield* Effect.promise(() => Promise.all([1, 2, 3, 4].map((v) => randomAdapter(20 + v, 0.5))))

      for (const version of [1, 2, 3]) {
        yield* engine.updateWeights(adapterSnapshot(version, adapters[version - 1]!))
        const [result] = yield* engine.generate([request(6, version)])
        assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [version, version])
        // sampled by this version's adapter: its log-probs, teacher-forced in process, are the served ones
        const expected = inProcessLogprobs([...prompt, ...result!.tokens], prompt.length, adapters[version - 1])
        result!.logprobs.forEach((lp, i) => assert.closeTo(lp, expected[i]!, 1e-5))
        assert.strictEqual(yield* engine.version, version)
      }
      assert.deepStrictEqual(
        (yield* models(url)).data.map((m) => m.id),
        [servedName, "policy-v2", "policy-v3"]
      )
      assert.deepStrictEqual(yield* Effect.promise(() => fs.readdir(dir)), ["v000002", "v000003"])
      assert.deepStrictEqual(
        synced.map((s) => s.version),
        [1, 2, 3]
      )
      const files = yield* Effect.promise(async () => {
        const v3 = path.join(dir, "v000003")
        const names = await fs.readdir(v3)
        return (await Promise.all(names.map((n) => fs.stat(path.join(v3, n))))).reduce((n, s) => n + s.size, 0)
      })
      assert.strictEqual(synced[2]!.bytes, files)

      // a request in flight keeps the adapter it started with while v4 is loaded and v2 unloaded
      const order: Array<string> = []
      const inFlight = yield* Effect.forkChild(
        engine.generate([request(400, 9)]).pipe(Effect.tap(() => Effect.sync(() => order.push("request"))))
      )
      yield* Effect.sleep("200 millis")
      yield* engine.updateWeights(adapterSnapshot(4, adapters[3]!))
      order.push("update")
      const [long] = yield* Fiber.join(inFlight)
      assert.deepStrictEqual(order, ["update", "request"]) // v4 was loaded while the request ran
      assert.deepStrictEqual([long!.policyVersionFirst, long!.policyVersionLast], [3, 3])
      const expected = inProcessLogprobs([...prompt, ...long!.tokens], prompt.length, adapters[2])
      long!.logprobs.forEach((lp, i) => assert.closeTo(lp, expected[i]!, 1e-4))
      const [next] = yield* engine.generate([request(2, 4)])
      assert.deepStrictEqual([next!.policyVersionFirst, next!.policyVersionLast], [4, 4])
      assert.deepStrictEqual(
        (yield* models(url)).data.map((m) => m.id),
        [servedName, "policy-v3", "policy-v4"]
      )
      assert.deepStrictEqual(yield* Effect.promise(() => fs.readdir(dir)), ["v000003", "v000004"])

      // publishing a version again replaces its adapter in place
      yield* engine.updateWeights(adapterSnapshot(4, adapters[0]!))
      const [again] = yield* engine.generate([request(4, 5)])
      const replaced = inProcessLogprobs([...prompt, ...again!.tokens], prompt.length, adapters[0])
      again!.logprobs.forEach((lp, i) => assert.closeTo(lp, replaced[i]!, 1e-5))
    }).pipe(Effect.scoped)
  )

  it.live("a load the server refuses is a BadResponse InferenceError, and requests keep the last adapter", () =>
    Effect.gen(function* () {
      const url = yield* serve({ maxLoras: 1 })
      const dir = yield* tempDir("remote-adapters-")
      const engine = yield* RemoteEngine.make({ url, lora: { dir, keep: 2, prefix: "p" } }).pipe(
        Effect.provide(FetchHttpClient.layer)
      )
      const adapter = yield* Effect.promise(() => randomAdapter(31, 0.5))
      yield* engine.updateWeights(adapterSnapshot(1, adapter))
      const refused = yield* engine.updateWeights(adapterSnapshot(2, adapter)).pipe(Effect.flip)
      assert.strictEqual(refused.reason, "BadResponse")
      assert.include(refused.message, "p-v2")
      assert.include(refused.message, "--max-loras")
      const [result] = yield* engine.generate([request(2, 1)])
      assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [1, 1])
    }).pipe(Effect.scoped)
  )
})
