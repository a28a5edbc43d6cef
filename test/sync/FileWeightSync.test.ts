import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import * as LocalEngine from "../../src/inference/LocalEngine.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as FileWeightSync from "../../src/sync/FileWeightSync.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 40,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: false
})

const tempDir = Effect.acquireRelease(
  Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "file-sync-"))),
  (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
)

const snapshotOf = (seed: number, version: number) =>
  Effect.promise(() => {
    const model = Transformer.init(config, seed, 0.3)
    return Snapshot.fromModel(model, PolicyVersion.make(version)).finally(() => Transformer.dispose(model))
  })

describe("FileWeightSync", () => {
  it.live("writes each version as a directory, points LATEST at the newest and keeps the newest `keep`", () =>
    Effect.scoped(
      Effect.gen(function* () {
        yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
        const dir = yield* tempDir
        const sync = FileWeightSync.make({ dir, keep: 2 })
        for (const v of [1, 2, 3]) {
          yield* sync.publish({ version: PolicyVersion.make(v), snapshot: snapshotOf(v, v) })
        }
        const entries = (yield* Effect.promise(() => fs.readdir(dir))).sort()
        assert.deepStrictEqual(entries, ["LATEST", "v000002", "v000003"]) // no temp files left behind
        assert.strictEqual(yield* Effect.promise(() => FileWeightSync.readLatest(dir)), 3)
        const back = yield* Effect.promise(() => FileWeightSync.readVersion(dir, 3))
        const sent = yield* snapshotOf(3, 3)
        assert.deepStrictEqual(back.names, sent.names)
        assert.deepStrictEqual(back.shapes, sent.shapes)
        back.data.forEach((d, i) => assert.deepStrictEqual(d, sent.data[i]))
      })
    )
  )

  it.live("a watching engine loads a new version: its version moves and its weights equal the published ones", () =>
    Effect.scoped(
      Effect.gen(function* () {
        yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
        const dir = yield* tempDir
        const model = yield* Effect.acquireRelease(
          Effect.sync(() => Transformer.init(config, 11, 0.3)),
          (m) => Effect.sync(() => Transformer.dispose(m))
        )
        const engine = yield* LocalEngine.make({ model })
        yield* FileWeightSync.watch(dir, engine, { interval: "10 millis" })
        const published = yield* snapshotOf(12, 1)
        yield* FileWeightSync.make({ dir }).publish({
          version: PolicyVersion.make(1),
          snapshot: Effect.succeed(published)
        })
        const version = yield* engine.version.pipe(
          Effect.repeat({ schedule: Schedule.spaced("10 millis"), until: (v) => v === 1, times: 500 })
        )
        assert.strictEqual(version, 1)
        const loaded = yield* Effect.promise(() => Snapshot.fromModel(model, PolicyVersion.make(1)))
        assert.deepStrictEqual(loaded.names, published.names)
        loaded.data.forEach((d, i) => assert.deepStrictEqual(d, published.data[i], loaded.names[i]))
      })
    )
  )
})
