/**
 * The webgpu backend (tfjs-backend-webgpu through Dawn) against the cpu backend, on whatever Vulkan adapter this
 * machine has: Mesa's lavapipe in CI (scripts/setup-system.sh installs it), a GPU where there is one. The same checks
 * run on a GPU machine as `npm run bench -- webgpu-parity` (bench/results/webgpu-h200.json).
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Parity from "../../bench/webgpu-parity.ts"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as WebGpu from "../../src/backend/WebGpu.ts"
import * as tf from "../../src/tensor/Tf.ts"
import * as Cli from "../fixtures/Cli.ts"

const adapter = await WebGpu.probe().catch((e: Error) => e)
const available = !(adapter instanceof Error)
if (!available) {
  console.warn(
    `webgpu tests skipped: ${adapter.message.split("\n")[0]} (Dawn: npm run setup:webgpu; lavapipe: scripts/setup-system.sh as root)`
  )
}

describe.skipIf(!available)("webgpu backend", () => {
  it("forward, KV-cache decode, both log-prob heads, every gradient and an AdamW step equal the cpu backend's within 1e-4", async () => {
    const { diff, gpu } = await Parity.compare()
    assert.strictEqual(tf.getBackend(), "webgpu")
    for (const [what, d] of Object.entries(diff)) assert.isAtMost(d, 1e-4, `${what}: max |webgpu − cpu| = ${d}`)
    // not vacuous: the update moved the weights and the values are real numbers
    assert.isTrue(gpu.grads.some((g) => g !== 0))
    assert.isTrue(Number.isFinite(gpu.loss) && gpu.gradNorm > 0.5, `grad norm ${gpu.gradNorm} (clipped to 0.5)`)
  })

  it("leaks no tensor or GPU buffer across 100 training steps, and the loss falls", async () => {
    const leak = await Parity.leakCheck(100)
    assert.strictEqual(leak.afterN.tensors, leak.after1.tensors)
    assert.isNotNull(leak.after1.buffers)
    assert.strictEqual(leak.afterN.buffers!.numUsedBuffers, leak.after1.buffers!.numUsedBuffers)
    assert.strictEqual(leak.afterN.buffers!.numBytesUsed, leak.after1.buffers!.numBytesUsed)
    assert.isBelow(leak.lastLoss, leak.firstLoss / 2)
  })

  it("a tensor too large for one shader binding is named before anything is uploaded", () => {
    assert.throws(
      () => WebGpu.checkBindingSize("model.embed_tokens.weight", [151936, 1024 * 64]),
      /model\.embed_tokens\.weight \[151936,65536\] is 37984 MiB, over this WebGPU adapter's maxStorageBufferBindingSize/
    )
    WebGpu.checkBindingSize("small", [16, 16])
  })

  it("train --config configs/tiny.yaml backend.name=webgpu runs GRPO steps to the end", () => {
    const runDir = fs.mkdtempSync(path.join(os.tmpdir(), "effect-rl-webgpu-"))
    try {
      const result = Cli.run(
        [
          "train",
          "--config",
          "configs/tiny.yaml",
          "--run-dir",
          runDir,
          "backend.name=webgpu",
          "trainer.max_steps=2",
          "data.max_eval_prompts=2"
        ],
        { timeoutMs: 600_000 }
      )
      assert.strictEqual(result.code, 0, result.stderr.slice(-2000))
      assert.match(result.stderr, /webgpu adapter: /)
      const summary = JSON.parse(result.lastLine) as { event: string; steps: number }
      assert.deepStrictEqual([summary.event, summary.steps], ["summary", 2])
      const metrics = fs
        .readFileSync(path.join(runDir, "metrics.jsonl"), "utf8")
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line) as Record<string, unknown>)
      const steps = metrics.filter((m) => m["event"] === "train" && typeof m["loss/policy"] === "number")
      assert.isAtLeast(steps.length, 2, "two training steps in metrics.jsonl")
      assert.isTrue(fs.existsSync(path.join(runDir, "checkpoints", "step-2", "model.safetensors")))
    } finally {
      fs.rmSync(runDir, { recursive: true, force: true })
    }
  }, 600_000) // lavapipe is slow: these two steps took over 2 minutes on a busy 2-core machine

  it("auto takes a hardware adapter only: a software one (lavapipe) is skipped unless asked for by name", async () => {
    const info = await Effect.runPromise(TensorBackend.initialise({ name: "auto", threads: 0, kernels: "stock" }))
    if (adapter instanceof Error) return
    if (adapter.software) assert.notStrictEqual(info.name, "webgpu")
    else assert.strictEqual(info.name, "webgpu")
  })
})
