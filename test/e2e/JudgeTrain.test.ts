/**
 * A judged training run end to end, across processes: `train` (tiny config, every training row judged) against the
 * fixture judge as a separate server that answers badly on a share of calls, then the same run replayed with
 * `tool_io: replay` from its episode log and the judge's URL pointing nowhere: the episodes and metrics come out the
 * same (timings aside).
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"
import { readJsonl } from "../fixtures/Jsonl.ts"

/** The fixture judge as a process, resolved with its URL once it prints it. */
const judgeServer = (args: ReadonlyArray<string>): Promise<{ url: string; child: ChildProcess }> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["test/fixtures/JudgeServer.ts", ...args], {
      stdio: ["ignore", "pipe", "pipe"]
    })
    let out = ""
    child.stdout!.on("data", (c: Buffer) => {
      out += c.toString()
      const line = out.split("\n").find((l) => l.startsWith("{"))
      if (line !== undefined) resolve({ url: (JSON.parse(line) as { url: string }).url, child })
    })
    child.on("exit", (code) => reject(new Error(`judge server exited (${code})`)))
  })

const train = (args: ReadonlyArray<string>) => Cli.runAsync(["train", ...args])

// what differs between two runs of the same config: wall-clock durations and memory readings
const withoutTimes = (value: unknown): unknown =>
  JSON.parse(JSON.stringify(value, (k, v: unknown) => (k === "ms" || k === "llmMs" || k === "envMs" ? undefined : v)))
const trainMetrics = (dir: string) =>
  readJsonl(join(dir, "metrics.jsonl"))
    .filter((m) => m["event"] === "train")
    .map((m) =>
      Object.fromEntries(Object.entries(m).filter(([k]) => !/^(timing|throughput|memory)\//.test(k) && k !== "time"))
    )

describe("train with reward_spec.method judge (configs/tiny.yaml, fixture judge)", () => {
  it("trains on the judge's scores through bad answers, then replays bit-identically with no judge", async () => {
    const judge = await judgeServer(["--seed", "2", "--fault-rate", "0.5"])
    const common = [
      "--config",
      "configs/tiny.yaml",
      "trainer.max_steps=2",
      "trainer.eval_before_train=false",
      "trainer.eval_interval=0",
      "environment.tool_prompt=none", // replayed tools have no descriptions: the prompt must not list them
      "environment.judge.model=fixture-judge",
      "environment.judge.apply_to=all_train_rows"
    ]
    const recorded = mkdtempSync(join(tmpdir(), "effect-rl-judge-"))
    try {
      const first = await train([...common, "--run-dir", recorded, `environment.judge.url=${judge.url}`])
      assert.strictEqual(first.code, 0, first.stderr.slice(-3000))
    } finally {
      judge.child.kill("SIGTERM")
    }
    const metrics = trainMetrics(recorded)
    assert.strictEqual(metrics.length, 2)
    const sum = (key: string) => metrics.reduce((a, m) => a + (m[key] as number), 0)
    assert.strictEqual(sum("judge/groups"), 4) // 2 steps × 2 prompts, each one group
    // half the answers are bad: some were asked again, and each kind is counted
    assert.isAbove(sum("judge/calls"), 4)
    // every rejected answer is asked again, except the last of a group that failed
    const rejected = sum("judge/malformed") + sum("judge/out_of_range") + sum("judge/missing")
    assert.isAbove(rejected, 0)
    assert.strictEqual(sum("judge/calls") - 4, rejected - sum("judge/failed_groups"))
    assert.isAbove(sum("judge/prompt_tokens"), 0)
    const groups = readJsonl(join(recorded, "episodes.jsonl"))
    for (const g of groups) {
      const verdict = g["judge"] as { scores: Array<number>; calls: Array<unknown> }
      const rewards = (g["trajectories"] as Array<{ reward: number }>).map((t) => t.reward)
      assert.deepStrictEqual(rewards, verdict.scores, "each trajectory is paid its score")
    }

    const replayed = mkdtempSync(join(tmpdir(), "effect-rl-judge-replay-"))
    const second = await train([
      ...common,
      "--run-dir",
      replayed,
      "environment.tool_io=replay",
      `environment.replay_from=${join(recorded, "episodes.jsonl")}`,
      "environment.judge.url=http://127.0.0.1:9/v1" // nothing listens there
    ])
    assert.strictEqual(second.code, 0, second.stderr.slice(-3000))
    assert.deepStrictEqual(withoutTimes(readJsonl(join(replayed, "episodes.jsonl"))), withoutTimes(groups))
    assert.deepStrictEqual(trainMetrics(replayed), metrics)
  }, 180_000)

  it("a judged training step with our own serve as the judge: structured outputs make every answer a verdict", async () => {
    // the served judge is the quickstart policy (1024-token context, byte tokenizer): rows with a short reference and
    // rubric, and short transcripts, keep the judge's prompt inside it
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-judge-serve-"))
    const rows = readJsonl("data/toolbox/train.jsonl")
      .slice(0, 4)
      .map((row) => {
        const truth = (row["reward_spec"] as { ground_truth: { answer: unknown } }).ground_truth
        return {
          ...row,
          reward_spec: { method: "judge", ground_truth: { answer: truth.answer }, rubric: "1 if the answer is right." }
        }
      })
    const data = join(dir, "judge-rows.jsonl")
    writeFileSync(data, `${rows.map((r) => JSON.stringify(r)).join("\n")}\n`)
    const served = await Cli.serve(["--model", "data/quickstart/policy", "--port", "0", "--backend", "wasm"])
    const runDir = join(dir, "run")
    try {
      const run = await train([
        "--config",
        "configs/tiny.yaml",
        "--run-dir",
        runDir,
        `data.train=[${data}]`,
        "trainer.max_steps=1",
        "trainer.eval_before_train=false",
        "trainer.eval_interval=0",
        "generator.n_samples_per_prompt=2",
        `environment.judge.url=${served.url}/v1`,
        "environment.judge.model=policy",
        "environment.judge.max_trajectory_chars=40",
        "environment.judge.max_tokens=200",
        "environment.judge.temperature=1" // sampled, so the scores are the policy's, not one greedy string
      ])
      assert.strictEqual(run.code, 0, run.stderr.slice(-3000))
    } finally {
      served.child.kill("SIGTERM")
    }
    const [step] = trainMetrics(runDir)
    assert.isAbove(step!["judge/groups"] as number, 0)
    // parseable, in range and complete on the first answer, every time: no retry, no failed group
    for (const key of ["judge/malformed", "judge/out_of_range", "judge/missing", "judge/failed_groups"]) {
      assert.strictEqual(step![key], 0, key)
    }
    assert.strictEqual(step!["judge/calls"], step!["judge/groups"])
    for (const g of readJsonl(join(runDir, "episodes.jsonl"))) {
      const verdict = g["judge"] as { scores: Array<number> }
      const rewards = (g["trajectories"] as Array<{ reward: number }>).map((t) => t.reward)
      assert.deepStrictEqual(rewards, verdict.scores)
      for (const score of verdict.scores) assert.isTrue(score >= 0 && score <= 1, `score ${score}`)
    }
  }, 180_000)
})
