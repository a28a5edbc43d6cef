/**
 * `npm run bench -- cluster [flags]`: trajectories per minute of the async pipeline with its groups rolled out by 1, 2
 * and 4 `runner` processes (`pipeline.rollouts: cluster`, Postgres from scripts/local-postgres.sh, a fresh one per
 * measurement), and the same work through local async rollouts (the trainer's own Generator) in the same bench run.
 * Prints as its last line `{"bench":"cluster","trajectoriesPerMin":{"1":…,"2":…,"4":…},"localAsync":…,…}` and writes
 * bench/out/cluster.json (`--out FILE`: bench/results/FILE).
 *
 * Workload: tool-latency-bound agent rollouts: the quickstart policy (data/quickstart/policy, hermes tool calls on the
 * toolbox tasks) whose toolbox MCP server sleeps a uniformly random `--latency-ms` (500-1000) per call. Each runner
 * rolls out at most `--slots` groups at once (generator.max_concurrent_groups: the capacity of one machine's MCP
 * servers, sandboxes and engine), so throughput grows with the runners; the trainer keeps `--workers` groups in flight
 * (pipeline.num_generation_workers, max_staleness_steps high enough to admit them), more than the runners' slots, so
 * a runner whose shards drew fewer groups does not sit idle. Local async runs the same config with the trainer's own
 * generator and the same number of generation fibers (no per-machine slot limit: the figure one machine reaches when
 * its CPU and tool servers are not the limit).
 *
 * trajectoriesPerMin = trained trajectories / the pipeline's wall time (the summary's seconds: runners are registered
 * before the trainer starts; no eval). All processes share this machine's cores.
 *
 * Flags (defaults): --latency-ms 500-1000, --groups 48, --batch 2 (groups per step), --samples 2, --slots 1,
 * --workers 16, --max-turns 4, --runners 1,2,4, --out FILE.
 */
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { arg, writeResult } from "./args.ts"

const root = path.join(import.meta.dirname, "..")
const work = path.join(root, "bench", ".work", "cluster")
const latency = arg("latency-ms", "500-1000")
const groups = Number(arg("groups", "48"))
const B = Number(arg("batch", "2"))
const n = Number(arg("samples", "2"))
const slots = Number(arg("slots", "1"))
const K = Number(arg("workers", "16"))
const maxTurns = Number(arg("max-turns", "4"))
const runnerCounts = arg("runners", "1,2,4").split(",").map(Number)
const steps = Math.floor(groups / B)
const S = Math.max(1, Math.ceil(K / B) - 1) // admits K groups ahead of the trainer

const config = (rollouts: "local" | "cluster"): string => {
  fs.mkdirSync(work, { recursive: true })
  const file = path.join(work, `${rollouts}.yaml`)
  fs.writeFileSync(
    file,
    `backend:
  name: wasm
  kernels: native
  threads: 1
model:
  path: ${path.join(root, "data/quickstart/policy")}
tokenizer:
  kind: byte
generator:
  n_samples_per_prompt: ${n}
  max_turns: ${maxTurns}
  max_generate_length: 96
  max_input_length: 640
  max_concurrent_groups: ${slots}
  sampling:
    temperature: 0.7
  engine:
    kind: local
environment:
  env_class: mcp_tool
  tool_prompt: none
  tool_call_format: hermes
  mcp_servers:
    - name: toolbox
      command: node
      args: [${path.join(root, "src/toolbox/server.ts")}, --latency-ms, "${latency}"]
trainer:
  train_batch_size: ${B}
  policy_mini_batch_size: ${B}
  micro_train_batch_size: ${B * n}
  max_steps: ${steps}
  eval_before_train: false
  algorithm:
    advantage_estimator: grpo
  optimizer:
    lr: 3.0e-5
pipeline:
  mode: async
  max_staleness_steps: ${S}
  num_generation_workers: ${K}
  weight_sync: file
  rollouts: ${rollouts}
  cluster:
    storage: sql
    sql_url: { env: DATABASE_URL }
    failover_seconds: 5
logging:
  report: false
data:
  train: [${path.join(root, "data/toolbox/train.jsonl")}]
  val: []
`
  )
  return file
}

const freePort = (): number =>
  Number(
    execFileSync(process.execPath, [
      "-e",
      'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
    ]).toString()
  )

