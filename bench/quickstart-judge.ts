/**
 * The quickstart with the LLM judge instead of the rule reward: starts the fixture judge (test/fixtures/JudgeServer.ts:
 * an OpenAI-compatible server that scores each trajectory of a group against the row's ground truth and, on one call
 * in ten (seeded), answers with broken JSON, a score above 1 or a trajectory left out), runs bench/quickstart.ts on
 * configs/quickstart-judge.yaml pointed at it, and adds to bench/out/quickstart-judge.json (`--out FILE`:
 * bench/results/FILE) the judge's side: the faults it injected, what the run counted (judge/* summed over its steps),
 * and the held-out gain beside the rule-reward run's (bench/results/quickstart.json).
 *
 * Run: npm run build && node bench/quickstart-judge.ts [--fault-rate 0.1] [--seed 1] [--note "..."] [--out FILE]
 *        [-- overrides]
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import * as JudgeServer from "../test/fixtures/JudgeServer.ts"
import { arg, resultFile, resultsDir } from "./args.ts"

const faultRate = Number(arg("fault-rate", "0.1"))
const seed = Number(arg("seed", "1"))
const note = arg("note", "")
const dash = process.argv.indexOf("--")
const overrides = dash >= 0 ? process.argv.slice(dash + 1) : []
const out = resultFile("quickstart-judge.json") // handed to bench/quickstart.ts as it is (absolute)

const judge = await JudgeServer.start({ faultRate, seed, format: "hermes" })
const child = spawn(
  process.execPath,
  [
    path.join(import.meta.dirname, "quickstart.ts"),
    "--config",
    "configs/quickstart-judge.yaml",
    "--out",
    out,
    "--note",
    note,
    "--",
    `environment.judge.url=${judge.url}`,
    ...overrides
  ],
  { stdio: ["ignore", "inherit", "inherit"] }
)
const code: number = await new Promise((resolve) => child.on("close", (c) => resolve(c ?? 1)))
await judge.close()
if (code !== 0) {
  console.error(`bench/quickstart.ts exited with ${code}`)
  process.exit(code)
}

const result = JSON.parse(fs.readFileSync(out, "utf8")) as Record<string, unknown>
const runDir = path.join("runs", "quickstart-judge")
const counted: Record<string, number> = {}
for (const line of fs.readFileSync(path.join(runDir, "metrics.jsonl"), "utf8").split("\n")) {
  if (line.trim() === "") continue
  const m = JSON.parse(line) as Record<string, unknown>
  if (m["event"] !== "train") continue
  for (const [key, value] of Object.entries(m)) {
    if (key.startsWith("judge/") && key !== "judge/score_mean" && typeof value === "number") {
      counted[key] = (counted[key] ?? 0) + value
    }
  }
}
const rule = JSON.parse(fs.readFileSync(path.join(resultsDir, "quickstart.json"), "utf8")) as {
  delta: number
  steps: number
  date: string
}
const delta = result["delta"] as number
const judgeSide = {
  fixture: { faultRate, seed, calls: judge.stats.calls, injected: judge.stats.faults },
  counted,
  ruleRun: { file: "quickstart.json", date: rule.date, steps: rule.steps, delta: rule.delta },
  gainDifference: Number((delta - rule.delta).toFixed(4)),
  withinTolerance: Math.abs(delta - rule.delta) <= 0.05
}
const benchRuns = (result["benchRuns"] as Array<Record<string, unknown>> | undefined) ?? []
const last = benchRuns[benchRuns.length - 1]
if (last !== undefined) Object.assign(last, { judge: judgeSide })
fs.writeFileSync(out, `${JSON.stringify({ ...result, judge: judgeSide, benchRuns }, null, 2)}\n`)
console.log(JSON.stringify({ delta, ...judgeSide }))
