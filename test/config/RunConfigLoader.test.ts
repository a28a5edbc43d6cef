import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Logger, Schema } from "effect"
import { Yaml } from "effect/encoding"
import * as ConfigView from "../../src/config/ConfigView.ts"
import * as RunConfig from "../../src/config/RunConfig.ts"
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

  it.effect("blames an override, not the file, for a value the override set", () =>
    Effect.gen(function* () {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const file = `${dir}/run.yaml`
      yield* fs.writeFileString(file, "model:\n  init: {}\ntokenizer:\n  kind: byte\n")
      const error = yield* RunConfigLoader.load(file, ["trainer.max_steps=abc"]).pipe(Effect.flip)
      assert.isUndefined(error.file, "the file is fine")
      assert.strictEqual(error.path, "trainer.max_steps")
      assert.include(error.message, 'override trainer.max_steps=abc: trainer.max_steps: Expected number (got "abc")')
      // a whole section set by an override: its keys' problems name it too
      const section = yield* RunConfigLoader.load(file, ["pipeline={mode: fast}"]).pipe(Effect.flip)
      assert.include(section.message, "override pipeline={mode: fast}: pipeline.mode")
      // the file's own problem still names the file, beside an override's
      yield* fs.writeFileString(file, "model:\n  init: {}\ntokenizer:\n  kind: byte\npipeline:\n  mode: fast\n")
      const both = yield* RunConfigLoader.load(file, ["trainer.max_steps=abc"]).pipe(Effect.flip)
      assert.strictEqual(both.file, file)
      assert.include(both.message, "override trainer.max_steps=abc")
    }).pipe(Effect.provide(NodeServices.layer))
  )
})

/** Runs `body` with a logger that keeps each message in `logs`. */
const logged = <A, E>(body: Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const logs: Array<string> = []
    const value = yield* body.pipe(
      Effect.provide(Logger.layer([Logger.make((o) => void logs.push(String(o.message)))]))
    )
    return { value, logs }
  })

describe("RunConfig.movedKeys", () => {
  const moved = [
    ["generator.zero_reward_on_non_stop", "trainer.algorithm.zero_reward_on_non_stop", true],
    ["generator.apply_overlong_filtering", "trainer.algorithm.apply_overlong_filtering", false],
    ["generator.zero_variance_filter", "trainer.algorithm.zero_variance_filter", true]
  ] as const

  it.effect("reads each trainer key at its old generator.* path, with one warning naming the old and the new key", () =>
    Effect.gen(function* () {
      for (const [from, to, value] of moved) {
        const [, key] = from.split(".") as [string, string]
        // in the file, and as an override
        for (const load of [
          RunConfigLoader.fromObject({ ...base, generator: { [key]: value } }),
          RunConfigLoader.fromObject(base, [`${from}=${value}`])
        ]) {
          const { value: config, logs } = yield* logged(load)
          assert.strictEqual(config.trainer.algorithm[key as "zero_variance_filter"], value, from)
          assert.notProperty(config.generator, key)
          assert.deepStrictEqual(logs, [
            `config key ${from} is deprecated: it moved to ${to} (read from ${from} this time)`
          ])
        }
      }
    })
  )

  it.effect("lets the new key win where both are set, and says the old one is ignored", () =>
    Effect.gen(function* () {
      const { value: config, logs } = yield* logged(
        RunConfigLoader.fromObject({ ...base, generator: { zero_variance_filter: true } }, [
          "trainer.algorithm.zero_variance_filter=false"
        ])
      )
      assert.isFalse(config.trainer.algorithm.zero_variance_filter)
      assert.deepStrictEqual(logs, [
        "config key generator.zero_variance_filter is deprecated and ignored: " +
          "trainer.algorithm.zero_variance_filter is set too (remove generator.zero_variance_filter)"
      ])
    })
  )

  it.effect("warns about nothing for a config on the new keys, and writes back only the new keys", () =>
    Effect.gen(function* () {
      const { value: config, logs } = yield* logged(
        RunConfigLoader.fromObject(base, ["trainer.algorithm.zero_variance_filter=true"])
      )
      assert.isTrue(config.trainer.algorithm.zero_variance_filter)
      assert.deepStrictEqual(logs, [])
      const encoded = Schema.encodeSync(RunConfig.RunConfig)(config) as RunConfig.RunConfigEncoded
      assert.strictEqual(encoded.trainer?.algorithm?.zero_variance_filter, true)
      assert.notProperty(encoded.generator ?? {}, "zero_variance_filter")
    })
  )

  it.effect("suggests the new path, never the deprecated one, for a key in the wrong section", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject({ ...base, trainer: { zero_variance_filter: true } }).pipe(
        Effect.flip
      )
      assert.strictEqual(error.path, "trainer.zero_variance_filter")
      assert.include(error.message, "did you mean trainer.algorithm.zero_variance_filter?")
    })
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

  it.effect("rejects gae with step-wise trajectories, naming the estimator", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject(base, [
        "trainer.algorithm.advantage_estimator=gae",
        "generator.step_wise=true"
      ]).pipe(Effect.flip)
      assert.strictEqual(error.path, "trainer.algorithm.advantage_estimator")
      assert.include(error.message, "cannot train step-wise trajectories")
    })
  )

  it.effect(
    "reads trainer.distillation's defaults, and refuses it with step-wise trajectories or cluster runners",
    () =>
      Effect.gen(function* () {
        const ok = yield* RunConfigLoader.fromObject(base, ["trainer.distillation.teacher=data/quickstart/teacher"])
        assert.deepStrictEqual(ok.trainer.distillation, {
          teacher: "data/quickstart/teacher",
          kl_coef: 1,
          rewards: false,
          cache_size: 4096,
          max_concurrency: 8,
          http_retries: 3,
          timeout_seconds: 60,
          price_per_token: 0
        })
        for (const override of [
          "generator.step_wise=true",
          "generator.engine.chat=true",
          "pipeline.rollouts=cluster"
        ]) {
          const error = yield* RunConfigLoader.fromObject(base, [
            "trainer.distillation.teacher=data/quickstart/teacher",
            ...(override.includes("chat")
              ? ["generator.engine.kind=remote", "generator.engine.url=http://127.0.0.1:1"]
              : []),
            override
          ]).pipe(Effect.flip)
          assert.strictEqual(error.path, "trainer.distillation", `${override}: ${error.message}`)
        }
      })
  )
})

