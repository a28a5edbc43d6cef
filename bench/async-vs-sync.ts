/**
 * `npm run bench -- async-vs-sync [--latency-ms 200] [--steps 8] [--batch 2] [--engine worker|local]`: the same tool-latency-bound GRPO run in both
 * pipeline modes, in one bench run. Prints as its last line
 * `{"bench":"async-vs-sync","sync":{"trajectoriesPerMin":…,"finalReward":…},"async":{…},"ratio":…}`
 * and writes bench/results/async-vs-sync.json.
 *
 * Workload: a tiny policy (the tiny config's 2-layer model) warm-started by a short SFT on the toolbox demos of the
 * arithmetic-chain family (cached under bench/.work/), so that it actually calls tools; the toolbox MCP server
 * delays every call by `--latency-ms`; up to 5 turns per trajectory. A random policy would call no tools, and the
 * run would measure decoding, not the pipeline.
 *
 * - sync: B groups generated together (all concurrently), then a training step, then the next batch.
 * - async: K = 2B generation fibers, max_staleness_steps 2, so generation continues while the trainer trains and
 *   while a batch waits for its slowest group.
 * trajectoriesPerMin = trained trajectories / pipeline wall time (the summary's seconds, no eval);
 * finalReward = mean training reward over the last half of the steps.
 *
 * Engine (both modes use the same): `worker` (default) generates in a worker thread with its own tfjs instance and
 * weights shared through SharedArrayBuffers, so in async mode decoding overlaps training on the other core. With
 * `local` (the in-process LocalEngine) decoding and training share one JS thread and wasm instance, and the engine is
 * paused while the trainer updates the shared weights, so async can only hide the tool-call waits (measured ~1.0–1.1×
 * here, where a step is ~80% training).
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"

const root = path.join(import.meta.dirname, "..")
const work = path.join(root, "bench", ".work", "async-vs-sync")
const arg = (name: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback
}

const latencyMs = Number(arg("latency-ms", "200"))
const steps = Number(arg("steps", "8"))
const B = Number(arg("batch", "2")) // groups per step
const n = 4 // trajectories per group
const engineKind = arg("engine", "worker") === "local" ? "local" : "worker"
const tools = ["add", "subtract", "multiply", "divide"]

const model = `
model:
  init:
    architecture: qwen3
    vocab_size: 320
    hidden_size: 64
    intermediate_size: 192
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    head_dim: 16
    seed: 1
tokenizer:
  kind: byte
`

const cli = (args: ReadonlyArray<string>) => {
  const result = spawnSync(process.execPath, ["src/main.ts", ...args], {
    cwd: root,
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1" },
    maxBuffer: 64 * 1024 * 1024
  })
  if (result.status !== 0) {
    process.stderr.write(result.stderr)
    throw new Error(`node src/main.ts ${args.join(" ")} exited ${result.status}`)
  }
  const lines = result.stdout.trim().split("\n")
  return JSON.parse(lines[lines.length - 1]!) as Record<string, unknown>
}

interface Row {
  readonly uid: string
  readonly extra_info?: { readonly family?: string }
}
interface Demo {
  readonly uid: string
  readonly messages: ReadonlyArray<unknown>
}
interface Group {
  readonly cursor: number
  readonly trajectories: ReadonlyArray<{
    readonly reward: number
    readonly turns: ReadonlyArray<{ readonly toolCalls: ReadonlyArray<unknown> }>
  }>
}
type MetricsLine = Readonly<Record<string, number | string>>

const readJsonl = <A>(file: string): Array<A> =>
  fs
    .readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as A)

/** The system text McpToolEnv writes for these tools (compact style), so SFT sees what RL will show. */
const systemText = () => {
  const line = (t: string) => {
    const description = { add: "a + b", subtract: "a - b", multiply: "a * b", divide: "a / b (error if b is 0)" }[t]
    return `${t}(a, b): ${description}`
  }
  return [
    "You can call these tools:",
    ...tools.map(line),
    'To call a tool, write: <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>',
    "When you know the answer, write <answer>…</answer>."
  ].join("\n")
}

