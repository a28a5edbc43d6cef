/**
 * GGUF LoRA adapters run in llama.cpp (node-llama-cpp, `createContext({ lora })`) over the base's own GGUF export as
 * our model runs with the adapters attached: the same 32-token greedy continuation and log-probs within 1e-3 at F32,
 * for Qwen3 and for Llama (whose q/k lora_B rows take the base's RoPE permutation), and not those of the base alone.
 * `model export --format gguf --adapter` writes such a file from a LoRA run directory.
 *
 * Log-probs from llama.cpp are softmax over the whole vocabulary with temperature 0 and no top-k/top-p (as in
 * GgufExport.test.ts): our raw log-probs.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect } from "effect"
import { afterAll, assert, describe, it } from "vitest"
import * as ModelCommand from "../../src/cli/ModelCommand.ts"
import type { AdapterWeights } from "../../src/domain/WeightSnapshot.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as Gguf from "../../src/model/Gguf.ts"
import * as GgufExport from "../../src/model/GgufExport.ts"
import * as GgufLora from "../../src/model/GgufLora.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as Cli from "../fixtures/Cli.ts"
import * as LlamaCpp from "../fixtures/LlamaCpp.ts"

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-lora-"))
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

const llamaCpp = LlamaCpp.useLlama()
const tokenizer = ByteTokenizer.make()
const byteFiles = LlamaCpp.byteFiles
const testConfig = (architecture: "qwen3" | "llama") => LlamaCpp.testConfig(architecture, architecture === "qwen3")

const lora: Lora.LoraOptions = {
  rank: 4,
  alpha: 8, // scale α / r = 2
  dropout: 0,
  targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
}

/** Adapters on every linear module with random A and random, non-zero B (attach alone leaves B = 0). */
const randomAdapters = async (model: Transformer.Transformer, seed: number): Promise<AdapterWeights> => {
  Lora.attach(model, lora, seed)
  const fresh = await Lora.toWeights(model, lora)
  const prng = Prng.make(seed + 1)
  const data = fresh.data.map((d, i) =>
    fresh.names[i]!.endsWith("lora_B.weight") ? Float32Array.from(d, () => (2 * prng.next() - 1) * 0.3) : d
  )
  const weights = { ...fresh, data }
  Lora.attachWeights(model, weights)
  return weights
}

type Loaded = LlamaCpp.Loaded
const llamaGreedy = (loaded: Loaded, adapter: string | undefined, prompt: ReadonlyArray<number>) =>
  LlamaCpp.greedy(loaded, prompt, adapter)
const llamaTeacherForced = (loaded: Loaded, adapter: string | undefined, ids: ReadonlyArray<number>) =>
  LlamaCpp.teacherForced(loaded, ids, adapter)

const ours = async (model: Transformer.Transformer, prompt: ReadonlyArray<number>) => {
  const [completion] = await Sampling.generate(model, [
    { promptIds: prompt, sampling: { ...Sampling.defaultParams, temperature: 0, maxNewTokens: 32 } }
  ])
  return completion!
}

const maxAbs = LlamaCpp.maxAbs
const meanAbs = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
  a.reduce((sum, x, i) => sum + Math.abs(x - b[i]!), 0) / a.length

const prompt = tokenizer.encode("<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n")

/** The base as GGUF F32, written before any adapter is attached. */
const writeBase = async (model: Transformer.Transformer, name: string) => {
  const file = path.join(tmp, `${name}-base.gguf`)
  await GgufExport.write(file, {
    config: model.config,
    arrays: await Transformer.toHfArrays(model),
    tokenizer: byteFiles(),
    type: "F32"
  })
  return file
}

