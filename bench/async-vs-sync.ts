/**
 * `npm run bench -- async-vs-sync [flags]`: the same tool-latency-bound GRPO run in both pipeline modes, in one bench
 * run (one after the other). Prints as its last line
 * `{"bench":"async-vs-sync","sync":{"trajectoriesPerMin":…,"finalReward":…},"async":{…},"ratio":…}`,
 * writes bench/out/async-vs-sync.json and appends the run to async-vs-sync-runs.json beside it (`--out FILE`:
 * bench/results/FILE and bench/results/async-vs-sync-runs.json, the recorded runs; a first run into bench/out/ starts
 * from those); the result's `repeats` gives every recorded ratio of the same config and their median (the figure to
 * quote: one run on the shared 2-core machine is noisy).
 *
 * Workload: the shipped SFT warm start (data/quickstart/policy, set up as configs/quickstart.yaml: tool_prompt none,
 * hermes tool calls, data/toolbox/train.jsonl; 119 K parameters until 2026-11-22, the 363 K policy since); the toolbox
 * MCP server sleeps a uniformly random `--latency-ms MIN-MAX` per call (default 500-1000); up to 6 turns per
 * trajectory. A small lr (default 3e-5) keeps the policy, and so the reward, comparable between the modes, and few
 * trajectories per step keep the training step short next to a group's generation (turns × (decode + tool wait)), so
 * the run measures the pipeline, not the trainer.
 *
 * - sync: SyncPipeline, the B groups of a step generated all concurrently, then train, then the next batch.
 * - async: AsyncPipeline, max_staleness_steps S, K = (S + 1)·B generation fibers (enough for S + 1 steps of groups in
 *   flight), so generation runs ahead while the trainer trains and while a step waits for its slowest group.
 * Both modes train the same prompts (same order and sampling seeds), so the same number of trajectories.
 *
 * trajectoriesPerMin = trained trajectories / pipeline wall time (the summary's seconds: no eval, no process start);
 * finalReward = mean reward of the trajectories trained in the last half of the steps, ± rewardStdErr (the standard
 * error over those trajectories), so "equal within noise" is |Δ| ≲ 2·√(se_sync² + se_async²).
 *
 * Flags (defaults): --latency-ms 500-1000, --steps 16, --batch 1 (groups per step), --samples 4 (per group),
 * --staleness 4, --workers (S + 1)·B, --lr 3e-5, --micro 1 (trajectories per forward/backward: the trainer yields to
 * the event loop between micro-batches, and rows of one trajectory carry no padding), --engine worker|local,
 * --threads 1 (per tfjs instance; 0 = one per core), --max-turns 6, --note "…". Repeats of one setup alternate which
 * mode runs first (the machine's other jobs come and go); the setup names the trainer revision, so runs of an older
 * trainer are not pooled with newer ones.
 * Engine (both modes use the same): `worker` (default) decodes in a worker thread with its own tfjs instance, so
 * decoding can overlap training on the other core (with --threads 1 the trainer and the decoder take one core each
 * instead of spinning 2 + 2 threads on 2 cores); `local` decodes in the trainer's thread and is paused while the
 * trainer updates the shared weights. Either way the agent loops (turn hand-offs, tool calls and replies) run on the
 * trainer's thread; the training step yields to the event loop before every forward pass and before the optimizer
 * update, so they move on during a step. Compare the modes' `groupSeconds`, `llmMsPerTurn` and `toolMsPerCall`.
 *
 * What decides the ratio: async hides the tool waits and the training step behind generation of other groups, so it
 * is bounded by how fast the decoder (one worker thread) gets through all the turns. Measured 2026-11 (wasm + native
 * kernels, 2 shared cores, load 4–9), trainer of e3bc770 (yields; no separate π_old pass), --micro 1 --threads 1:
 * - 50–200 ms tools: median 1.24× over 5 repeats (1.21–1.78), equal reward (paired Δ within 2 se every time). Sync
 *   trains a step in 0.2–0.36 s and generates it in 0.56–0.72 s; async steps take ≈0.62 s, gated by the decoder:
 *   llm time per turn 376–439 ms in async against 35–78 ms in sync, while tool time per call stays ≈155 ms (sync
 *   ≈130 ms). Measured with timers in the engine (then removed): the worker's decoder is busy 77–80% of an async run
 *   (≈30% in sync): decode ≈5.3 s, copying the KV cache when rows join or finish ≈4.5 s (the cache is compacted on
 *   every join and finish, ≈6 rows decode together in async against 1.7 in sync), prefill ≈2.1 s of 12 s busy (the
 *   prefix cache is dropped on every weight update; keeping it would save only ≈6%). At 50–200 ms on 2 shared cores
 *   the work is decode-bound, not tool-latency-bound. The earlier trainer (a separate π_old pass, no yields,
 *   micro-batch 4, 2 threads) gave 1.26× (1.02–1.87), with 240–505 ms per tool call in async.
 * - 500–1000 ms tools (the default since 2026-11-22; `--latency-ms 500-1000 --steps 16`): 3.07× with the 119 K
 *   policy (earlier trainer 2.75×): the pipeline delivers once the work is tool-latency-bound. The figures of the
 *   363 K policy are in bench/results/async-vs-sync.json.
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { arg, resultFile, resultsDir } from "./args.ts"

const root = path.join(import.meta.dirname, "..")
const work = path.join(root, "bench", ".work", "async-vs-sync")

const latency = arg("latency-ms", "500-1000")
const steps = Number(arg("steps", "16"))
const B = Number(arg("batch", "1")) // groups per step
const n = Number(arg("samples", "4")) // trajectories per group
const S = Number(arg("staleness", "4"))
const K = Number(arg("workers", String((S + 1) * B)))
const lr = arg("lr", "3.0e-5")
const maxTurns = Number(arg("max-turns", "6"))
const engineKind = arg("engine", "worker") === "local" ? "local" : "worker"
const micro = Number(arg("micro", "1")) // trajectories per forward/backward: the trainer yields between micro-batches
const threads = Number(arg("threads", "1")) // tfjs/native-kernel threads per tfjs instance (0 = one per core)
const note = arg("note", "")
/** Which trainer the runs measured: repeats of a setup are only pooled with runs of the same trainer. */
const trainer = "yields to the event loop, no separate pi_old pass (e3bc770)"

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

