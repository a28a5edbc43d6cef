import { spawnSync } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { assert, describe, it } from "@effect/vitest"

const root = resolve(import.meta.dirname, "../..")
const cli = join(root, "node_modules/@modelcontextprotocol/conformance/dist/index.js")
const adapter = `${process.execPath} ${join(root, "scripts/conformance-client.ts")}`

/** Runs one client scenario of the MCP conformance suite against McpClient; returns its checks. */
const runScenario = (scenario: string) => {
  const out = mkdtempSync(join(tmpdir(), "effect-rl-conformance-test-"))
  spawnSync(process.execPath, [cli, "client", "--command", adapter, "--scenario", scenario, "-o", out], {
    cwd: root,
    encoding: "utf8",
    timeout: 60_000
  })
  const files: Array<string> = []
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const p = join(d, name)
      if (statSync(p).isDirectory()) walk(p)
      else if (name === "checks.json") files.push(p)
    }
  }
  walk(out)
  assert.strictEqual(files.length, 1, `no checks.json for ${scenario}`)
  return JSON.parse(readFileSync(files[0]!, "utf8")) as Array<{ id: string; status: string; errorMessage?: string }>
}

const failures = (checks: ReadonlyArray<{ id: string; status: string; errorMessage?: string }>) =>
  checks.filter((c) => c.status === "FAILURE").map((c) => `${c.id}: ${c.errorMessage ?? ""}`)

// The whole 2025-11-25 client set is `npm run conformance`; these two cover the OAuth paths McpClient adds.
describe("McpClient against the MCP conformance suite", () => {
  it("auth/scope-step-up: discovery, registration, PKCE, then a second authorization for more scope", () => {
    const checks = runScenario("auth/scope-step-up")
    assert.deepStrictEqual(failures(checks), [])
    assert.isTrue(checks.some((c) => c.id === "scope-step-up-escalation" && c.status === "SUCCESS"))
  })

  it("auth/pre-registration: a configured client id, its secret by env reference, Basic auth at the token endpoint", () => {
    const checks = runScenario("auth/pre-registration")
    assert.deepStrictEqual(failures(checks), [])
    assert.isAtLeast(checks.filter((c) => c.status === "SUCCESS").length, 10)
  })
})