describe("RunConfig.derive", () => {
  it.effect("gives the trainer what it needs from other sections, each computed here once", () =>
    Effect.gen(function* () {
      // 4 prompts × 8 samples per step, 2 prompts per mini-batch; greedy sampling trains at τ = 1
      const config = yield* RunConfigLoader.fromObject(base, [
        "generator.n_samples_per_prompt=8",
        "generator.sampling.temperature=0",
        "generator.max_input_length=512",
        "trainer.train_batch_size=4",
        "trainer.policy_mini_batch_size=2"
      ])
      assert.deepStrictEqual(RunConfig.derive(config), {
        sequencesPerStep: 32,
        miniBatchesPerStep: 2,
        sequencesPerMiniBatch: 16,
        temperature: 1,
        maxSequenceLength: 512,
        lossMaxSeqLen: 512 // no trainer.algorithm.max_seq_len: the longest row
      })
      const sampled = yield* RunConfigLoader.fromObject(base, [
        "generator.sampling.temperature=0.7",
        "trainer.algorithm.max_seq_len=300"
      ])
      assert.include(RunConfig.derive(sampled), { temperature: 0.7, lossMaxSeqLen: 300 })
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

describe("ConfigView.forRunDirectory", () => {
  it.effect("keeps secret references (names, not values) so a run's config.yaml decodes again", () =>
    Effect.gen(function* () {
      const config = yield* RunConfigLoader.fromObject(base, [
        "generator.engine.kind=remote",
        "generator.engine.url=http://127.0.0.1:8000",
        "generator.engine.api_key={env: MY_KEY}"
      ])
      const yaml = ConfigView.toYaml(ConfigView.forRunDirectory(Schema.encodeSync(RunConfig.RunConfig)(config)))
      assert.notInclude(yaml, "redacted")
      const again = yield* RunConfigLoader.decode(Yaml.parse(yaml), "config.yaml")
      assert.deepStrictEqual(again.generator.engine.api_key, { env: "MY_KEY" })
    })
  )
})
