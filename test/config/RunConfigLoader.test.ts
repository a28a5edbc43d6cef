import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as ConfigView from "../../src/config/ConfigView.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"

const base = { model: { init: { hidden_size: 32 } }, tokenizer: { kind: "byte" } }

describe("RunConfigLoader", () => {
  it.effect("fills every section's defaults from a minimal config", () =>
    Effect.gen(function* () {
      const config = yield* RunConfigLoader.fromObject(base)
      assert.strictEqual(config.model.init?.hidden_size, 32)
      assert.strictEqual(config.trainer.algorithm.advantage_estimator, "grpo")
      assert.strictEqual(config.trainer.algorithm.eps_clip_low, 0.2)
      assert.strictEqual(config.generator.n_samples_per_prompt, 4)
      assert.strictEqual(config.backend.name, "auto")
    })
  )

  it.effect("types dotted overrides by the schema: numbers, booleans, lists", () =>
    Effect.gen(function* () {
      const config = yield* RunConfigLoader.fromObject(base, [
        "trainer.algorithm.kl_loss_coef=0.01",
        "trainer.algorithm.use_kl_loss=true",
        "generator.sampling.stop=[</answer>, DONE]",
        "pipeline.mode=async"
      ])
      assert.strictEqual(config.trainer.algorithm.kl_loss_coef, 0.01)
      assert.isTrue(config.trainer.algorithm.use_kl_loss)
      assert.deepStrictEqual(config.generator.sampling.stop, ["</answer>", "DONE"])
      assert.strictEqual(config.pipeline.mode, "async")
    })
  )

  it.effect("names the key path, the bad value and what was expected", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject(base, ["trainer.algorithm.eps_clip_low=wide"]).pipe(Effect.flip)
      assert.strictEqual(error.path, "trainer.algorithm.eps_clip_low")
      assert.include(error.message, "trainer.algorithm.eps_clip_low: Expected number")
      assert.include(error.message, '(got "wide")')
    })
  )

  it.effect("rejects an unknown override key and suggests the closest valid one", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject(base, ["trainer.algorithm.kl_cof=0.1"]).pipe(Effect.flip)
      assert.strictEqual(error.path, "trainer.algorithm.kl_cof")
      assert.include(error.message, "did you mean trainer.algorithm.kl_coef?")
    })
  )

  it.effect("rejects unknown keys in the file itself, inside arrays too", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject({
        ...base,
        environment: { mcp_servers: [{ name: "toolbox", comand: "node" }] }
      }).pipe(Effect.flip)
      assert.strictEqual(error.path, "environment.mcp_servers.0.comand")
      assert.include(error.message, "did you mean environment.mcp_servers.0.command?")
    })
  )

  it.effect("applies cross-field checks: exactly one of model.path and model.init", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject({ tokenizer: { kind: "byte" }, model: {} }).pipe(Effect.flip)
      assert.strictEqual(error.path, "model.path")
      const ok = yield* RunConfigLoader.fromObject({ model: { path: "ckpt" } })
      assert.strictEqual(ok.model.path, "ckpt")
    })
  )

  it.effect("applies cross-field checks: train_batch_size must be a multiple of policy_mini_batch_size", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject(base, [
        "trainer.train_batch_size=6",
        "trainer.policy_mini_batch_size=4"
      ]).pipe(Effect.flip)
      assert.strictEqual(error.path, "trainer.policy_mini_batch_size")
    })
  )

  it.effect("loads YAML files and reports the file in errors", () =>
    Effect.gen(function* () {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const file = `${dir}/run.yaml`
      yield* fs.writeFileString(file, "model:\n  init: {}\ntokenizer:\n  kind: byte\npipeline:\n  mode: fast\n")
      const error = yield* RunConfigLoader.load(file).pipe(Effect.flip)
      assert.strictEqual(error.file, file)
      assert.strictEqual(error.path, "pipeline.mode")
      assert.include(error.message, '"sync" | "async"')
      const ok = yield* RunConfigLoader.load(file, ["pipeline.mode=async"])
      assert.strictEqual(ok.pipeline.mode, "async")
    }).pipe(Effect.provide(NodeServices.layer))
  )
})

describe("TrainerConfig", () => {
  it.effect(
    "holds SkyRL's loss defaults: ε 0.2/0.2, c 3, token_mean, CISPO [0, 5], SAPO τ 1/1.05, DPPO binary_tv 0.2",
    () =>
      Effect.gen(function* () {
        const { algorithm } = (yield* RunConfigLoader.fromObject(base)).trainer
        assert.deepInclude(algorithm, {
          policy_loss_type: "regular",
          eps_clip_low: 0.2,
          eps_clip_high: 0.2,
          clip_ratio_c: 3,
          loss_reduction: "token_mean",
          cispo_eps_clip_low: 1,
          cispo_eps_clip_high: 4
        })
        assert.deepStrictEqual(algorithm.sapo, { tau_pos: 1, tau_neg: 1.05 })
        assert.deepStrictEqual(algorithm.dppo, { dppo_type: "binary_tv", delta_low: 0.2, delta_high: 0.2 })
      })
  )

  it.effect("selects every ported loss by policy_loss_type, SAPO's and DPPO's parameters under SkyRL's keys", () =>
    Effect.gen(function* () {
      const sapo = yield* RunConfigLoader.fromObject(base, [
        "trainer.algorithm.policy_loss_type=sapo",
        "trainer.algorithm.sapo.tau_neg=2"
      ])
      assert.strictEqual(sapo.trainer.algorithm.policy_loss_type, "sapo")
      assert.strictEqual(sapo.trainer.algorithm.sapo.tau_neg, 2)
      const dppo = yield* RunConfigLoader.fromObject(base, [
        "trainer.algorithm.policy_loss_type=dppo",
        "trainer.algorithm.dppo.dppo_type=binary_kl",
        "trainer.algorithm.dppo.delta_low=0.05"
      ])
      assert.deepStrictEqual(dppo.trainer.algorithm.dppo, { dppo_type: "binary_kl", delta_low: 0.05, delta_high: 0.2 })
    })
  )
})

describe("ConfigView.redact", () => {
  it("shows whether a secret reference is set, never its value, and hides secret-looking record values", () => {
    const view = ConfigView.redact(
      { api_key: { env: "MY_KEY" }, headers: { Authorization: "Bearer abc", Accept: "json" } },
      { MY_KEY: "sk-123" }
    )
    assert.deepStrictEqual(view, {
      api_key: "<redacted: $MY_KEY set>",
      headers: { Authorization: "<redacted>", Accept: "json" }
    })
    assert.notInclude(ConfigView.toYaml(view), "sk-123")
  })
})
