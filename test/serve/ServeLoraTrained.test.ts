/**
 * An adapter trained by the RL trainer (a few GRPO steps over the served checkpoint), saved in PEFT layout and loaded
 * into `serve` through `/v1/load_lora_adapter`, samples with the trainer's log-probs (within 1e-5).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as RunConfig from "../../src/config/RunConfig.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import type { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Serve from "../../src/layers/Serve.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as PolicyModel from "../../src/trainer/PolicyModel.ts"
import * as PolicyTrainer from "../../src/trainer/PolicyTrainer.ts"
import { Trainer } from "../../src/trainer/Trainer.ts"
import * as LoraServe from "../fixtures/LoraServe.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

// prompt "Hi!": the answer "ok" (111, 107) earns 1, "no" (110, 111) earns 0
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
        prompt: [72, 105, 33],
        response: s % 2 === 0 ? [111, 107] : [110, 111],
        reward: s % 2 === 0 ? 1 : 0,
        rolloutLogprob: -Math.log(320)
      })
    )
  }))

describe("a trained adapter in serve", () => {
  it.live("samples with the trainer's log-probs after /v1/load_lora_adapter", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const served = yield* LoraServe.checkpointDir
        const url = yield* Serve.start({
          model: served,
          host: "127.0.0.1",
          port: 0,
          token: undefined,
          modelName: LoraServe.servedName,
          enableLora: true
        }).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
        const config = yield* RunConfigLoader.fromObject({ model: { path: served }, tokenizer: { kind: "byte" } }, [
          "model.lora.rank=4",
          "model.lora.alpha=8",
          "model.lora.target_modules=[q_proj,v_proj,o_proj,gate_proj,down_proj]",
          "trainer.train_batch_size=1",
          "trainer.policy_mini_batch_size=1",
          "trainer.optimizer.lr=0.05",
          "trainer.optimizer.weight_decay=0"
        ])
        const layer = PolicyTrainer.layer({
          trainer: config.trainer,
          derived: RunConfig.derive(config),
          totalSteps: 10
        }).pipe(Layer.provideMerge(PolicyModel.layer(config.model)))
        yield* Effect.gen(function* () {
          const trainer = yield* Trainer
          const { model } = yield* PolicyModel.PolicyModel
          for (let i = 0; i < 3; i++) yield* trainer.step(groups(1))
          const dir = yield* LoraServe.tempDir("trained-adapter-")
          yield* Effect.promise(() => Lora.save(model, dir, Lora.optionsOf(model), served))
          const loaded = yield* LoraServe.post(`${url}/v1/load_lora_adapter`, { lora_name: "trained", lora_path: dir })
          assert.strictEqual(loaded.status, 200, loaded.text)

          const prompt = [72, 105, 33]
          const answer = yield* LoraServe.post(`${url}/v1/completions`, {
            model: "trained",
            prompt,
            max_tokens: 12,
            temperature: 1,
            seed: 5,
            logprobs: 0,
            ignore_eos: true,
            return_token_ids: true
          })
          assert.strictEqual(answer.status, 200, answer.text)
          const choice = (
            answer.json as {
              choices: ReadonlyArray<{ token_ids: Array<number>; logprobs: { token_logprobs: Array<number> } }>
            }
          ).choices[0]!
          const trainerLogprobs = yield* Effect.promise(() => LogProbs.ofIds(model, [...prompt, ...choice.token_ids]))
          const expected = trainerLogprobs.slice(prompt.length - 1)
          assert.strictEqual(expected.length, choice.logprobs.token_logprobs.length)
          choice.logprobs.token_logprobs.forEach((lp, i) => assert.approximately(lp, expected[i]!, 1e-5, `token ${i}`))
          // and it is not the base's sampling: the adapter moved the answer's log-probs
          const base = LoraServe.inProcessLogprobs([...prompt, 111, 107], prompt.length, undefined)
          const tuned = (yield* Effect.promise(() => LogProbs.ofIds(model, [...prompt, 111, 107]))).slice(
            prompt.length - 1
          )
          assert.isAbove(tuned[0]! + tuned[1]!, base[0]! + base[1]! + 0.5, "training raised the rewarded answer")
        }).pipe(Effect.provide(layer))
      })
    )
  )
})