interface Group {
  readonly cursor: number
  readonly trajectories: ReadonlyArray<{
    readonly reward: number
    readonly turns: ReadonlyArray<{
      readonly toolCalls: ReadonlyArray<unknown>
      readonly llmMs: number
      readonly envMs: number
    }>
    readonly envMetrics: Readonly<Record<string, number>>
  }>
}
type MetricsLine = Readonly<Record<string, number | string>>

const readJsonl = <A>(file: string): Array<A> =>
  fs
    .readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as A)

const rlConfig = (): string => {
  fs.mkdirSync(work, { recursive: true })
  const file = path.join(work, "rl.yaml")
  fs.writeFileSync(
    file,
    `backend:
  name: wasm
  kernels: native
  threads: ${threads}
model:
  path: ${path.join(root, "data/quickstart/policy")}
tokenizer:
  kind: byte
generator:
  n_samples_per_prompt: ${n}
  max_turns: ${maxTurns}
  max_generate_length: 96
  max_input_length: 640
  max_concurrent_groups: ${B}
  sampling:
    temperature: 0.7
  engine:
    kind: ${engineKind}
environment:
  env_class: mcp_tool
  tool_prompt: none
  tool_call_format: hermes
  mcp_servers:
    - name: toolbox
      command: node
      args: [src/toolbox/server.ts, --latency-ms, "${latency}"]
trainer:
  train_batch_size: ${B}
  policy_mini_batch_size: ${B}
  micro_train_batch_size: ${micro}
  max_steps: ${steps}
  eval_before_train: false
  algorithm:
    advantage_estimator: grpo
    grpo_norm_by_std: false
    loss_reduction: sequence_mean
    eps_clip_low: 0.2
    eps_clip_high: 0.28
  optimizer:
    lr: ${lr}
    weight_decay: 0
    max_grad_norm: 1.0
  seed: 42
pipeline:
  weight_sync: ${engineKind === "worker" ? "worker" : "inprocess"}
  max_staleness_steps: ${S}
  num_generation_workers: ${K}
checkpoint:
  interval: 0
logging:
  progress: false
data:
  train: [${path.join(root, "data/toolbox/train.jsonl")}]
  val: []
`
  )
  return file
}

