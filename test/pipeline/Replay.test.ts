import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import { type Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Cli from "../fixtures/Cli.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

const trajectory = (uid: string, sample: number, response: ReadonlyArray<number>, reward: number): Trajectory =>
  Trajectories.oneTurn({ uid, sample, prompt: [258, 117, 10], response, reward, rolloutLogprob: -5.7, ms: 1 })

const encode = Schema.encodeSync(Schema.fromJsonString(TrajectoryGroup))

const config = `
model:
  init: { vocab_size: 320, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, seed: 5 }
tokenizer: { kind: byte }
backend: { name: wasm }
generator: { n_samples_per_prompt: 2 }
trainer:
  train_batch_size: 2
  policy_mini_batch_size: 2
  optimizer: { lr: 0.01 }
logging: { progress: false }
`

describe("replay", () => {
  it("trains from a recorded episode log with no sampling or servers, bit-identically twice; a torn last line is skipped", () => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-replay-"))
    const episodes = join(dir, "episodes.jsonl")
    const lines = Array.from({ length: 6 }, (_, g) =>
      encode({
        promptUid: `p${g}`,
        cursor: g,
        dataSource: "test",
        envClass: "math",
        trajectories: [trajectory(`p${g}`, 0, [55, 259], 1), trajectory(`p${g}`, 1, [57, 48, 259], 0)]
      })
    )
    writeFileSync(episodes, `${lines.join("\n")}\n`)
    appendFileSync(episodes, '{"promptUid":"p6","cur') // a crash mid-write
    const file = join(dir, "replay.yaml")
    writeFileSync(file, config)
    const runs = ["a", "b"].map((name) => {
      const result = Cli.run(["replay", "--episodes", episodes, "--config", file, "--run-dir", join(dir, name)], {
        timeoutMs: 300_000
      })
      assert.strictEqual(result.code, 0, result.stderr.slice(-2000))
      return JSON.parse(result.lastLine) as { steps: number; groups: number; checkpoint: string }
    })
    assert.strictEqual(runs[0]!.steps, 3) // 6 complete groups / 2 per step
    assert.strictEqual(runs[0]!.groups, 6)
    const weights = runs.map((r) => readFileSync(join(r.checkpoint, "model.safetensors")))
    assert.isTrue(weights[0]!.equals(weights[1]!), "the same log gives the same weights")
    const trained = readFileSync(join(dir, "a", "metrics.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, number>)
    assert.strictEqual(trained.length, 3)
    for (const m of trained) {
      assert.strictEqual(m["trainer/optimizer_updates"], 1)
      assert.isAbove(m["policy/grad_norm"]!, 0) // the weights moved
    }
    const init = Cli.run(["model", "logprobs", "--model", runs[0]!.checkpoint, "--ids", "258,117,10,55"])
    assert.strictEqual(init.code, 0, init.stderr)
  }, 600_000)
})
