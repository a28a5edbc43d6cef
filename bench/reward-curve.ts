/**
 * `npm run bench -- reward-curve [--steps N]` (default 80): the reward curve of a tiny policy learning a task from scratch with GRPO,
 * run in-process through the library API as an embedding app would (configs/copy.yaml: "Say 7" → "7", a 2-layer
 * byte-level model, the single-turn `math` env).
 *
 * A random byte-level policy almost never says the right digit, so the task registers a graded reward function
 * (the library's `Rewards.register`): 1 for the right number, 0.5·(1 − |n − d|/10) for another number, 0 for no number.
 * Prints as its last line `{"bench":"reward-curve","steps":…,"rewardFirst":…,"rewardLast":…,"evalBefore":…,
 * "evalAfter":…,"seconds":…}` (first/last = mean train reward over the first and last 10 steps) and writes
 * bench/out/reward-curve.json (`--out FILE`: bench/results/FILE) with the whole curve.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { Effect, Logger, References } from "effect"
import { readRows } from "../src/cli/TrainCommand.ts"
import * as RunConfigLoader from "../src/config/RunConfigLoader.ts"
import * as Rewards from "../src/env/Rewards.ts"
import * as RunLayers from "../src/layers/RunLayers.ts"
import * as Pipelines from "../src/pipeline/Pipelines.ts"
import { writeResult } from "./args.ts"

const dataDir = "runs/copy-data"
const runDir = "runs/copy"
const stepsFlag = process.argv.indexOf("--steps")
const steps = stepsFlag > 0 ? Number(process.argv[stepsFlag + 1]) : 80

const row = (split: string, i: number, digit: number) =>
  JSON.stringify({
    uid: `copy-${split}-${i}`,
    data_source: "copy",
    env_class: "math",
    prompt: [{ role: "user", content: `Say ${digit}` }],
    reward_spec: { method: "copy_distance", ground_truth: digit }
  })

/** 1 for the right digit, partial credit for another number, 0 for none. */
Rewards.register("copy_distance", (groundTruth, episode) => {
  const numbers = (episode.finalAnswer ?? "").match(/\d+/g)
  if (numbers === null) return 0
  const n = Number(numbers[numbers.length - 1])
  const d = Number(groundTruth)
  return n === d ? 1 : 0.5 * Math.max(0, 1 - Math.abs(n - d) / 10)
})

mkdirSync(dataDir, { recursive: true })
writeFileSync(
  join(dataDir, "train.jsonl"),
  `${Array.from({ length: 800 }, (_, i) => row("train", i, i % 10)).join("\n")}\n`
)
writeFileSync(
  join(dataDir, "val.jsonl"),
  `${Array.from({ length: 20 }, (_, i) => row("val", i, (i * 7) % 10)).join("\n")}\n`
)
rmSync(runDir, { recursive: true, force: true })

const program = Effect.gen(function* () {
  const config = yield* RunConfigLoader.load("configs/copy.yaml", [`trainer.max_steps=${steps}`])
  const train = yield* readRows(config.data.train)
  const val = yield* readRows(config.data.val)
  const started = Date.now()
  const summary = yield* Pipelines.train({ config, runDir, train, val }).pipe(
    Effect.provide(RunLayers.training(config, { runDir, trainRows: train.length }))
  )
  return { summary, seconds: (Date.now() - started) / 1000 }
})

const { summary, seconds } = await Effect.runPromise(
  program.pipe(
    Effect.provide(NodeServices.layer),
    Effect.provideService(Logger.LogToStderr, true),
    Effect.provideService(References.MinimumLogLevel, "Info")
  )
)
const curve = readFileSync(join(runDir, "metrics.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l !== "")
  .map((l) => JSON.parse(l) as Record<string, number | string>)
  .filter((m) => m["event"] === "train")
  .map((m) => Number(m["reward/avg_raw_reward"]))
const mean = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)
const out = {
  bench: "reward-curve",
  config: "configs/copy.yaml",
  steps: curve.length,
  rewardFirst: mean(curve.slice(0, 10)),
  rewardLast: mean(curve.slice(-10)),
  evalBefore: summary.evalBefore?.["all"]?.avg_score,
  evalAfter: summary.evalAfter?.["all"]?.avg_score,
  seconds: Math.round(seconds),
  curve: curve.map((r) => Math.round(r * 1000) / 1000),
  node: process.version,
  date: new Date().toISOString()
}
writeResult("reward-curve.json", out)
console.log(JSON.stringify(out))