interface ModeResult {
  /** mean reward per trained group of the last half of the steps, by cursor (for the paired comparison) */
  readonly groupRewards: ReadonlyMap<number, number>
  readonly trajectoriesPerMin: number
  readonly finalReward: number
  readonly rewardStdErr: number
  readonly seconds: number
  readonly trajectories: number
  readonly avgTurns: number
  readonly toolCallsPerTrajectory: number
  readonly trainSecondsPerStep: number
  /** sync: the generation phase of a step; async: the trainer waiting for its step's groups. */
  readonly waitForGroupsSecondsPerStep: number
  /** Where a trajectory's time goes: engine time per turn (queueing + prefill + decode, as the agent loop sees it) and
   * tool time per call (the server's sleep + the wait for this process to read the reply). */
  readonly llmMsPerTurn: number
  readonly toolMsPerCall: number
  /** A group's generation time: its slowest trajectory's summed llm + env time. */
  readonly groupSeconds: number
  readonly loadavg1m: readonly [number, number] // before, after
  readonly staleness_mean?: number
  readonly staleness_max?: number
  readonly trainer_idle_fraction?: number
  readonly generator_idle_fraction?: number
}

const mean = (xs: ReadonlyArray<number>) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length)
const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits
const load = () => round(os.loadavg()[0]!, 2)

const runMode = (config: string, mode: "sync" | "async"): ModeResult => {
  const runDir = path.join(work, `run-${mode}`)
  fs.rmSync(runDir, { recursive: true, force: true })
  const loadBefore = load()
  const summary = cli(["train", "--config", config, "--run-dir", runDir, `pipeline.mode=${mode}`])
  const loadAfter = load()
  const seconds = Number(summary["seconds"])
  const train = readJsonl<MetricsLine>(path.join(runDir, "metrics.jsonl")).filter((m) => m["event"] === "train")
  const groups = readJsonl<Group>(path.join(runDir, "episodes.jsonl")).filter((g) => g.cursor < train.length * B)
  const half = Math.floor(train.length / 2) * B
  const lastRewards = groups.filter((g) => g.cursor >= half).flatMap((g) => g.trajectories.map((t) => t.reward))
  const m = mean(lastRewards)
  const sd = Math.sqrt(
    mean(lastRewards.map((r) => (r - m) ** 2)) * (lastRewards.length / Math.max(1, lastRewards.length - 1))
  )
  const trajectories = groups.flatMap((g) => g.trajectories)
  const trained = train.length * B * n
  const turns = trajectories.flatMap((t) => t.turns)
  const calls = trajectories.reduce((k, t) => k + (t.envMetrics["env/tool_calls"] ?? 0), 0)
  const toolMs = trajectories.reduce((k, t) => k + (t.envMetrics["env/tool_ms"] ?? 0), 0)
  const trajectoryMs = (t: Group["trajectories"][number]) => t.turns.reduce((k, x) => k + x.llmMs + x.envMs, 0)
  const metric = (key: string) => mean(train.map((x) => (x[key] as number | undefined) ?? 0))
  const groupRewards = new Map(
    groups.filter((g) => g.cursor >= half).map((g) => [g.cursor, mean(g.trajectories.map((t) => t.reward))] as const)
  )
  return {
    groupRewards,
    trajectoriesPerMin: round((trained / seconds) * 60, 1),
    finalReward: round(m),
    rewardStdErr: round(sd / Math.sqrt(Math.max(1, lastRewards.length))),
    seconds,
    trajectories: trained,
    avgTurns: round(metric("generate/avg_num_turns"), 2),
    toolCallsPerTrajectory: round(
      mean(trajectories.map((t) => t.turns.reduce((k, turn) => k + turn.toolCalls.length, 0))),
      2
    ),
    trainSecondsPerStep: round(metric(mode === "sync" ? "timing/train_step" : "timing/train_and_sync"), 2),
    waitForGroupsSecondsPerStep: round(metric(mode === "sync" ? "timing/generate" : "timing/wait_for_groups"), 2),
    llmMsPerTurn: Math.round(mean(turns.map((t) => t.llmMs))),
    toolMsPerCall: Math.round(toolMs / Math.max(1, calls)),
    groupSeconds: round(mean(groups.map((g) => Math.max(...g.trajectories.map(trajectoryMs)) / 1000)), 2),
    loadavg1m: [loadBefore, loadAfter],
    ...(mode === "async"
      ? {
          staleness_mean: round(metric("async/staleness_mean"), 2),
          staleness_max: Math.max(...train.map((x) => x["async/staleness_max"] as number)),
          trainer_idle_fraction: round(metric("async/trainer_idle_fraction"), 2),
          generator_idle_fraction: round(metric("async/generator_idle_fraction"), 2)
        }
      : {})
  }
}

