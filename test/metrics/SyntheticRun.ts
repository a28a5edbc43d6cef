/**
 * A run directory written by the real writers (Metrics, EpisodeLog, ConsumedLog, the train command's config.yaml,
 * a checkpoint's tokenizer files) without training: `steps` steps of 2 groups × 4 samples on a byte tokenizer. Each
 * trajectory calls `add` once (the tool result holds HTML, as model-visible text may) and answers with a multi-byte
 * character; samples 0 and 1 are rewarded from step `steps / 2` on, so reward and pass@n rise.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect, Schema } from "effect"
import * as ConfigView from "../../src/config/ConfigView.ts"
import { RunConfig } from "../../src/config/RunConfig.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import type { Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Metrics from "../../src/metrics/Metrics.ts"
import * as ConsumedLog from "../../src/store/ConsumedLog.ts"
import * as EpisodeLog from "../../src/store/EpisodeLog.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"

export const tokenizer = ByteTokenizer.make()
export const toolResult = `5 <script>alert("pwned")</script> & <b>bold</b>`
export const answer = "The answer is 5 ✓"

const trajectory = (uid: string, sample: number, step: number, rewarded: boolean): Trajectory => {
  const prompt = tokenizer.encode(`<|im_start|>user\nAdd 2 and 3 (${uid}).<|im_end|>\n<|im_start|>assistant\n`)
  const call = tokenizer.encode(`<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call><|im_end|>`)
  const observation = tokenizer.encode(
    `\n<|im_start|>user\n<tool_response>${toolResult}</tool_response><|im_end|>\n<|im_start|>assistant\n`
  )
  const final = tokenizer.encode(`${answer}<|im_end|>`)
  const responseIds = [...call, ...observation, ...final]
  const lossMask = responseIds.map(
    (_, i) => (i < call.length || i >= call.length + observation.length ? 1 : 0) as 0 | 1
  )
  const version = PolicyVersion.make(step - 1)
  const reward = rewarded ? 1 : 0
  const turn = {
    finishReason: "stop" as const,
    policyVersionFirst: version,
    policyVersionLast: version,
    llmMs: 12,
    envMs: 3
  }
  return {
    id: `${uid}/${sample}`,
    promptUid: uid,
    sample,
    promptIds: prompt,
    responseIds,
    lossMask,
    rolloutLogprobs: lossMask.map((m, i) => (m === 1 ? -0.5 - (i % 7) * 0.1 : 0)),
    turns: [
      {
        ...turn,
        start: 0,
        end: call.length,
        reward: 0,
        observationTokens: observation.length,
        toolCalls: [
          {
            id: "c0",
            server: "toolbox",
            tool: "add",
            arguments: { a: 2, b: 3 },
            result: toolResult,
            isError: false,
            ms: 3
          }
        ]
      },
      {
        ...turn,
        start: call.length + observation.length,
        end: responseIds.length,
        reward,
        observationTokens: 0,
        toolCalls: []
      }
    ],
    reward,
    stopReason: "stop",
    envMetrics: { tool_calls: 1 }
  }
}

export const group = (step: number, k: number, steps: number): TrajectoryGroup => {
  const cursor = (step - 1) * 2 + k
  const uid = `toolbox-train-${String(cursor).padStart(5, "0")}`
  return {
    promptUid: uid,
    cursor,
    dataSource: "toolbox",
    envClass: "mcp_tool",
    trajectories: [0, 1, 2, 3].map((s) => trajectory(uid, s, step, step >= steps / 2 && s < 2))
  }
}

/** Reward at `step`: 0 before steps/2, then samples 0 and 1 of every group (0.5). */
export const rewardAt = (step: number, steps: number) => (step >= steps / 2 ? 0.5 : 0)

export const write = (runDir: string, steps: number) =>
  Effect.gen(function* () {
    const config = yield* RunConfigLoader.load("configs/tiny.yaml")
    yield* Effect.promise(async () => {
      await fs.mkdir(runDir, { recursive: true })
      const encoded = Schema.encodeSync(RunConfig)(config)
      await fs.writeFile(path.join(runDir, "config.yaml"), `${ConfigView.toYaml(ConfigView.redact(encoded))}\n`)
    })
    const metrics = yield* Metrics.make(runDir, { progress: false })
    const log = yield* EpisodeLog.make(runDir)
    yield* metrics.record("eval", 0, {
      "eval/toolbox/avg_score": 0.25,
      "eval/toolbox/pass_at_n": 0.5,
      // trainer.eval_group_by: family
      "eval/toolbox/family=unit_sum/avg_score": 0.5,
      "eval/toolbox/family=unit_sum/pass_at_n": 1,
      "eval/toolbox/family=date_span/avg_score": 0,
      "eval/toolbox/family=date_span/pass_at_n": 0,
      "eval/all/avg_score": 0.25,
      "eval/all/pass_at_n": 0.5
    })
    for (let step = 1; step <= steps; step++) {
      const groups = [group(step, 0, steps), group(step, 1, steps)]
      yield* Effect.forEach(groups, (g) => log.append(g), { discard: true })
      yield* ConsumedLog.append(runDir, step, groups)
      const reward = rewardAt(step, steps)
      yield* metrics.record("train", step, {
        "reward/avg_raw_reward": reward,
        "reward/avg_pass_at_n": reward > 0 ? 1 : 0,
        "loss/policy": 0.1 / step,
        "policy/approx_kl": 0.001 * step,
        "policy/clip_frac": 0.01,
        policy_entropy: 5 - step * 0.01,
        "policy/grad_norm": 1.5,
        "policy/lr": 0.001,
        "generate/avg_num_tokens": 100 + step,
        "generate/avg_num_turns": 2,
        "async/staleness_mean": 0.5,
        "async/staleness_max": 1,
        "timing/generate": 2,
        "timing/train_step": 2,
        "timing/step": 4
      })
    }
    yield* metrics.record("eval", steps, {
      "eval/toolbox/avg_score": 0.75,
      "eval/toolbox/pass_at_n": 1,
      "eval/toolbox/family=unit_sum/avg_score": 1,
      "eval/toolbox/family=unit_sum/pass_at_n": 1,
      "eval/toolbox/family=date_span/avg_score": 0.5,
      "eval/toolbox/family=date_span/pass_at_n": 1,
      "eval/all/avg_score": 0.75,
      "eval/all/pass_at_n": 1
    })
    const checkpoint = path.join(runDir, "checkpoints", `step-${steps}`)
    yield* AutoTokenizer.save(tokenizer, checkpoint)
    yield* Effect.promise(() => fs.writeFile(path.join(runDir, "checkpoints", "latest"), `step-${steps}\n`))
  }).pipe(Effect.scoped)
