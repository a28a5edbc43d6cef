/**
 * Models by name from a Hugging Face hub cache built here (models--org--name/refs/main → snapshots/<hash>/, a tiny
 * random checkpoint saved by Checkpoint.save), loaded the way users load them: `model info --model org/name` with
 * HF_HUB_CACHE set, and PolicyModel.load with `model.path: org/name`.
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { ModelConfig as ModelSection } from "../../src/config/ModelConfig.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as HfCache from "../../src/model/HfCache.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as PolicyModel from "../../src/trainer/PolicyModel.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 40,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 4,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: true
})

const main = "0123456789abcdef0123456789abcdef01234567"
const pinned = "fedcba9876543210fedcba9876543210fedcba98"

/** A hub cache (HF_HOME/hub) with tiny-org/tiny-model: refs/main → `main`'s snapshot (2 layers); `pinned`'s snapshot has 1. */
const buildCache = async (): Promise<string> => {
  const cache = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "effect-rl-hf-home-")), "hub") // HF_HOME/hub
  const repo = path.join(cache, "models--tiny-org--tiny-model")
  const model = Transformer.init(config, 1)
  await Checkpoint.save(model, path.join(repo, "snapshots", main))
  Transformer.dispose(model)
  const one = Transformer.init({ ...config, numLayers: 1 }, 2)
  await Checkpoint.save(one, path.join(repo, "snapshots", pinned))
  Transformer.dispose(one)
  fs.mkdirSync(path.join(repo, "refs"), { recursive: true })
  fs.writeFileSync(path.join(repo, "refs", "main"), main) // as huggingface_hub writes it: the hash, no newline
  return cache
}

const cli = (args: ReadonlyArray<string>, env: Record<string, string | undefined>) => {
  const result = spawnSync(process.execPath, ["src/main.ts", ...args], {
    encoding: "utf8",
    timeout: 60_000,
    env: { ...process.env, NO_COLOR: "1", HF_HUB_CACHE: undefined, HF_HOME: undefined, ...env }
  })
  return { code: result.status ?? -1, stdout: result.stdout ?? "", stderr: result.stderr ?? "" }
}

