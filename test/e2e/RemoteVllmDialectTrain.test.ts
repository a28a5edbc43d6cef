/**
 * The stale-sampler trap, closed: `train` (a child process, as users run it) with a remote engine in the vLLM dialect
 * writes step 1's weights as a HF directory and has the server reload them (pause → /collective_rpc reload_weights →
 * /reset_prefix_cache → /update_weight_version → /resume), so after step 1 the server — our `serve` standing in for
 * vLLM — samples with the trainer's new policy: its behaviour log-probs for a fixed prompt equal the step-1
 * checkpoint's, and it reports version 1.
 */
import * as fs from "node:fs/promises"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { FetchHttpClient } from "effect/http"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as RemoteEngine from "../../src/inference/RemoteEngine.ts"
import * as Serve from "../../src/layers/Serve.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as TensorFile from "../../src/native/TensorFile.ts"
import * as Cli from "../fixtures/Cli.ts"

const base = "data/quickstart/policy"

const train = (args: ReadonlyArray<string>) => Cli.runAsync(["train", ...args])

/** log p(ids[t] | ids[<t]) for the generated positions, temperature 1, under the checkpoint in `dir`. */
const logprobsUnder = (dir: string, prompt: ReadonlyArray<number>, tokens: ReadonlyArray<number>) =>
  Effect.acquireUseRelease(
    Effect.promise(() => TensorFile.load(dir).then((l) => l.model)),
    (model) =>
      Effect.promise(async () => {
        const { logprobs } = LogProbs.ofSequences(model, { ids: [[...prompt, ...tokens]] })
        const row = (await logprobs.array())[0]!
        logprobs.dispose()
        return row.slice(prompt.length)
      }),
    (model) => Effect.sync(() => Transformer.dispose(model))
  )

describe("train with a remote engine in the vLLM dialect", () => {
  it.live(
    "after step 1 the server samples with the new policy (log-probs within 1e-5) and reports version 1",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
          const url = yield* Serve.start({
            model: base,
            host: "127.0.0.1",
            port: 0,
            token: undefined,
            modelName: "quickstart",
            weightReload: true
          }).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
          const runDir = yield* Effect.acquireRelease(
            Effect.promise(() => fs.mkdtemp(path.join(tmpdir(), "effect-rl-vllm-dialect-"))),
            (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
          )
          const run = yield* Effect.promise(() =>
            train([
              "--config",
              "configs/quickstart.yaml",
              "--run-dir",
              runDir,
              "generator.engine.kind=remote",
              `generator.engine.url=${url}`,
              "generator.engine.dialect=vllm",
              "pipeline.weight_sync=http",
              "pipeline.mode=sync",
              "generator.n_samples_per_prompt=4",
              "generator.max_turns=2",
              "trainer.train_batch_size=2",
              "trainer.policy_mini_batch_size=2",
              "trainer.update_epochs_per_batch=1",
              "trainer.algorithm.advantage_estimator=grpo",
              "trainer.algorithm.zero_variance_filter=false",
              "trainer.optimizer.lr=1.0e-2",
              // decoupled weight decay moves every weight even when a step's advantages are all 0
              "trainer.optimizer.weight_decay=1.0",
              "trainer.max_steps=1",
              "trainer.eval_before_train=false",
              "trainer.eval_interval=0",
              "checkpoint.interval=1",
              "data.max_eval_prompts=1",
              "logging.report=false"
            ])
          )
          assert.strictEqual(run.code, 0, run.stderr.slice(-3000))
          const written = yield* Effect.promise(() => fs.readdir(path.join(runDir, "weights-hf")))
          assert.include(written, "v000001")

          // a fixed prompt, sampled by the server at temperature 1
          const prompt = [...Buffer.from("Add 17 and 25.")]
          const engine = yield* RemoteEngine.make({ url }).pipe(Effect.provide(FetchHttpClient.layer))
          const [result] = yield* engine.generate([
            { promptIds: prompt, sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: 12, seed: 7 } }
          ])
          assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [1, 1])
          const info = yield* Effect.promise(() => fetch(`${url}/weight_info`).then((r) => r.json()))
          assert.deepStrictEqual(info, { weight_version: "1" })

          const trained = yield* logprobsUnder(path.join(runDir, "checkpoints", "step-1"), prompt, result!.tokens)
          const worst = Math.max(...trained.map((lp, i) => Math.abs(lp - result!.logprobs[i]!)))
          assert.isBelow(worst, 1e-5, "behaviour log-probs against the step-1 policy's")
          // and the step changed the policy: the base gives other log-probs for the same tokens
          const before = yield* logprobsUnder(base, prompt, result!.tokens)
          const moved = Math.max(...before.map((lp, i) => Math.abs(lp - result!.logprobs[i]!)))
          assert.isAbove(moved, 1e-4, "step 1 moved the policy")
        })
      ),
    300_000
  )
})
