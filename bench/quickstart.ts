/**
 * The quickstart's acceptance run: `node dist/main.js train --config configs/quickstart.yaml` (build first:
 * `npm run build`), timed from spawn to exit, with the load average sampled every 5 s while it runs (the cores may
 * be shared: the figure says what the run competed with). Writes bench/out/quickstart.json:
 * `{ seconds, steps, evalBefore, evalAfter, delta, at, machineLoad, backend, ... }`, delta = the change of
 * `all.avg_score` (the goal is ≥ 0.30 in ≤ 600 s on 2 cores), `at` = the held-out score at each eval during training.
 * Other keys already in the file (earlier sessions' records) are kept, and each run is appended to `benchRuns`.
 *
 * `--out NAME` records the run in the committed results instead, bench/results/NAME (e.g. quickstart-lora.json for
 * configs/quickstart-lora.yaml). A run of another config is reported beside the quickstart's recorded figures; every
 * result also holds the per-family held-out change (`families`: eval_group_by's lines, before → after).
 *
 * Run: npm run build && npx node bench/quickstart.ts [--config configs/quickstart.yaml] [--out quickstart.json] [--note "..."] [extra overrides after --]
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { arg, resultFile, resultsDir } from "./args.ts"

const config = arg("config", "configs/quickstart.yaml")
const note = arg("note", "")
const dash = process.argv.indexOf("--")
const overrides = dash >= 0 ? process.argv.slice(dash + 1) : []

const loads: Array<number> = []
const sampler = setInterval(() => loads.push(os.loadavg()[0]!), 5000)
const start = performance.now()
const child = spawn(process.execPath, ["dist/main.js", "train", "--config", config, ...overrides], {
  stdio: ["ignore", "pipe", "inherit"]
})
let stdout = ""
child.stdout.on("data", (chunk: Buffer) => {
  stdout += chunk.toString()
})
const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
  child.on("close", (c, s) => resolve([c, s]))
)
const seconds = (performance.now() - start) / 1000
clearInterval(sampler)
if (code !== 0) {
  // what the run printed (its last lines: a typed failure's summary lands on stdout), and how it ended
  console.error(stdout.trim().split("\n").slice(-20).join("\n"))
  console.error(
    `train ${signal === null ? `exited with ${code}` : `was killed by ${signal}`} after ${seconds.toFixed(0)} s`
  )
  process.exit(code ?? 1)
}
const lines = stdout.trim().split("\n")
const summary = JSON.parse(lines[lines.length - 1]!) as {
  steps: number
  seconds: number
  runDir: string
  evalBefore?: { all: { avg_score: number; pass_at_n: number; prompts: number } }
  evalAfter?: { all: { avg_score: number; pass_at_n: number; prompts: number } }
}
const resolved = fs.readFileSync(path.join(summary.runDir, "config.yaml"), "utf8")
const field = (key: string) => resolved.match(new RegExp(`^\\s*${key}: (.*)$`, "m"))?.[1]
/** Held-out `all.avg_score` at each eval during training (step → score), from the run's metrics. */
const heldOutAt: Record<string, number> = {}
for (const line of fs.readFileSync(path.join(summary.runDir, "metrics.jsonl"), "utf8").split("\n")) {
  if (line.trim() === "") continue
  const m = JSON.parse(line) as Record<string, unknown>
  const score = m["eval/all/avg_score"]
  if (m["event"] === "eval" && typeof score === "number" && m["step"] !== 0) {
    heldOutAt[String(m["step"])] = Number(score.toFixed(3))
  }
}
const before = summary.evalBefore?.all
const after = summary.evalAfter?.all
type EvalLines = Record<string, { avg_score: number }> | undefined
/** Per family (eval_group_by lines, `<source>/family=<f>`): held-out avg_score before, after, and the change. */
const familiesOf = (before: EvalLines, after: EvalLines) => {
  const out: Record<string, { before: number; after: number; delta: number }> = {}
  for (const [key, value] of Object.entries(after ?? {})) {
    const family = key.split("/family=")[1]
    const b = before?.[key]?.avg_score
    if (family === undefined || b === undefined) continue
    const a = value.avg_score
    out[family] = { before: Number(b.toFixed(3)), after: Number(a.toFixed(3)), delta: Number((a - b).toFixed(3)) }
  }
  return out
}
const families = familiesOf(summary.evalBefore as EvalLines, summary.evalAfter as EvalLines)
const mean = (xs: Array<number>) => (xs.length === 0 ? os.loadavg()[0]! : xs.reduce((a, b) => a + b, 0) / xs.length)
const result = {
  bench: "quickstart",
  config,
  overrides,
  seconds,
  pipelineSeconds: summary.seconds,
  steps: summary.steps,
  evalBefore: summary.evalBefore,
  evalAfter: summary.evalAfter,
  delta: before !== undefined && after !== undefined ? after.avg_score - before.avg_score : null,
  families,
  goal: { seconds: 600, delta: 0.3 },
  machineLoad: { loadavg1mMean: mean(loads), loadavg1mMax: Math.max(...loads, 0), cores: os.cpus().length },
  backend: { name: field("name"), kernels: field("kernels") },
  cpu: os.cpus()[0]?.model ?? "unknown",
  node: process.version,
  date: new Date().toISOString(),
  note
}
// a run of another config is reported beside the full quickstart's recorded figures, family by family
const reference = path.join(resultsDir, "quickstart.json")
const beside =
  path.resolve(config) !== path.resolve("configs/quickstart.yaml") && fs.existsSync(reference)
    ? (() => {
        const q = JSON.parse(fs.readFileSync(reference, "utf8")) as Record<string, unknown>
        return {
          file: "quickstart.json",
          date: q["date"],
          steps: q["steps"],
          delta: q["delta"],
          families: familiesOf(q["evalBefore"] as EvalLines, q["evalAfter"] as EvalLines)
        }
      })()
    : undefined
Object.assign(result, beside === undefined ? {} : { beside })
console.log(JSON.stringify(result))
// The file also holds what earlier runs and sessions recorded beside the latest run: those keys are kept, and every
// bench run is appended, in short, to `benchRuns`.
const out = resultFile("quickstart.json")
const earlier = fs.existsSync(out) ? (JSON.parse(fs.readFileSync(out, "utf8")) as Record<string, unknown>) : {}
const benchRuns = Array.isArray(earlier["benchRuns"]) ? (earlier["benchRuns"] as Array<unknown>) : []
benchRuns.push({
  date: result.date,
  overrides,
  steps: result.steps,
  pipelineSeconds: result.pipelineSeconds,
  evalBefore: before?.avg_score,
  at: heldOutAt,
  evalAfter: after?.avg_score,
  delta: result.delta,
  note
})
fs.writeFileSync(out, `${JSON.stringify({ ...earlier, ...result, at: heldOutAt, benchRuns }, null, 2)}\n`)