describe("HfCache", () => {
  it("parses org/name[@revision] and picks the cache from HF_HUB_CACHE, HF_HOME, then ~/.cache", () => {
    assert.deepStrictEqual(HfCache.parseName("Qwen/Qwen3-0.6B"), { repo: "Qwen/Qwen3-0.6B", revision: "main" })
    assert.deepStrictEqual(HfCache.parseName("Qwen/Qwen3-0.6B@v1.0"), { repo: "Qwen/Qwen3-0.6B", revision: "v1.0" })
    assert.isUndefined(HfCache.parseName("runs/a/checkpoints/step-1"))
    assert.isUndefined(HfCache.parseName("/abs/dir"))
    assert.strictEqual(HfCache.cacheDir({ HF_HUB_CACHE: "/a", HF_HOME: "/b" }).dir, "/a")
    assert.strictEqual(HfCache.cacheDir({ HF_HOME: "/b" }).dir, path.join("/b", "hub"))
    assert.strictEqual(HfCache.cacheDir({}).dir, path.join(os.homedir(), ".cache", "huggingface", "hub"))
  })

  it.effect("resolves refs/main, a commit-hash revision, and leaves existing paths alone", () =>
    Effect.gen(function* () {
      const cache = yield* Effect.promise(buildCache)
      const repo = path.join(cache, "models--tiny-org--tiny-model")
      const env = { HF_HUB_CACHE: cache }
      assert.strictEqual(HfCache.resolve("tiny-org/tiny-model", env), path.join(repo, "snapshots", main))
      assert.strictEqual(HfCache.resolve(`tiny-org/tiny-model@${pinned}`, env), path.join(repo, "snapshots", pinned))
      const viaHome = path.join(path.dirname(cache), "hub", "models--tiny-org--tiny-model", "snapshots", main)
      assert.strictEqual(HfCache.resolve("tiny-org/tiny-model", { HF_HOME: path.dirname(cache) }), viaHome)
      assert.strictEqual(HfCache.resolve(cache, {}), cache) // an existing path is a path
      fs.rmSync(path.dirname(cache), { recursive: true, force: true })
    })
  )

  it("not found: names every place it looked and how to fill the cache", () => {
    const cache = fs.mkdtempSync(path.join(os.tmpdir(), "effect-rl-hf-empty-"))
    const error = assert.throws(() => HfCache.resolve("Qwen/Qwen3-0.6B@v2", { HF_HUB_CACHE: cache })) as unknown
    const message = (error as Error).message
    assert.include(message, `Hugging Face cache ${cache} (HF_HUB_CACHE)`)
    assert.include(message, path.resolve("Qwen/Qwen3-0.6B@v2"))
    assert.include(message, path.join(cache, "models--Qwen--Qwen3-0.6B", "refs", "v2"))
    assert.include(message, "hf download Qwen/Qwen3-0.6B --revision v2")
    assert.include(message, "huggingface-cli download Qwen/Qwen3-0.6B --revision v2")
    fs.rmSync(cache, { recursive: true, force: true })
  })

  it("model info --model org/name reads the cached snapshot (HF_HUB_CACHE); an absent model is a named error", async () => {
    const cache = await buildCache()
    const ok = cli(["model", "info", "--model", "tiny-org/tiny-model"], { HF_HUB_CACHE: cache })
    assert.strictEqual(ok.code, 0, ok.stderr)
    const info = JSON.parse(ok.stdout.trim().split("\n").pop()!) as { num_hidden_layers: number; vocab_size: number }
    assert.strictEqual(info.num_hidden_layers, 2)
    assert.strictEqual(info.vocab_size, 40)
    const pinnedInfo = cli(["model", "info", "--model", `tiny-org/tiny-model@${pinned}`], {
      HF_HOME: path.dirname(cache)
    })
    assert.strictEqual(JSON.parse(pinnedInfo.stdout.trim().split("\n").pop()!).num_hidden_layers, 1)

    const missing = cli(["model", "info", "--model", "Qwen/Qwen3-0.6B"], { HF_HUB_CACHE: cache })
    assert.notStrictEqual(missing.code, 0)
    assert.include(missing.stderr, `neither a directory nor in the Hugging Face cache ${cache} (HF_HUB_CACHE)`)
    assert.include(missing.stderr, "hf download Qwen/Qwen3-0.6B")
    assert.notInclude(missing.stderr, "    at ") // no stack trace
    fs.rmSync(path.dirname(cache), { recursive: true, force: true })
  }, 120_000)

  it.effect("PolicyModel.load with model.path: org/name loads the snapshot's weights", () =>
    Effect.gen(function* () {
      const cache = yield* Effect.promise(buildCache)
      const saved = process.env["HF_HUB_CACHE"]
      process.env["HF_HUB_CACHE"] = cache
      const section = Schema.decodeUnknownSync(ModelSection)({ path: "tiny-org/tiny-model" })
      const restore = Effect.sync(() => {
        if (saved === undefined) delete process.env["HF_HUB_CACHE"]
        else process.env["HF_HUB_CACHE"] = saved
      })
      const model = yield* PolicyModel.load(section).pipe(Effect.ensuring(restore))
      const reference = yield* Effect.promise(() =>
        Checkpoint.load(path.join(cache, "models--tiny-org--tiny-model", "snapshots", main))
      )
      const a = yield* Effect.promise(() => Transformer.toHfArrays(model))
      const b = yield* Effect.promise(() => Transformer.toHfArrays(reference.model))
      assert.strictEqual(model.config.numLayers, 2)
      assert.deepStrictEqual(
        a.map((t) => [t.name, Array.from(t.data.slice(0, 4))]),
        b.map((t) => [t.name, Array.from(t.data.slice(0, 4))])
      )
      Transformer.dispose(model)
      Transformer.dispose(reference.model)
      fs.rmSync(path.dirname(cache), { recursive: true, force: true })
    })
  )
})