/** Rows of the arithmetic-chain family (they use only the four tools), and their demos for SFT. */
const prepareData = () => {
  fs.mkdirSync(work, { recursive: true })
  const rows = readJsonl<Row>(path.join(root, "data/toolbox/train.jsonl")).filter(
    (r) => r.extra_info?.family === "arith_chain"
  )
  const uids = new Set(rows.map((r) => r.uid as string))
  const demos = readJsonl<Demo>(path.join(root, "data/toolbox/demos.jsonl")).filter((d) => uids.has(d.uid))
  const system = systemText()
  fs.writeFileSync(
    path.join(work, "sft.jsonl"),
    demos.map((d) => JSON.stringify({ messages: [{ role: "system", content: system }, ...d.messages] })).join("\n")
  )
  fs.writeFileSync(path.join(work, "train.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n"))
}

/** A policy that calls tools: SFT of the tiny model on the demos (cached). */
const warmStart = (): string => {
  const sftSteps = arg("sft-steps", "200")
  const out = path.join(work, `sft-${sftSteps}`)
  const done = path.join(work, `sft-${sftSteps}-model.txt`)
  if (fs.existsSync(done)) {
    const dir = fs.readFileSync(done, "utf8").trim()
    if (fs.existsSync(path.join(dir, "config.json"))) return dir
  }
  const config = path.join(work, "sft.yaml")
  fs.writeFileSync(
    config,
    `${model}
sft:
  data: [${path.join(work, "sft.jsonl")}]
  max_steps: ${sftSteps}
  batch_size: 8
  micro_batch_size: 8
  max_length: 448
  loss_on: assistant
  optimizer:
    lr: 5.0e-3
    weight_decay: 0.01
    max_grad_norm: 1.0
    warmup_steps: 5
    scheduler: cosine
    min_lr_ratio: 0.1
  log_interval: 10
  output_dir: ${out}
  seed: 7
`
  )
  const t0 = performance.now()
  const summary = cli(["sft", "--config", config])
  process.stderr.write(
    `sft warm start: ${JSON.stringify(summary)} in ${((performance.now() - t0) / 1000).toFixed(0)} s\n`
  )
  const dir = String(summary["checkpoint"])
  fs.writeFileSync(done, dir)
  return dir
}

const rlConfig = (policy: string): string => {
  const file = path.join(work, "rl.yaml")
  fs.writeFileSync(
    file,
    `model:
  path: ${policy}
tokenizer:
  kind: byte
generator:
  n_samples_per_prompt: ${n}
  max_turns: 5
  max_generate_length: 96
  max_input_length: 1024
  max_concurrent_groups: ${B}
  sampling:
    temperature: 0.7
  engine:
    kind: ${engineKind}
environment:
  env_class: mcp_tool
  tool_prompt: compact
  mcp_servers:
    - name: toolbox
      command: node
      args: [src/toolbox/server.ts, --latency-ms, "${latencyMs}"]
      allowed_tools: [${tools.join(", ")}]
trainer:
  train_batch_size: ${B}
  policy_mini_batch_size: ${B}
  micro_train_batch_size: 4
  max_steps: ${steps}
  eval_before_train: false
  algorithm:
    advantage_estimator: grpo
  optimizer:
    lr: 1.0e-4
pipeline:
  weight_sync: ${engineKind === "worker" ? "worker" : "inprocess"}
  max_staleness_steps: 2
  num_generation_workers: ${2 * B}
logging:
  progress: false
data:
  train: [${path.join(work, "train.jsonl")}]
  val: []
`
  )
  return file
}

interface ModeResult {
  readonly trajectoriesPerMin: number
  readonly finalReward: number
  readonly rewardStdErr: number
  readonly seconds: number
  readonly trajectories: number
  readonly avgTurns: number
  readonly toolCallsPerTrajectory: number
  readonly trainSecondsPerStep: number
  readonly waitForGroupsSecondsPerStep: number // sync: the generation phase; async: the trainer waiting for groups
  readonly staleness_mean?: number
  readonly trainer_idle_fraction?: number
}

