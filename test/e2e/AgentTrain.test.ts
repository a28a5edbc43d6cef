/**
 * An agent nobody adapted for effect-rl trains through `generator.agent`: `train` with configs/agent-ai-sdk.yaml runs
 * examples/agents/ai-sdk-agent.mjs (the Vercel AI SDK's own loop, an OpenAI-compatible provider, the toolbox's MCP
 * tools) for every sample. The run's metrics show the recorded tokens retrace exactly (the trainer's log-probs of the
 * recorded ids against the recorded ones), its episodes hold the rewards and the calls the agent made, and no agent
 * process outlives it; `replay` trains the recorded stream again with no program. Needs `npm run setup:agents` (the examples' SDKs); without them the test skips.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"
import { readJsonl } from "../fixtures/Jsonl.ts"

const installed = existsSync("examples/agents/node_modules/ai")

/** Processes whose command line names `needle`. */
const running = (needle: string) =>
  readdirSync("/proc")
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, "utf8").includes(needle)
      } catch {
        return false
      }
    })

interface Trajectory {
  readonly stopReason: string
  readonly reward: number
  readonly error?: string
  readonly steps?: unknown
  readonly turns: ReadonlyArray<{
    readonly toolCalls: ReadonlyArray<{ readonly tool: string; readonly isError: boolean }>
  }>
}

describe.skipIf(!installed)("train an AI SDK agent through generator.agent (configs/agent-ai-sdk.yaml)", () => {
  it("retraces every recorded token, records rewards and tool calls, and leaves no agent behind", async () => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-agent-train-"))
    try {
      const result = await Cli.runAsync([
        "train",
        "--config",
        "configs/agent-ai-sdk.yaml",
        "--run-dir",
        dir,
        "trainer.max_steps=3",
        "trainer.eval_before_train=false",
        "data.val=[]",
        "generator.n_samples_per_prompt=4",
        "generator.sampling.temperature=1",
        "pipeline.max_staleness_steps=0" // on-policy: the recorded log-probs are the trainer's to float precision
      ])
      assert.strictEqual(result.code, 0, result.stderr.slice(-3000))
      const metrics = readJsonl(join(dir, "metrics.jsonl")).filter((m) => m["event"] === "train")
      assert.strictEqual(metrics.length, 3)
      for (const m of metrics) {
        assert.isAtMost(m["policy/rollout_logprob_abs_diff"] as number, 1e-4, JSON.stringify(m))
      }
      const trajectories = readJsonl(join(dir, "episodes.jsonl")).flatMap(
        (g) => g["trajectories"] as ReadonlyArray<Trajectory>
      )
      assert.isAtLeast(trajectories.length, 12)
      const finished = trajectories.filter((t) => t.stopReason === "stop")
      assert.isAbove(finished.length, trajectories.length * 0.8, JSON.stringify(trajectories.map((t) => t.error)))
      // the agent's tools ran (the toolbox through the MCP SDK) and the reward_spec scored the transcripts
      const calls = finished.flatMap((t) => t.turns.flatMap((turn) => turn.toolCalls))
      assert.isAbove(calls.filter((c) => !c.isError).length, trajectories.length)
      assert.isAbove(Math.max(...finished.map((t) => t.reward)), 0)
      // the AI SDK's re-serialised calls print back as they were sampled: one row per trajectory
      assert.isAbove(finished.filter((t) => t.steps === undefined).length, finished.length * 0.9)
      assert.deepStrictEqual(running("ai-sdk-agent.mjs"), [])
      // the recorded stream trains again with no program at all
      const replayed = await Cli.runAsync([
        "replay",
        "--episodes",
        join(dir, "episodes.jsonl"),
        "--config",
        "configs/agent-ai-sdk.yaml",
        "--run-dir",
        join(dir, "replayed"),
        "generator.agent.command=[/nonexistent/agent]"
      ])
      assert.strictEqual(replayed.code, 0, replayed.stderr.slice(-3000))
      assert.strictEqual(
        readJsonl(join(dir, "replayed", "metrics.jsonl")).filter((m) => m["event"] === "train").length,
        3
      )
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 600_000)

  it("trains in the sync pipeline too, and resumes", async () => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-agent-sync-"))
    const common = [
      "--config",
      "configs/agent-ai-sdk.yaml",
      "--run-dir",
      dir,
      "pipeline.mode=sync",
      "trainer.eval_before_train=false",
      "data.val=[]",
      "generator.n_samples_per_prompt=4",
      "trainer.train_batch_size=2",
      "trainer.policy_mini_batch_size=2",
      "checkpoint.interval=1"
    ]
    try {
      const first = await Cli.runAsync(["train", ...common, "trainer.max_steps=1"])
      assert.strictEqual(first.code, 0, first.stderr.slice(-3000))
      const resumed = await Cli.runAsync(["train", ...common, "trainer.max_steps=2", "--resume", "latest"])
      assert.strictEqual(resumed.code, 0, resumed.stderr.slice(-3000))
      const steps = readJsonl(join(dir, "metrics.jsonl"))
        .filter((m) => m["event"] === "train")
        .map((m) => m["step"])
      assert.deepStrictEqual(steps, [1, 2])
      assert.deepStrictEqual(running("ai-sdk-agent.mjs"), [])
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 600_000)
})
