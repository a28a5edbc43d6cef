/**
 * Long-run memory: the quickstart config trained for `--steps` steps (default 1,000: two epochs of the toolbox's 2,000
 * prompts, no time budget, no evaluations) on each engine in `--engines` (default local,worker,llamacpp), the trainer
 * process's resident set (VmRSS, its worker threads included, its MCP servers not) read from /proc every step. RSS
 * at step `--at` (default 100: start-up, the first checkpoints and the allocator's pools behind it) against RSS at
 * the last step is the growth; above `--limit` (default 0.10) on any engine the bench exits 1.
 *
 * The llama.cpp engine needs `npm run setup:llamacpp` first (without it that engine is skipped, and said so).
 * Build first (`npm run build`). Writes bench/out/soak.json (`--out soak.json`: bench/results/).
 *
 * Run: npm run build && npm run bench -- soak [--steps 1000] [--at 100] [--engines local,worker,llamacpp]
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { arg, writeResult } from "./args.ts"

const steps = Number(arg("steps", "1000"))
const at = Number(arg("at", "100"))
const limit = Number(arg("limit", "0.10"))
const engines = arg("engines", "local,worker,llamacpp").split(",")
const every = Math.max(5, Math.round(steps / 20))

/** The engine's weight sync: the worker engine's own, the trainer's variables for local and llama.cpp. */
const weightSyncOf = (engine: string) => (engine === "worker" ? "worker" : "inprocess")

const rssMiB = (pid: number): number | undefined => {
  try {
    const kb = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]
    return kb === undefined ? undefined : Number(kb) / 1024
  } catch {
    return undefined
  }
}

/**
 * The last `train` step in metrics.jsonl (0 before the first), reading only the lines written since the last call (the
 * file grows all run, and this polls it four times a second beside the run it measures).
 */
const stepReader = (file: string): (() => number) => {
  let offset = 0
  let step = 0
  return () => {
    let bytes: Buffer
    try {
      const fd = fs.openSync(file, "r")
      try {
        const size = fs.fstatSync(fd).size
        bytes = Buffer.alloc(Math.max(0, size - offset))
        fs.readSync(fd, bytes, 0, bytes.length, offset)
      } finally {
        fs.closeSync(fd)
      }
    } catch {
      return step // not written yet
    }
    const complete = bytes.lastIndexOf(0x0a) + 1 // a line being written is read again next time
    offset += complete
    for (const line of bytes.subarray(0, complete).toString("utf8").split("\n")) {
      if (line.includes('"event":"train"')) step = Math.max(step, (JSON.parse(line) as { step: number }).step)
    }
    return step
  }
}

interface EngineResult {
  readonly engine: string
  readonly skipped?: string
  readonly steps?: number
  readonly seconds?: number
  readonly rssMiB?: Record<string, number> // step → RSS, every 20th of the run and at `at` and the last
  readonly growth?: number // (RSS at the last step − RSS at `at`) / RSS at `at`
  /** The run's own memory metrics (memory/*, MB) at `at` and at the last step: which part grew */
  readonly memory?: Record<string, Record<string, number>>
}

/** The memory/* values of the `train` lines at `steps`, from metrics.jsonl. */
const memoryAt = (file: string, steps: ReadonlyArray<number>): Record<string, Record<string, number>> => {
  const out: Record<string, Record<string, number>> = {}
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    if (!line.includes('"event":"train"')) continue
    const m = JSON.parse(line) as Record<string, number>
    if (!steps.includes(m["step"]!)) continue
    out[String(m["step"])] = Object.fromEntries(Object.entries(m).filter(([k]) => k.startsWith("memory/")))
  }
  return out
}

const soak = async (engine: string): Promise<EngineResult> => {
  const runDir = fs.mkdtempSync(path.join(os.tmpdir(), `effect-rl-soak-${engine}-`))
  const args = [
    "dist/main.js",
    "train",
    "--config",
    "configs/quickstart.yaml",
    "--run-dir",
    runDir,
    `generator.engine.kind=${engine}`,
    `pipeline.weight_sync=${weightSyncOf(engine)}`,
    `trainer.max_steps=${steps}`,
    `trainer.epochs=${Math.ceil((steps * 4) / 2000)}`,
    "trainer.max_train_seconds=1000000",
    "trainer.eval_before_train=false",
    `trainer.eval_interval=${steps * 10}`,
    "logging.progress=false"
  ]
  const started = performance.now()
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] })
  let stderr = ""
  child.stderr.on("data", (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-20_000)
  })
  child.stdout.resume()
  const samples: Record<string, number> = {}
  let seen = 0
  const lastStep = stepReader(path.join(runDir, "metrics.jsonl"))
  const poll = setInterval(() => {
    const step = lastStep()
    if (step <= seen) return
    seen = step
    const rss = rssMiB(child.pid!)
    if (rss === undefined) return
    if (step % every === 0 || step === at || step === steps) {
      samples[String(step)] = Number(rss.toFixed(1))
      console.error(`soak ${engine}: step ${step}, RSS ${rss.toFixed(0)} MiB`)
    }
  }, 250)
  const code = await new Promise<number | null>((resolve) => child.on("close", (c) => resolve(c)))
  clearInterval(poll)
  const memory = code === 0 ? memoryAt(path.join(runDir, "metrics.jsonl"), [at, seen]) : {}
  fs.rmSync(runDir, { recursive: true, force: true })
  if (code !== 0) {
    if (engine === "llamacpp" && /setup:llamacpp/.test(stderr)) {
      return { engine, skipped: "node-llama-cpp is not installed (npm run setup:llamacpp)" }
    }
    throw new Error(`soak ${engine}: train exited with ${code}\n${stderr.slice(-3000)}`)
  }
  const first = samples[String(at)]
  const last = samples[String(steps)] ?? samples[String(seen)]
  return {
    engine,
    steps: seen,
    seconds: Number(((performance.now() - started) / 1000).toFixed(0)),
    rssMiB: samples,
    memory,
    ...(first === undefined || last === undefined ? {} : { growth: Number(((last - first) / first).toFixed(4)) })
  }
}

const results: Array<EngineResult> = []
for (const engine of engines) results.push(await soak(engine))
const over = results.filter((r) => r.growth !== undefined && r.growth > limit)
const result = {
  bench: "soak",
  steps,
  at,
  limit,
  results,
  pass: over.length === 0 && results.every((r) => r.skipped !== undefined || r.growth !== undefined),
  cpu: os.cpus()[0]?.model ?? "unknown",
  cores: os.cpus().length,
  node: process.version,
  date: new Date().toISOString(),
  command: `npm run bench -- soak --steps ${steps} --at ${at} --engines ${engines.join(",")}`
}
writeResult("soak.json", result)
console.log(JSON.stringify(result))
if (!result.pass) {
  console.error(
    over.length > 0
      ? `soak: RSS grew more than ${limit * 100}% from step ${at}: ${over.map((r) => `${r.engine} ${(r.growth! * 100).toFixed(1)}%`).join(", ")}`
      : "soak: a run ended before it could be measured"
  )
  process.exit(1)
}