const startRunner = (file: string, weights: string, env: NodeJS.ProcessEnv) =>
  new Promise<ChildProcess>((resolve, reject) => {
    const port = freePort()
    const child = spawn(
      process.execPath,
      ["src/main.ts", "runner", "--config", file, "--host", "127.0.0.1", "--port", String(port), "--weights", weights],
      { cwd: root, stdio: ["ignore", "pipe", "pipe"], env }
    )
    let stdout = ""
    let stderr = ""
    child.stdout!.on("data", (c: Buffer) => {
      stdout += c.toString()
      if (stdout.includes('"event":"runner"')) resolve(child)
    })
    child.stderr!.on("data", (c: Buffer) => {
      stderr += c.toString()
    })
    child.on("exit", (code) => reject(new Error(`runner exited (${code}) before registering:\n${stderr.slice(-2000)}`)))
  })

const stop = (child: ChildProcess) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null) return resolve()
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000)
    child.on("exit", () => {
      clearTimeout(timer)
      resolve()
    })
    child.kill("SIGTERM")
  })

const train = (file: string, runDir: string, env: NodeJS.ProcessEnv) => {
  const result = spawnSync(process.execPath, ["src/main.ts", "train", "--config", file, "--run-dir", runDir], {
    cwd: root,
    encoding: "utf8",
    env,
    maxBuffer: 64 * 1024 * 1024
  })
  if (result.status !== 0) {
    process.stderr.write(result.stderr.slice(-4000))
    throw new Error(`train --config ${file} exited ${result.status}`)
  }
  const summary = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as { groups: number; seconds: number }
  const perMin = Math.round(((summary.groups * n) / summary.seconds) * 60 * 10) / 10
  return { ...summary, trajectoriesPerMin: perMin }
}

/** One measurement with `runners` runner processes (0: local async), on a fresh Postgres. */
const measure = async (runners: number) => {
  const pg = execFileSync("bash", [path.join(root, "scripts/local-postgres.sh"), "start"], { encoding: "utf8" })
  const pgDir = /PG_DIR=(.*)/.exec(pg)![1]!
  const env = { ...process.env, NO_COLOR: "1", DATABASE_URL: /DATABASE_URL=(.*)/.exec(pg)![1]! }
  const runDir = path.join(work, runners === 0 ? "local" : `runners-${runners}`)
  fs.rmSync(runDir, { recursive: true, force: true })
  const children: Array<ChildProcess> = []
  try {
    const file = config(runners === 0 ? "local" : "cluster")
    for (let i = 0; i < runners; i++) children.push(await startRunner(file, path.join(runDir, "weights"), env))
    const r = train(file, runDir, env)
    process.stderr.write(`${runners === 0 ? "local async" : `${runners} runner(s)`}: ${JSON.stringify(r)}\n`)
    return r
  } finally {
    await Promise.all(children.map(stop))
    execFileSync("bash", [path.join(root, "scripts/local-postgres.sh"), "stop", pgDir])
  }
}

export const run = async () => {
  const loadBefore = fs.readFileSync("/proc/loadavg", "utf8").trim()
  const perRunners: Record<string, number> = {}
  const detail: Record<string, unknown> = {}
  for (const r of runnerCounts) {
    const m = await measure(r)
    perRunners[String(r)] = m.trajectoriesPerMin
    detail[String(r)] = m
  }
  const local = await measure(0)
  const base = perRunners[String(runnerCounts[0])]!
  const result = {
    bench: "cluster",
    trajectoriesPerMin: perRunners,
    localAsync: local.trajectoriesPerMin,
    speedup: Object.fromEntries(Object.entries(perRunners).map(([k, v]) => [k, Math.round((v / base) * 100) / 100])),
    detail: { ...detail, localAsync: local },
    setup: {
      latencyMs: latency,
      groups,
      batch: B,
      samples: n,
      slotsPerRunner: slots,
      workers: K,
      maxStaleness: S,
      maxTurns
    },
    date: new Date().toISOString(),
    command: `npm run bench -- cluster ${process.argv.slice(3).join(" ")}`.trim(),
    machine: {
      cpus: os.cpus().length,
      loadavgBefore: loadBefore,
      loadavgAfter: fs.readFileSync("/proc/loadavg", "utf8").trim()
    }
  }
  writeResult("cluster.json", result)
  console.log(JSON.stringify(result))
}
