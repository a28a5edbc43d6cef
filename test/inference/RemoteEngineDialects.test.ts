/**
 * The vLLM and SGLang weight-update dialects, both ends: `serve --enable-weight-reload` answers each dialect's routes
 * with the bodies pinned in test/fixtures/weight-dialects-api.json, and RemoteEngine in each dialect gets a version's
 * full weights into `serve` (a HF directory reloaded from disk), after which sampling is exactly the new weights'.
 */
import * as fs from "node:fs/promises"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { FetchHttpClient } from "effect/http"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import * as WeightSnapshot from "../../src/domain/WeightSnapshot.ts"
import * as HfWeightDir from "../../src/weights/HfWeightDir.ts"
import type { SamplingParams } from "../../src/inference/InferenceEngine.ts"
import * as RemoteEngine from "../../src/inference/RemoteEngine.ts"
import * as Serve from "../../src/layers/Serve.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import { checkpointDir, config, post, servedName, tempDir } from "../fixtures/LoraServe.ts"
import api from "../fixtures/weight-dialects-api.json" with { type: "json" }

const greedy = (maxNewTokens: number): SamplingParams => ({ ...Sampling.defaultParams, temperature: 0, maxNewTokens })
const prompt = [72, 105, 33, 10]

/** The tiny checkpoint served in process, weight reload open unless told otherwise. */
const serve = (weightReload = true) =>
  Effect.gen(function* () {
    const dir = yield* checkpointDir
    return yield* Serve.start({
      model: dir,
      host: "127.0.0.1",
      port: 0,
      token: undefined,
      modelName: servedName,
      weightReload
    }).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
  })

/** Seed `seed`'s weights as a snapshot at `version`. */
const snapshotOf = (seed: number, version: number) =>
  Effect.promise(async () => {
    const model = Transformer.init(config, seed, 0.3)
    const snapshot = await Snapshot.fromModel(model, PolicyVersion.make(version))
    Transformer.dispose(model)
    return snapshot
  })

/** Greedy tokens and log-probs of seed `seed`'s weights, sampled in this process. */
const localGreedy = (seed: number, n: number) =>
  Effect.promise(async () => {
    const model = Transformer.init(config, seed, 0.3)
    const [c] = await Sampling.generate(model, [{ promptIds: prompt, sampling: greedy(n) }])
    Transformer.dispose(model)
    return c!
  })

const get = (url: string) =>
  Effect.promise(async () => {
    const res = await fetch(url)
    const text = await res.text()
    return { status: res.status, json: JSON.parse(text) as unknown }
  })

/** A fixture body with its placeholders filled in. */
const fill = (value: unknown, dir: string, version: number): unknown =>
  JSON.parse(JSON.stringify(value).replaceAll("<dir>", dir).replaceAll("<N>", String(version)))

