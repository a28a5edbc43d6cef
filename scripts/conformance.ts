/**
 * `npm run conformance`: the MCP conformance suite (@modelcontextprotocol/conformance), client side, every scenario
 * of requirement set 2025-11-25 (`conformance list --client`: initialize, tools_call, elicitation defaults, SSE
 * retry and the auth/* OAuth scenarios), against `scripts/conformance-client.ts`, an adapter built on McpClient.
 *
 * Scenarios run one at a time (the runner's `--suite` runs them in parallel, and sse-retry measures reconnection
 * timing, which a loaded 2-core machine skews). A scenario passes when none of its checks is a FAILURE; a WARNING
 * (e.g. "reconnected slightly late … acceptable") is reported, not failed. Exit 0 only when every scenario passes.
 * Prints one JSON summary line last.
 */
import { spawnSync } from "node:child_process"
import { existsSync, mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"

const root = resolve(import.meta.dirname, "..")
const specVersion = "2025-11-25"
const cli = join(root, "node_modules/@modelcontextprotocol/conformance/dist/index.js")
const adapter = `${process.execPath} ${join(root, "scripts/conformance-client.ts")}`
const work = mkdtempSync(join(tmpdir(), "effect-rl-conformance-"))

const listed = spawnSync(process.execPath, [cli, "list", "--client"], { cwd: root, encoding: "utf8" })
const scenarios = listed.stdout
  .split("\n")
  .map((line) => /^\s*-\s+(\S+)\s+\[([^\]]*)\]/.exec(line))
  .filter((m): m is RegExpExecArray => m !== null && m[2]!.split(",").includes(specVersion))
  .map((m) => m[1]!)
if (scenarios.length === 0) {
  console.error(`no client scenarios for ${specVersion} in:\n${listed.stdout}${listed.stderr}`)
  process.exit(1)
}

interface Check {
  readonly id: string
  readonly status: string
  readonly errorMessage?: string
}

/** The newest checks.json under `dir` (the runner names result folders by scenario and time). */
const findChecks = (dir: string): ReadonlyArray<Check> | undefined => {
  if (!existsSync(dir)) return undefined
  const files: Array<string> = []
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const p = join(d, name)
      if (statSync(p).isDirectory()) walk(p)
      else if (name === "checks.json") files.push(p)
    }
  }
  walk(dir)
  const newest = files.sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0]
  return newest === undefined ? undefined : (JSON.parse(readFileSync(newest, "utf8")) as ReadonlyArray<Check>)
}

const results: Array<{ scenario: string; passed: number; failed: number; warnings: number; ok: boolean }> = []
for (const scenario of scenarios) {
  const out = join(work, scenario.replaceAll("/", "_"))
  const run = spawnSync(
    process.execPath,
    [cli, "client", "--command", adapter, "--scenario", scenario, "--spec-version", specVersion, "-o", out],
    { cwd: root, encoding: "utf8", timeout: 120_000 }
  )
  const checks = findChecks(out) ?? []
  const failed = checks.filter((c) => c.status === "FAILURE")
  const warnings = checks.filter((c) => c.status === "WARNING")
  const ok = checks.length > 0 && failed.length === 0
  results.push({
    scenario,
    passed: checks.filter((c) => c.status === "SUCCESS").length,
    failed: failed.length,
    warnings: warnings.length,
    ok
  })
  console.log(`${ok ? "✓" : "✗"} ${scenario}: ${results.at(-1)!.passed} passed, ${failed.length} failed`)
  for (const c of [...failed, ...warnings]) console.log(`    ${c.status} ${c.id}: ${c.errorMessage ?? ""}`)
  if (checks.length === 0)
    console.log(`    no checks recorded (runner exit ${run.status}):\n${run.stdout}${run.stderr}`)
}

const failedScenarios = results.filter((r) => !r.ok).map((r) => r.scenario)
console.log(
  JSON.stringify({
    conformance: "client",
    specVersion,
    scenarios: results.length,
    passed: results.length - failedScenarios.length,
    failed: failedScenarios,
    warnings: results.filter((r) => r.warnings > 0).map((r) => r.scenario),
    results: work
  })
)
process.exit(failedScenarios.length === 0 ? 0 : 1)