const mean = (xs: ReadonlyArray<number>) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length)

const runMode = (config: string, mode: "sync" | "async"): ModeResult => {
  const runDir = path.join(work, `run-${mode}`)
  fs.rmSync(runDir, { recursive: true, force: true })
  const summary = cli(["train", "--config", config, "--run-dir", runDir, `pipeline.mode=${mode}`])
  const seconds = Number(summary["seconds"])
  const train = readJsonl<MetricsLine>(path.join(runDir, "metrics.jsonl")).filter((m) => m["event"] === "train")
  const last = train.slice(Math.floor(train.length / 2))
  const groups = readJsonl<Group>(path.join(runDir, "episodes.jsonl"))
  const trajectories = groups.flatMap((g) => g.trajectories)
  const lastRewards = groups
    .filter((g) => g.cursor >= Math.floor(train.length / 2) * B && g.cursor < train.length * B)
    .flatMap((g) => g.trajectories.map((t) => t.reward))
  const sd = Math.sqrt(mean(lastRewards.map((r) => (r - mean(lastRewards)) ** 2)))
  const trained = train.length * B * n
  return {
    trajectoriesPerMin: Math.round((trained / seconds) * 60 * 10) / 10,
    finalReward: Math.round(mean(last.map((m) => m["reward/avg_raw_reward"] as number)) * 1000) / 1000,
    rewardStdErr: Math.round((sd / Math.sqrt(Math.max(1, lastRewards.length))) * 1000) / 1000,
    seconds,
    trajectories: trained,
    avgTurns: Math.round(mean(train.map((m) => m["generate/avg_num_turns"] as number)) * 100) / 100,
    toolCallsPerTrajectory:
      Math.round(mean(trajectories.map((t) => t.turns.reduce((k, turn) => k + turn.toolCalls.length, 0))) * 100) / 100,
    trainSecondsPerStep: Math.round(mean(train.map((m) => m["timing/train_step"] as number)) * 100) / 100,
    waitForGroupsSecondsPerStep:
      Math.round(
        mean(train.map((m) => (m[mode === "sync" ? "timing/generate" : "timing/wait_for_groups"] as number) ?? 0)) * 100
      ) / 100,
    ...(mode === "async"
      ? {
          staleness_mean: Math.round(mean(train.map((m) => m["async/staleness_mean"] as number)) * 100) / 100,
          trainer_idle_fraction:
            Math.round(mean(train.map((m) => m["async/trainer_idle_fraction"] as number)) * 100) / 100
        }
      : {})
  }
}

export const run = async (): Promise<void> => {
  prepareData()
  const policy = warmStart()
  const config = rlConfig(policy)
  const sync = runMode(config, "sync")
  process.stderr.write(`sync: ${JSON.stringify(sync)}\n`)
  const async = runMode(config, "async")
  process.stderr.write(`async: ${JSON.stringify(async)}\n`)
  const result = {
    bench: "async-vs-sync",
    config: {
      latencyMs,
      steps,
      groupsPerStep: B,
      samplesPerGroup: n,
      syncConcurrentGroups: B,
      asyncWorkers: 2 * B,
      maxStaleness: 2,
      engine: engineKind,
      kernels: "native (config default)",
      loadAvg1m: Math.round(os.loadavg()[0]! * 100) / 100
    },
    sync,
    async,
    ratio: Math.round((async.trajectoriesPerMin / sync.trajectoriesPerMin) * 100) / 100,
    note:
      engineKind === "local"
        ? "LocalEngine runs in the trainer's process: decoding and training share one JS thread, so async can overlap " +
          "only tool I/O with compute"
        : "WorkerEngine: decoding runs on the other core; 8 steps of a tiny model, so start-up and the first step weigh " +
          "on both modes"
  }
  fs.mkdirSync(path.join(root, "bench", "results"), { recursive: true })
  fs.writeFileSync(path.join(root, "bench", "results", "async-vs-sync.json"), `${JSON.stringify(result, null, 2)}\n`)
  console.log(JSON.stringify(result))
}
