/**
 * LoRA in RL: the policy trainer trains adapters only over a frozen base, its KL reference is the base (the same
 * forward with the adapters off) or EMA adapters, and its weight sync carries the adapter alone, which every engine
 * path (in-process load, worker thread, file versions) applies with the trainer's log-probs.
 */
import * as fs from "node:fs/promises"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import type { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as WeightSnapshot from "../../src/domain/WeightSnapshot.ts"
import * as WorkerEngine from "../../src/inference/WorkerEngine.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as FileWeightSync from "../../src/sync/FileWeightSync.ts"
import * as PolicyModel from "../../src/trainer/PolicyModel.ts"
import { Trainer } from "../../src/trainer/Trainer.ts"
import * as TinyPolicy from "../fixtures/TinyPolicy.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

const allLinear = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"

// prompt [1, 2]: the answer [5, 6, 7] earns 1, [9, 9, 9] earns 0
const groups = (n: number): Array<TrajectoryGroup> =>
  Array.from({ length: n }, (_, g) => ({
    promptUid: `p${g}`,
    cursor: g,
    dataSource: "test",
    envClass: "test",
    trajectories: [0, 1, 2, 3].map((s) =>
      Trajectories.oneTurn({
        uid: `p${g}`,
        sample: s,
        prompt: [1, 2],
        response: s % 2 === 0 ? [5, 6, 7] : [9, 9, 9],
        reward: s % 2 === 0 ? 1 : 0,
        rolloutLogprob: -Math.log(16)
      })
    )
  }))

const setup = (overrides: ReadonlyArray<string> = []) =>
  Effect.map(
    TinyPolicy.trainer([
      "trainer.train_batch_size=1",
      "trainer.policy_mini_batch_size=1",
      "trainer.micro_train_batch_size=4",
      "trainer.optimizer.lr=0.05",
      "trainer.optimizer.weight_decay=0",
      "model.lora.rank=4",
      "model.lora.alpha=8",
      `model.lora.target_modules=${allLinear}`,
      ...overrides
    ]),
    (x) => x.layer
  )

/** The tiny policy's base as a model of its own (the same seed: the same weights). */
const tinyBase = () =>
  Effect.map(TinyPolicy.trainer([]), ({ config }) =>
    Transformer.init(ModelConfig.fromInit(config.model.init!), TinyPolicy.tinyInit.seed)
  )

const ids = [[1, 2, 5, 6, 7, 3, 9, 4]]
const logProbs = (model: Transformer.Transformer): Promise<Array<number>> => {
  const { logprobs } = LogProbs.ofSequences(model, { ids })
  return logprobs.array().then((rows) => {
    logprobs.dispose()
    return rows[0]!
  })
}

const weightsOf = (model: Transformer.Transformer) =>
  Promise.all([...model.params.values()].map(async (v) => Array.from((await v.data()) as Float32Array)))

const maxDiff = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
  Math.max(...a.map((x, i) => Math.abs(x - b[i]!)))

describe("LoRA RL", () => {
  it.effect("attaches adapters on the MLP and attention; with B at zero the policy is the base, bit for bit", () =>
    Effect.gen(function* () {
      const layer = yield* setup()
      yield* Effect.gen(function* () {
        const { model } = yield* PolicyModel.PolicyModel
        const modules = [...model.adapters.keys()].map((m) => m.split(".").pop())
        for (const m of ["q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]) assert.include(modules, m)
        assert.isTrue(
          [...model.params.values()].every((v) => !v.trainable),
          "the base is frozen"
        )
        const withAdapters = yield* Effect.promise(() => logProbs(model))
        const base = yield* tinyBase()
        const plain = yield* Effect.promise(() => logProbs(base))
        Transformer.dispose(base)
        assert.deepStrictEqual(withAdapters, plain)
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("trains the adapters only, with a KL against the base that is exactly 0 at step 0", () =>
    Effect.gen(function* () {
      const layer = yield* setup([
        "trainer.algorithm.use_kl_loss=true",
        "trainer.algorithm.kl_loss_coef=0.1",
        "trainer.ref=frozen"
      ])
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        const { model } = yield* PolicyModel.PolicyModel
        const baseBefore = yield* Effect.promise(() => weightsOf(model))
        const first = yield* trainer.step(groups(1))
        assert.strictEqual(first.metrics["loss/kl"], 0)
        const second = yield* trainer.step(groups(1))
        assert.isAbove(second.metrics["loss/kl"]!, 0, "after an update the policy has left the base")
        assert.deepStrictEqual(yield* Effect.promise(() => weightsOf(model)), baseBefore, "the base never moves")
        const bNorm = tf.tidy(() =>
          [...model.adapters.values()].reduce((s, a) => s + (tf.sum(tf.abs(a.b)).arraySync() as number), 0)
        )
        assert.isAbove(bNorm, 0, "the adapters moved")
        const state = yield* trainer.state
        assert.isTrue(state.optimizer.names.length > 0)
        assert.isTrue(
          state.optimizer.names.every((n) => /lora_[AB]$/.test(n)),
          state.optimizer.names.join(", ")
        )
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("an EMA reference keeps EMA adapters: KL 0 at step 0, then the reference trails the policy", () =>
    Effect.gen(function* () {
      const layer = yield* setup([
        "trainer.algorithm.use_kl_loss=true",
        "trainer.ref=ema",
        "trainer.ref_ema_decay=0.5",
        "trainer.ref_update_interval=1"
      ])
      yield* Effect.gen(function* () {
        const trainer = yield* Trainer
        assert.strictEqual((yield* trainer.step(groups(1))).metrics["loss/kl"], 0)
        const kl = (yield* trainer.step(groups(1))).metrics["loss/kl"]!
        assert.isAbove(kl, 0)
        assert.isTrue(Number.isFinite(kl))
      }).pipe(Effect.provide(layer))
    })
  )

  it.effect("syncs the adapter alone, which a fresh base, a file version and a worker engine apply exactly", () =>
    Effect.gen(function* () {
      const layer = yield* setup()
      yield* Effect.scoped(
        Effect.gen(function* () {
          const trainer = yield* Trainer
          const { model } = yield* PolicyModel.PolicyModel
          yield* trainer.step(groups(1))
          yield* trainer.step(groups(1))
          const snapshot = yield* trainer.snapshot
          assert.strictEqual(snapshot.names.length, 0, "no full tensors")
          assert.strictEqual(snapshot.adapter!.names.length, 2 * model.adapters.size)
          const full = yield* Effect.promise(() => Snapshot.fromModel(model, PolicyVersion.make(2)))
          assert.isBelow(WeightSnapshot.byteSize(snapshot), WeightSnapshot.byteSize(full) / 2)
          const expected = yield* Effect.promise(() => logProbs(model))

          // a fresh copy of the base takes the adapter: the same log-probs
          const engineModel = yield* Effect.acquireRelease(tinyBase(), (m) => Effect.sync(() => Transformer.dispose(m)))
          Snapshot.load(engineModel, snapshot)
          assert.deepStrictEqual(yield* Effect.promise(() => logProbs(engineModel)), expected)

          // through a file version (PEFT layout on disk)
          const dir = yield* Effect.promise(() => fs.mkdtemp(path.join(tmpdir(), "effect-rl-lora-sync-")))
          const bytes = yield* Effect.promise(() => FileWeightSync.writeVersion(dir, snapshot))
          // the adapter's tensors, their safetensors header and adapter_config.json
          assert.isAbove(bytes, WeightSnapshot.byteSize(snapshot))
          assert.isBelow(bytes, WeightSnapshot.byteSize(snapshot) + 4096)
          const files = yield* Effect.promise(() => fs.readdir(FileWeightSync.versionDir(dir, snapshot.version)))
          assert.sameMembers(files, ["adapter_config.json", "adapter_model.safetensors"])
          const read = yield* Effect.promise(() => FileWeightSync.readVersion(dir, snapshot.version))
          Lora.detach(engineModel)
          Snapshot.load(engineModel, read)
          assert.deepStrictEqual(yield* Effect.promise(() => logProbs(engineModel)), expected)

          // a worker engine starts from the base + adapter and takes later adapters alone; it samples merged weights
          const worker = yield* WorkerEngine.make({
            model,
            backend: { name: "cpu", threads: 0, kernels: "stock" },
            initialVersion: snapshot.version
          })
          const sampleAndCheck = Effect.gen(function* () {
            const [result] = yield* worker.generate([
              { promptIds: [1, 2], sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: 6, seed: 7 } }
            ])
            const tokens = [1, 2, ...result!.tokens]
            const trainer = yield* Effect.promise(() => LogProbs.ofIds(model, tokens))
            assert.isBelow(maxDiff(result!.logprobs, trainer.slice(1)), 1e-5)
          })
          yield* sampleAndCheck
          yield* trainer.step(groups(1))
          const next = yield* trainer.snapshot
          assert.isAbove(next.version, snapshot.version)
          yield* worker.updateWeights(next)
          assert.strictEqual(yield* worker.version, next.version)
          yield* sampleAndCheck
          yield* Effect.promise(() => fs.rm(dir, { recursive: true, force: true }))
        })
      ).pipe(Effect.provide(layer))
    })
  )

  it.effect("rejects a bfloat16 base off the native backend, naming the key", () =>
    Effect.gen(function* () {
      const layer = yield* setup(["model.lora.base_dtype=bfloat16"])
      const error = yield* Effect.flip(
        Effect.provide(
          Effect.gen(function* () {
            return yield* Trainer
          }),
          layer
        )
      )
      assert.include(String(error.message), "backend.name: native")
      assert.include(String((error as { path?: string }).path), "model.lora.base_dtype")
    })
  )
})