describe("serve's weight-update dialects", () => {
  it.live(
    "answer vLLM's pause / reload / reset / version / resume in vLLM's shapes, and serve the reloaded weights",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = yield* serve()
          const root = yield* tempDir("dialect-vllm-")
          const snapshot = yield* snapshotOf(22, 1)
          const { dir } = yield* Effect.promise(() =>
            HfWeightDir.write(root, snapshot, { config: ModelConfig.toHf(config) })
          )
          const v = api.vllm
          const paused = yield* post(`${url}/pause?mode=keep`, undefined)
          assert.deepStrictEqual([paused.status, paused.json], [200, v.pause.response.body])
          const isPaused = yield* get(`${url}/is_paused`)
          assert.deepStrictEqual(isPaused.json, v.isPaused.response.body)
          const reloaded = yield* post(`${url}${v.reload.path}`, fill(v.reload.request, dir, 1))
          assert.deepStrictEqual([reloaded.status, reloaded.json], [200, v.reload.response.body])
          const reset = yield* post(`${url}${v.resetPrefixCache.path}`, undefined)
          assert.deepStrictEqual(reset.json, v.resetPrefixCache.response.body)
          const labelled = yield* post(
            `${url}${v.updateWeightVersion.path}`,
            fill(v.updateWeightVersion.request, dir, 1)
          )
          assert.deepStrictEqual(labelled.json, fill(v.updateWeightVersion.response.body, dir, 1))
          const info = yield* get(`${url}${v.weightInfo.path}`)
          assert.deepStrictEqual(info.json, fill(v.weightInfo.response.body, dir, 1))
          const resumed = yield* post(`${url}${v.resume.path}`, undefined)
          assert.deepStrictEqual([resumed.status, resumed.json], [200, v.resume.response.body])
          const missing = yield* post(`${url}${v.missingMethod.path}`, v.missingMethod.request)
          assert.deepStrictEqual([missing.status, missing.json], [400, v.missingMethod.response.body])

          // the served weights are now seed 22's, at policy version 1 (from the directory's metadata)
          const completion = yield* post(`${url}/v1/completions`, {
            prompt,
            max_tokens: 6,
            temperature: 0,
            logprobs: 0,
            ignore_eos: true
          })
          const choice = (
            completion.json as {
              choices: ReadonlyArray<{
                token_ids: ReadonlyArray<number>
                policy_version_first: number
                logprobs: { token_logprobs: ReadonlyArray<number> }
              }>
            }
          ).choices[0]!
          const expected = yield* localGreedy(22, 6)
          assert.deepStrictEqual(choice.token_ids, expected.tokens)
          choice.logprobs.token_logprobs.forEach((lp, i) => assert.closeTo(lp, expected.logprobs[i]!, 1e-5))
          assert.strictEqual(choice.policy_version_first, 1)
        })
      )
  )

  it.live("answer SGLang's pause / update_weights_from_disk / flush / version / continue in SGLang's shapes", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const url = yield* serve()
        const root = yield* tempDir("dialect-sglang-")
        const snapshot = yield* snapshotOf(22, 3)
        const { dir } = yield* Effect.promise(() => HfWeightDir.write(root, snapshot))
        const g = api.sglang
        const paused = yield* post(`${url}${g.pause.path}`, { mode: "retract" })
        assert.deepStrictEqual([paused.status, paused.json], [200, g.pause.response.body])
        const updated = yield* post(
          `${url}${g.updateWeightsFromDisk.path}`,
          fill(g.updateWeightsFromDisk.request, dir, 3)
        )
        assert.deepStrictEqual(
          [updated.status, updated.json],
          [200, fill(g.updateWeightsFromDisk.response.body, dir, 3)]
        )
        const flushed = yield* post(`${url}${g.flushCache.path}`, undefined)
        assert.deepStrictEqual([flushed.status, flushed.text], [200, g.flushCache.response.text])
        const version = yield* get(`${url}${g.getWeightVersion.path}`)
        assert.deepStrictEqual(version.json, fill(g.getWeightVersion.response.body, dir, 3))
        const resumed = yield* post(`${url}${g.continue.path}`, g.continue.request)
        assert.deepStrictEqual([resumed.status, resumed.json], [200, g.continue.response.body])
        const bad = yield* post(`${url}${g.updateWeightsFromDisk.path}`, { model_path: `${root}/nothing-here` })
        assert.strictEqual(bad.status, g.updateWeightsFailure.response.status)
        assert.deepInclude(bad.json as object, g.updateWeightsFailure.response.body)
        const health = yield* get(`${url}/health`)
        assert.strictEqual((health.json as { policy_version: number }).policy_version, 3)
      })
    )
  )

  it.live("answer 404 without --enable-weight-reload, as vLLM's dev routes do outside dev mode", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const url = yield* serve(false)
        for (const route of ["/pause", "/collective_rpc", "/update_weights_from_disk", "/pause_generation"]) {
          const answer = yield* post(`${url}${route}`, {})
          assert.deepStrictEqual([answer.status, answer.json], [404, api.vllm.disabled.response.body], route)
        }
      })
    )
  )
})

describe("RemoteEngine dialects against serve", () => {
  for (const dialect of ["vllm", "sglang"] as const) {
    it.live(`${dialect}: a version's full weights reach the server, which then samples exactly them`, () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = yield* serve()
          const weightsDir = yield* tempDir(`engine-${dialect}-`)
          const engine = yield* RemoteEngine.make({ url, dialect, weightsDir, hfConfig: ModelConfig.toHf(config) })
          yield* engine.updateWeights(yield* snapshotOf(22, 1))
          assert.strictEqual(yield* engine.version, 1)
          const [result] = yield* engine.generate([{ promptIds: prompt, sampling: greedy(6) }])
          const expected = yield* localGreedy(22, 6)
          assert.deepStrictEqual(result!.tokens, expected.tokens)
          result!.logprobs.forEach((lp, i) => assert.closeTo(lp, expected.logprobs[i]!, 1e-5))
          assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [1, 1])
          const info = yield* get(`${url}${dialect === "vllm" ? "/weight_info" : "/get_weight_version"}`)
          assert.deepStrictEqual(info.json, { weight_version: "1" })
          // the newest two versions stay on disk
          yield* engine.updateWeights(yield* snapshotOf(23, 2))
          yield* engine.updateWeights(yield* snapshotOf(24, 3))
          const kept = yield* Effect.promise(() => fs.readdir(weightsDir))
          assert.deepStrictEqual(kept.sort(), ["v000002", "v000003"])
        }).pipe(Effect.provide(FetchHttpClient.layer))
      )
    )
  }

  it.live("a snapshot with tensors and no way to send them fails instead of only moving the version", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const url = yield* serve()
        const engine = yield* RemoteEngine.make({ url })
        const refused = yield* engine.updateWeights(yield* snapshotOf(22, 1)).pipe(Effect.flip)
        assert.include(refused.message, "cannot reach the server")
        assert.strictEqual(yield* engine.version, 0)
        // a tensor-less snapshot (the weights went another way) still moves the version
        yield* engine.updateWeights(
          WeightSnapshot.make({ version: PolicyVersion.make(1), names: [], shapes: [], data: [] })
        )
        assert.strictEqual(yield* engine.version, 1)
      }).pipe(Effect.provide(FetchHttpClient.layer))
    )
  )
})