describe.skipIf(!LlamaCpp.available)(`GgufLora in llama.cpp${LlamaCpp.skipped}`, () => {
  for (const architecture of ["qwen3", "llama"] as const) {
    it(`${architecture}: base + adapter give our adapted model's greedy continuation and log-probs within 1e-3 at F32`, async () => {
      // initializer range 0.3: a peaked next-token distribution, so greedy is not decided by float noise
      const model = Transformer.init(testConfig(architecture), 11, 0.3)
      const loaded = await llamaCpp.get().loadModel({ modelPath: await writeBase(model, architecture), gpuLayers: 0 })
      try {
        const weights = await randomAdapters(model, 5)
        assert.strictEqual(weights.names.length, 2 * 2 * 7) // 2 layers × 7 modules × (A, B)
        const adapterFile = path.join(tmp, `${architecture}-adapter-F32.gguf`)
        await GgufLora.writeAdapter(adapterFile, { config: model.config, adapter: weights, type: "F32" })

        const mine = await ours(model, prompt)
        const theirs = await llamaGreedy(loaded, adapterFile, prompt)
        assert.deepStrictEqual(theirs.tokens, [...mine.tokens], "greedy continuation")
        const greedyGap = maxAbs(theirs.logprobs, mine.logprobs)
        assert.isBelow(greedyGap, 1e-3, `greedy log-probs differ by ${greedyGap}`)
        const ids = [...prompt, ...mine.tokens]
        const reference = await LogProbs.ofIds(model, ids)
        const forced = await llamaTeacherForced(loaded, adapterFile, ids)
        const forcedGap = maxAbs(forced, reference)
        assert.isBelow(forcedGap, 1e-3, `teacher-forced log-probs differ by ${forcedGap}`)

        // the adapter is what moved them: the base alone in llama.cpp is far from the adapted model
        const baseAlone = await llamaTeacherForced(loaded, undefined, ids)
        assert.isAbove(meanAbs(baseAlone, reference), 0.05, "the adapter changes nothing")

        // F16 and Q8_0 (lora_b's rows of r = 4 are no whole Q8_0 block: F16) load; rounding moves log-probs a little
        // (measured mean |Δ log p|: F16 5e-4 / 6e-4, Q8_0 0.006 / 0.014 for qwen3 / llama; the base alone: 1.3 / 2.2)
        for (const type of ["F16", "Q8_0"] as const) {
          const file = path.join(tmp, `${architecture}-adapter-${type}.gguf`)
          await GgufLora.writeAdapter(file, { config: model.config, adapter: weights, type })
          const gap = meanAbs(await llamaTeacherForced(loaded, file, ids), reference)
          assert.isBelow(gap, 0.05, `${type}: mean |Δ log p| ${gap}`)
        }
      } finally {
        await loaded.dispose()
        Transformer.dispose(model)
      }
    }, 120_000)
  }

  it("model export --format gguf --adapter: a LoRA run's latest adapter loads in llama.cpp over the base's export", async () => {
    const model = Transformer.init(testConfig("qwen3"), 13, 0.3)
    const baseDir = path.join(tmp, "base")
    await Checkpoint.save(model, baseDir)
    for (const [name, content] of Object.entries(tokenizer.hfFiles()))
      fs.writeFileSync(path.join(baseDir, name), JSON.stringify(content))
    const baseFile = path.join(tmp, "cli-base.gguf")
    await Effect.runPromise(ModelCommand.exportGguf(baseDir, baseFile, "F32"))
    // a run directory as a LoRA run leaves it: checkpoints/latest → step-3, whose adapter/ names its base
    const runDir = path.join(tmp, "run")
    const weights = await randomAdapters(model, 9)
    await Lora.writeDir(path.join(runDir, "checkpoints/step-3/adapter"), weights, baseDir)
    fs.writeFileSync(path.join(runDir, "checkpoints/latest"), "step-3\n")
    const loaded = await llamaCpp.get().loadModel({ modelPath: baseFile, gpuLayers: 0 })
    try {
      const out = path.join(tmp, "cli-adapter.gguf")
      const exported = Cli.run(["model", "export", "--model", runDir, "--format", "gguf", "--adapter", "--out", out])
      assert.strictEqual(exported.code, 0, exported.stderr.slice(-2000))
      const result = JSON.parse(exported.lastLine)
      assert.include(result, { format: "gguf-lora", rank: 4, alpha: 8, modules: 14, architecture: "qwen3" })
      const ids = [...prompt, ...(await ours(model, prompt)).tokens]
      const gap = maxAbs(await llamaTeacherForced(loaded, out, ids), await LogProbs.ofIds(model, ids))
      assert.isBelow(gap, 1e-3, `log-probs differ by ${gap}`)

      // refusals say what to do
      const notAdapter = await Effect.runPromise(Effect.flip(ModelCommand.exportGgufAdapter(baseDir, out, "F32")))
      assert.strictEqual(notAdapter._tag, "ConfigError")
      assert.match(notAdapter.message, /whole model.*drop --adapter/)
      const otherBase = path.join(tmp, "other-base")
      await Checkpoint.save(Transformer.init(testConfig("llama"), 1, 0.3), otherBase)
      const wrongBase = await Effect.runPromise(
        Effect.flip(ModelCommand.exportGgufAdapter(runDir, out, "F32", { base: otherBase }))
      )
      assert.strictEqual(wrongBase._tag, "CheckpointError")
      assert.match(`${wrongBase.path}: ${wrongBase.message}`, /adapter_model\.safetensors: .*q_proj.*--base/)
    } finally {
      await loaded.dispose()
      Transformer.dispose(model)
    }
  }, 120_000)
})

describe("GgufLora", () => {
  it("writes llama.cpp's adapter layout: metadata, <base name>.lora_a ne=[in, r], .lora_b ne=[r, out]", () => {
    const config = testConfig("qwen3")
    const adapter: AdapterWeights = {
      rank: 4,
      alpha: 8,
      dropout: 0,
      targetModules: ["o_proj"],
      names: [
        "base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight",
        "base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"
      ],
      shapes: [
        [4, 128],
        [64, 4]
      ],
      data: [new Float32Array(4 * 128).fill(1), new Float32Array(64 * 4).fill(2)]
    }
    const tensors = GgufLora.adapterTensors({ config, adapter, type: "F32" })
    assert.deepStrictEqual(
      tensors.map((t) => [t.name, [...t.shape].reverse()]),
      [
        ["blk.1.attn_output.weight.lora_a", [128, 4]],
        ["blk.1.attn_output.weight.lora_b", [4, 64]]
      ]
    )
    const metadata = new Map(GgufLora.adapterMetadata({ config, adapter, type: "F32" }))
    assert.deepStrictEqual(metadata.get("general.type"), Gguf.string("adapter"))
    assert.deepStrictEqual(metadata.get("general.architecture"), Gguf.string("qwen3"))
    assert.deepStrictEqual(metadata.get("adapter.type"), Gguf.string("lora"))
    assert.deepStrictEqual(metadata.get("adapter.lora.alpha"), Gguf.f32(8))
    // an adapter llama.cpp could not apply: named, with what to do
    assert.throws(
      () =>
        GgufLora.adapterTensors({
          config,
          adapter: { ...adapter, names: adapter.names.map((n) => n.replace("o_proj", "lm_head")) },
          type: "F32",
          source: "x/adapter_model.safetensors"
        }),
      /x\/adapter_model\.safetensors: tensor .*lm_head.*--merge/
    )
    assert.throws(
      () => GgufLora.adapterTensors({ config: testConfig("llama"), adapter, type: "F32", source: "a.safetensors" }),
      /a\.safetensors: model\.layers\.1\.self_attn\.o_proj is lora_A \[4, 128\].*\[4, 64\].*--base/
    )
  })
})
