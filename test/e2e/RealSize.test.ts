/**
 * Qwen3-0.6B at its real size (596,049,920 parameters, vocab 151,936, 28 layers), on a random-init checkpoint with the
 * model's exact config written by scripts/make-checkpoint.ts, on the `native` backend (tensors in JS memory: the wasm
 * heap's 4 GB cannot hold it): it loads, its log-probs equal the float64 PyTorch reference
 * (test/fixtures/reference/qwen3_reference.py) within 1e-3, it samples with the KV cache exactly as without, and it
 * takes one full-parameter Adam step that raises the log-probs of what it trained on.
 *
 * Slow (about 2 minutes, up to 10 GB): skipped where the native kernels did not build, or with EFFECT_RL_SKIP_SLOW=1.
 * The reference needs `/usr/bin/python3` with torch + numpy (scripts/setup-system.sh installs them); without them
 * that one check is skipped.
 */
import { execFileSync, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as NativeKernels from "../../src/native/NativeKernels.ts"
import * as TensorFile from "../../src/native/TensorFile.ts"

const python = "/usr/bin/python3"
const root = path.join(import.meta.dirname, "../..")
const torchAvailable = spawnSync(python, ["-c", "import torch, numpy"], { encoding: "utf8" }).status === 0
const run = NativeKernels.status().available && process.env["EFFECT_RL_SKIP_SLOW"] !== "1"

const idsOf = (seed: number, length: number) => {
  const prng = Prng.make(seed)
  return Array.from({ length }, () => Math.floor(prng.next() * 151936))
}

describe.skipIf(!run)("Qwen3-0.6B at real size on the native backend", { timeout: 600_000 }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "qwen3-0.6b-"))
  let model: Transformer.Transformer
  beforeAll(async () => {
    execFileSync(
      process.execPath,
      [path.join(root, "scripts/make-checkpoint.ts"), "--preset", "qwen3-0.6b", "--out", dir, "--seed", "3"],
      { stdio: ["ignore", "ignore", "inherit"] }
    )
    await Effect.runPromise(TensorBackend.initialise({ name: "native", threads: 0, kernels: "native" }))
    model = (await TensorFile.load(dir)).model
  }, 600_000)
  afterAll(() => {
    if (model !== undefined) Transformer.dispose(model)
    fs.rmSync(dir, { recursive: true, force: true })
  })

  it("loads with the real shapes", () => {
    assert.strictEqual(model.config.vocabSize, 151936)
    assert.strictEqual(model.config.numLayers, 28)
    const count = [...model.params.values()].reduce((n, v) => n + v.size, 0)
    assert.strictEqual(count, 596049920)
  })

  it.skipIf(!torchAvailable)("gives the float64 PyTorch reference's log-probs within 1e-3", async () => {
    const ids = idsOf(1, 24)
    const ours = await LogProbs.ofIds(model, ids)
    const script = path.join(root, "test/fixtures/reference/qwen3_reference.py")
    const out = execFileSync(python, [script], {
      input: JSON.stringify([{ model: dir, ids: [ids] }]),
      encoding: "utf8"
    })
    const expected = (JSON.parse(out) as Array<{ logprobs: Array<Array<number>> }>)[0]!.logprobs[0]!.slice(1)
    assert.strictEqual(ours.length, expected.length)
    const spread = Math.max(...expected) - Math.min(...expected)
    assert.isAbove(spread, 0.5, "the reference's log-probs vary: the comparison can tell models apart")
    ours.forEach((lp, t) => assert.approximately(lp, expected[t]!, 1e-3, `token ${t + 1}`))
  })

  it("samples with the KV cache as it does recomputing everything", async () => {
    const requests = [idsOf(2, 12), idsOf(3, 7)].map((promptIds) => ({
      promptIds,
      sampling: { ...Sampling.defaultParams, temperature: 0, maxNewTokens: 4 }
    }))
    const cached = await Sampling.generate(model, requests)
    const reference = await Sampling.generate(model, requests, { useCache: false })
    assert.deepStrictEqual(
      cached.map((c) => c.tokens),
      reference.map((c) => c.tokens)
    )
    cached.forEach((c, i) => {
      assert.strictEqual(c.tokens.length, 4)
      c.logprobs.forEach((lp, t) => assert.approximately(lp, reference[i]!.logprobs[t]!, 1e-3))
    })
  })

  it("takes a full-parameter Adam step that raises the log-probs it trained on", async () => {
    const ids = [idsOf(4, 64), idsOf(5, 64)]
    const mean = async () => {
      const lp = tf.tidy(() => tf.mean(LogProbs.ofSequences(model, { ids }).logprobs))
      return (await lp.data().finally(() => lp.dispose()))[0]!
    }
    const before = await mean()
    const optimizer = NativeKernels.adam(1e-4)
    const tensors = tf.memory().numTensors
    const loss = optimizer.minimize(
      () => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar,
      true,
      Transformer.trainableVariables(model)
    )!
    const lossValue = (await loss.data())[0]!
    loss.dispose()
    assert.approximately(-lossValue, before, 1e-3, "the step's loss is the log-prob before it")
    // Adam keeps two moments per weight (2 × 311 tensors), nothing else is left
    assert.strictEqual(tf.memory().numTensors - tensors, 2 * model.params.size)
    const after = await mean()
    assert.isAbove(after, before + 0.01, `mean log-prob ${before} → ${after}`)
    optimizer.dispose()
  })
})
