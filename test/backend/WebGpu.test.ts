/**
 * How `auto` looks for a WebGPU adapter without Dawn speaking on the user's terminal. The backend itself (kernels,
 * training on lavapipe) is tested in test/e2e/WebGpu.test.ts.
 */
import { spawnSync } from "node:child_process"
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as WebGpu from "../../src/backend/WebGpu.ts"

/** `WebGpu.<call>()` in a fresh Node process: its result, whether that process got `navigator.gpu`, its stderr. */
const inChild = (call: "probe" | "probeQuietly") => {
  const script =
    `const W = await import("./src/backend/WebGpu.ts")\n` +
    `const adapter = await W.${call}().catch((e) => ({ error: e.message }))\n` +
    `console.log(JSON.stringify({ adapter: adapter ?? null, dawnHere: globalThis.navigator?.gpu !== undefined }))`
  const result = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" })
  assert.strictEqual(result.status, 0, result.stderr)
  const out = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as { adapter: unknown; dawnHere: boolean }
  return { ...out, stderr: result.stderr }
}

describe("WebGpu.gpuDeviceNodes", () => {
  it("lists the render nodes and GPU devices of a /dev, and nothing where only display or control nodes exist", () => {
    const dev = mkdtempSync(join(tmpdir(), "effect-rl-dev-"))
    try {
      mkdirSync(join(dev, "dri"))
      for (const node of ["dri/card0", "nvidiactl", "nvidia-uvm", "null", "tty0"]) writeFileSync(join(dev, node), "")
      assert.deepStrictEqual(WebGpu.gpuDeviceNodes(dev), [])
      for (const node of ["dri/renderD128", "nvidia0", "dxg"]) writeFileSync(join(dev, node), "")
      assert.deepStrictEqual(WebGpu.gpuDeviceNodes(dev), ["dri/renderD128", "dxg", "nvidia0"])
    } finally {
      rmSync(dev, { recursive: true, force: true })
    }
  })

  it("is empty for a /dev without a dri folder", () => {
    const dev = mkdtempSync(join(tmpdir(), "effect-rl-dev-"))
    try {
      assert.deepStrictEqual(WebGpu.gpuDeviceNodes(dev), [])
    } finally {
      rmSync(dev, { recursive: true, force: true })
    }
  })
})

describe("WebGpu.probeQuietly", () => {
  it("finds the adapter probe finds, printing nothing and creating no Dawn instance in the caller", () => {
    const loud = inChild("probe")
    const quiet = inChild("probeQuietly")
    const failed = (a: unknown) => typeof a === "object" && a !== null && "error" in a
    if (failed(loud.adapter)) {
      // no adapter (probe rejects, probeQuietly says none) or no Dawn (both reject)
      assert.isTrue(quiet.adapter === null || failed(quiet.adapter), JSON.stringify(quiet.adapter))
    } else {
      assert.deepStrictEqual(quiet.adapter, loud.adapter)
      assert.isTrue(loud.dawnHere, "an in-process probe is seen")
    }
    assert.strictEqual(quiet.stderr, "", "Dawn's output reached the caller's stderr")
    assert.isFalse(quiet.dawnHere)
  })
})