const median = (xs: ReadonlyArray<number>) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length === 0
    ? 0
    : s.length % 2 === 1
      ? s[(s.length - 1) / 2]!
      : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

export const run = async (): Promise<void> => {
  const setup = {
    policy: "data/quickstart/policy",
    latencyMs: latency,
    maxTurns,
    steps,
    groupsPerStep: B,
    samplesPerGroup: n,
    microBatch: micro,
    lr: Number(lr),
    syncConcurrentGroups: B,
    asyncWorkers: K,
    maxStaleness: S,
    engine: engineKind,
    backend: "wasm + native kernels",
    threads,
    trainer
  }
  const config = rlConfig()
  const file = resultFile("async-vs-sync.json")
  const historyFile = path.join(path.dirname(file), "async-vs-sync-runs.json")
  // the runs recorded so far: those beside the result, else the committed ones (a first run into bench/out/)
  const recorded = [historyFile, path.join(resultsDir, "async-vs-sync-runs.json")].find((f) => fs.existsSync(f))
  const history =
    recorded === undefined
      ? []
      : (JSON.parse(fs.readFileSync(recorded, "utf8")) as Array<{ setup: unknown; ratio: number }>)
  // the other jobs on the machine come and go: alternate which mode runs first between repeats of a setup, so a
  // drifting load does not always favour the same one
  const repeat = history.filter((h) => JSON.stringify(h.setup) === JSON.stringify(setup)).length
  const order: ReadonlyArray<"sync" | "async"> = repeat % 2 === 0 ? ["sync", "async"] : ["async", "sync"]
  const measured: Partial<Record<"sync" | "async", ModeResult>> = {}
  for (const mode of order) {
    measured[mode] = runMode(config, mode)
    process.stderr.write(`${mode}: ${JSON.stringify({ ...measured[mode], groupRewards: undefined })}\n`)
  }
  const sync = measured.sync!
  const async = measured.async!
  const ratio = round(async.trajectoriesPerMin / sync.trajectoriesPerMin, 2)
  // both modes train the same prompts with the same sampling seeds: pair the groups by cursor, which takes the
  // prompts' difficulty out of the noise
  const diffs = [...sync.groupRewards].flatMap(([c, r]) => {
    const a = async.groupRewards.get(c)
    return a === undefined ? [] : [a - r]
  })
  const d = mean(diffs)
  const dSe = Math.sqrt(mean(diffs.map((x) => (x - d) ** 2)) / Math.max(1, diffs.length - 1))
  const reward = {
    delta: round(async.finalReward - sync.finalReward),
    unpaired2se: round(2 * Math.sqrt(sync.rewardStdErr ** 2 + async.rewardStdErr ** 2)),
    pairedGroups: diffs.length,
    paired2se: round(2 * dSe),
    equalWithinNoise: Math.abs(d) <= 2 * dSe
  }
  const { groupRewards: _s, ...syncOut } = sync
  const { groupRewards: _a, ...asyncOut } = async
  const entry = { date: new Date().toISOString(), setup, order, ratio, sync: syncOut, async: asyncOut, reward, note }
  history.push(entry)
  fs.writeFileSync(historyFile, `${JSON.stringify(history, null, 2)}\n`)
  const same = history.filter((h) => JSON.stringify(h.setup) === JSON.stringify(setup)).map((h) => h.ratio)

  const result = {
    bench: "async-vs-sync",
    config: setup,
    sync: syncOut,
    async: asyncOut,
    ratio,
    reward,
    repeats: { ratios: same, median: round(median(same), 2) },
    goal: "async ≥ 2× sync trajectories/min at equal final reward",
    cpus: os.cpus().length,
    note
  }
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`)
  console.log(JSON.stringify(result))
}
