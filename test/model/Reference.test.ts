/**
 * The tfjs forward agrees with an independent float64 PyTorch implementation of HF's Qwen3 forward
 * (test/fixtures/reference/qwen3_reference.py) on tiny random checkpoints written by our own Safetensors writer.
 * Needs `/usr/bin/python3` with torch + numpy (Debian: python3-torch python3-numpy); skips otherwise.
 */
import { execFileSync, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as ModelCommand from "../../src/cli/ModelCommand.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as Transformer from "../../src/model/Transformer.ts"

const python = "/usr/bin/python3"
const script = path.join(import.meta.dirname, "../fixtures/reference/qwen3_reference.py")
const torchCheck = spawnSync(python, ["-c", "import torch, numpy"], { encoding: "utf8" })
const torchAvailable = torchCheck.status === 0
if (!torchAvailable) {
  console.warn(
    "SKIPPED model reference test: `/usr/bin/python3 -c 'import torch, numpy'` failed " +
      "(install with `apt-get install -y python3-torch python3-numpy`)"
  )
}

interface RefRequest {
  readonly model: string
  readonly ids: Array<Array<number>>
  readonly mask?: Array<Array<number>>
}
/** All requests in one Python process (importing torch takes seconds). */
const reference = (requests: ReadonlyArray<RefRequest>): Array<Array<Array<number>>> => {
  const out = execFileSync(python, [script], { input: JSON.stringify(requests), encoding: "utf8" })
  return (JSON.parse(out) as Array<{ logprobs: Array<Array<number>> }>).map((r) => r.logprobs)
}

/** Random HF-layout weights with O(1) logits (std 0.02 would make every distribution nearly uniform). */
const randomModel = (config: ModelConfig.TransformerConfig, seed: number): Transformer.Transformer => {
  const prng = Prng.make(seed)
  const arrays = new Map(
    Transformer.parameterSpecs(config).map((spec) => {
      const size = spec.hfShape.reduce((a, b) => a * b, 1)
      const fanIn = spec.hfShape.length === 2 ? spec.hfShape[1]! : 1
      const data = Float32Array.from({ length: size }, () =>
        spec.init === "ones"
          ? 1 + 0.3 * prng.normal()
          : spec.init === "zeros"
            ? 0.1 * prng.normal()
            : prng.normal() / Math.sqrt(fanIn)
      )
      return [spec.name, { shape: spec.hfShape, data }] as const
    })
  )
  return Transformer.fromHfArrays(config, (name) => arrays.get(name))
}

const base = {
  architecture: "qwen3" as const,
  vocab_size: 97,
  hidden_size: 48,
  intermediate_size: 80,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  rope_theta: 1000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 256
}

const llama3Scaling = {
  rope_type: "llama3",
  factor: 8,
  low_freq_factor: 1,
  high_freq_factor: 4,
  original_max_position_embeddings: 64
} as const

const cases = [
  {
    name: "tied, F32, head_dim 16 ≠ 48/4, 2 KV heads",
    dtype: "F32",
    init: { ...base, num_key_value_heads: 2, head_dim: 16, tie_word_embeddings: true }
  },
  {
    name: "untied, BF16, head_dim 8, 1 KV head",
    dtype: "BF16",
    init: { ...base, num_key_value_heads: 1, head_dim: 8, tie_word_embeddings: false }
  },
  {
    name: "untied, F32, 4 KV heads (MHA), head_dim = 12",
    dtype: "F32",
    init: { ...base, num_key_value_heads: 4, tie_word_embeddings: false }
  },
  {
    name: "qwen2 (q/k/v bias), tied, BF16",
    dtype: "BF16",
    init: { ...base, architecture: "qwen2" as const, num_key_value_heads: 2, tie_word_embeddings: true }
  },
  {
    name: "llama, untied, F32",
    dtype: "F32",
    init: { ...base, architecture: "llama" as const, num_key_value_heads: 2, tie_word_embeddings: false }
  },
  {
    // wavelengths 2π·θ^(2i/16): 6.3 (< 64/4, kept), 32.5 (between, interpolated), ≥ 168 (> 64/1, divided by 8); 40
    // positions turn each band's angles far enough apart that a wrong band moves the log-probs
    name: "llama, llama3 RoPE scaling (all three frequency bands), tied, F32, 40 tokens",
    dtype: "F32",
    tokens: 40,
    init: {
      ...base,
      architecture: "llama" as const,
      num_key_value_heads: 2,
      head_dim: 16,
      tie_word_embeddings: true,
      rope_theta: 500000,
      rope_scaling: llama3Scaling
    }
  }
] as const
const tokensOf = (c: (typeof cases)[number]) => ("tokens" in c ? c.tokens : 24)
const llama3Case = cases.findIndex((c) => "rope_scaling" in c.init)

const raggedIds = [
  [0, 0, 0, 5, 9, 13, 2, 40, 41],
  [7, 8, 9, 10, 11, 12, 13, 14, 15]
]
const raggedMask = [
  [0, 0, 0, 1, 1, 1, 1, 1, 1],
  [1, 1, 1, 1, 1, 1, 1, 1, 1]
]
const idsOf = (i: number, vocab: number, length = 24) => {
  const prng = Prng.make(i)
  return Array.from({ length }, () => Math.floor(prng.next() * vocab))
}

describe.skipIf(!torchAvailable)("model logprobs vs a float64 PyTorch reference of HF's forward", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "model-ref-"))
  const dirOf = (i: number) => path.join(tmp, `case${i}`)
  const unscaledDir = path.join(tmp, "llama3-unscaled") // the llama3 case's weights, config.json without rope_scaling
  let expected: Array<Array<Array<number>>> = []
  beforeAll(async () => {
    await Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" }))
    for (const [i, c] of cases.entries()) {
      const built = randomModel(ModelConfig.fromInit(c.init), 100 + i)
      await Checkpoint.save(built, dirOf(i), { dtype: c.dtype })
      Transformer.dispose(built)
    }
    fs.cpSync(dirOf(llama3Case), unscaledDir, { recursive: true })
    const hf = JSON.parse(fs.readFileSync(path.join(unscaledDir, "config.json"), "utf8"))
    fs.writeFileSync(path.join(unscaledDir, "config.json"), JSON.stringify({ ...hf, rope_scaling: null }))
    const llama3 = cases[llama3Case]!
    expected = reference([
      ...cases.map((c, i) => ({ model: dirOf(i), ids: [idsOf(i, c.init.vocab_size, tokensOf(c))] })),
      { model: dirOf(0), ids: raggedIds, mask: raggedMask },
      { model: unscaledDir, ids: [idsOf(llama3Case, llama3.init.vocab_size, tokensOf(llama3))] }
    ])
  })
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

  cases.forEach((c, i) => {
    it(`${c.name}: every token's log-prob within 1e-4`, async () => {
      const { model } = await Checkpoint.load(dirOf(i))
      const ids = idsOf(i, c.init.vocab_size, tokensOf(c))
      const ours = await LogProbs.ofIds(model, ids)
      // the function behind `model logprobs --model DIR --ids ...` gives the same numbers
      assert.deepStrictEqual(await Effect.runPromise(ModelCommand.logprobs(dirOf(i), ids)), ours)
      const theirs = expected[i]![0]!.slice(1)
      assert.strictEqual(ours.length, tokensOf(c) - 1)
      const maxErr = Math.max(...ours.map((v, t) => Math.abs(v - theirs[t]!)))
      assert.isBelow(maxErr, 1e-4, `max |Δ logp| = ${maxErr}`)
      // the distributions are not near-uniform, so agreement is informative
      assert.isAbove(Math.max(...theirs.map((v) => Math.abs(v + Math.log(c.init.vocab_size)))), 0.5)
      Transformer.dispose(model)
    })
  })

  it("llama3 RoPE scaling: config.json carries it, and without it the reference moves far beyond the tolerance", async () => {
    const written = JSON.parse(fs.readFileSync(path.join(dirOf(llama3Case), "config.json"), "utf8"))
    assert.deepStrictEqual(written.rope_scaling, llama3Scaling)
    const { model } = await Checkpoint.load(dirOf(llama3Case))
    assert.deepStrictEqual(model.config.ropeScaling, {
      type: "llama3",
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositionEmbeddings: 64
    })
    Transformer.dispose(model)
    const scaled = expected[llama3Case]![0]!
    const unscaled = expected[cases.length + 1]![0]!
    const moved = Math.max(...scaled.map((v, t) => Math.abs(v - unscaled[t]!)))
    assert.isAbove(moved, 1e-2, `max |Δ logp| without rope_scaling = ${moved}`)
  })

  it("a left-padded ragged batch matches the reference row by row (positions from the mask)", async () => {
    const { model } = await Checkpoint.load(dirOf(0))
    const { logprobs } = LogProbs.ofSequences(model, { ids: raggedIds, attentionMask: raggedMask })
    const ours = (await logprobs.array()) as Array<Array<number>>
    logprobs.dispose()
    const theirs = expected[cases.length]!
    // and the padded row equals the unpadded sequence alone
    const alone = await LogProbs.ofIds(model, [5, 9, 13, 2, 40, 41])
    for (let t = 4; t < 9; t++) {
      assert.approximately(ours[0]![t]!, theirs[0]![t]!, 1e-4)
      assert.approximately(ours[0]![t]!, alone[t - 4]!, 1e-4)
    }
    for (let t = 1; t < 9; t++) assert.approximately(ours[1]![t]!, theirs[1]![t]!, 1e-4)
    Transformer.dispose(model)
    assert.strictEqual(tf.memory().numTensors, 0)
  })
})
