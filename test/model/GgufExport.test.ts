/**
 * GGUF exports run in llama.cpp (through node-llama-cpp, an implementation that shares no code with ours) as they
 * run here: the same 32-token greedy continuation, and per-token log-probs within 1e-3 at F32, for Qwen3 (tied and
 * untied), Qwen2 and Llama test checkpoints and the shipped quickstart policy with its byte tokenizer.
 *
 * What llama.cpp gives: node-llama-cpp's `confidence` / `probabilities` are softmax over the candidates left after
 * its sampler chain (top-k → top-p → min-p → temperature), in float32. With temperature 0 the chain is greedy alone,
 * so they are softmax(z) over the whole vocabulary: our raw log-probs (`LogProbs.ofIds`, and the greedy tokens'
 * log-probs `Sampling.generate` reports).
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect } from "effect"
import { afterAll, assert, describe, it } from "vitest"
import * as ModelCommand from "../../src/cli/ModelCommand.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as Gguf from "../../src/model/Gguf.ts"
import * as GgufExport from "../../src/model/GgufExport.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as LlamaCpp from "../fixtures/LlamaCpp.ts"

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-"))
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

const llamaCpp = LlamaCpp.useLlama()
const tokenizer = ByteTokenizer.make()
const byteFiles = LlamaCpp.byteFiles
const testInit = LlamaCpp.testConfig

/** Export `model` and load it in llama.cpp. */
const loadInLlamaCpp = async (model: Transformer.Transformer, type: Gguf.TensorType, name: string) => {
  const file = path.join(tmp, `${name}-${type}.gguf`)
  await GgufExport.write(file, {
    config: model.config,
    arrays: await Transformer.toHfArrays(model),
    tokenizer: byteFiles(),
    type
  })
  return llamaCpp.get().loadModel({ modelPath: file, gpuLayers: 0 })
}

const llamaGreedy = LlamaCpp.greedy
const llamaTeacherForced = LlamaCpp.teacherForced

const ours = async (model: Transformer.Transformer, prompt: ReadonlyArray<number>) => {
  const [completion] = await Sampling.generate(model, [
    { promptIds: prompt, sampling: { ...Sampling.defaultParams, temperature: 0, maxNewTokens: 32 } }
  ])
  return completion!
}

const maxAbs = LlamaCpp.maxAbs

const prompt = tokenizer.encode("<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n")

const checkParity = async (model: Transformer.Transformer, name: string) => {
  const loaded = await loadInLlamaCpp(model, "F32", name)
  try {
    const mine = await ours(model, prompt)
    const theirs = await llamaGreedy(loaded, prompt)
    assert.deepStrictEqual(theirs.tokens, [...mine.tokens], `${name}: greedy continuation`)
    const greedyGap = maxAbs(theirs.logprobs, mine.logprobs)
    assert.isBelow(greedyGap, 1e-3, `${name}: greedy log-probs differ by ${greedyGap}`)
    const ids = [...prompt, ...mine.tokens]
    const forced = await llamaTeacherForced(loaded, ids)
    const reference = await LogProbs.ofIds(model, ids)
    const forcedGap = maxAbs(forced, reference)
    assert.isBelow(forcedGap, 1e-3, `${name}: teacher-forced log-probs differ by ${forcedGap}`)
    return { greedyGap, forcedGap }
  } finally {
    await loaded.dispose()
  }
}

describe.skipIf(!LlamaCpp.available)(`GgufExport in llama.cpp${LlamaCpp.skipped}`, () => {
  for (const [architecture, tie] of [
    ["qwen3", true],
    ["qwen3", false],
    ["qwen2", false],
    ["llama", false]
  ] as const) {
    it(`${architecture}${tie ? " (tied)" : ""}: the same 32-token greedy continuation and log-probs within 1e-3 at F32`, async () => {
      // initializer range 0.3: a peaked next-token distribution, so greedy is not decided by float noise
      const model = Transformer.init(testInit(architecture, tie), 7, 0.3)
      try {
        await checkParity(model, `${architecture}-${tie ? "tied" : "untied"}`)
      } finally {
        Transformer.dispose(model)
      }
    }, 120_000)
  }

  it("the quickstart policy with its byte tokenizer: the same greedy continuation and log-probs within 1e-3", async () => {
    const { model } = await Checkpoint.load("data/quickstart/policy")
    try {
      await checkParity(model, "quickstart")
    } finally {
      Transformer.dispose(model)
    }
  }, 120_000)

  it("model export --format gguf: F16, BF16 and Q8_0 load in llama.cpp; their log-probs move by what rounding explains", async () => {
    const { model } = await Checkpoint.load("data/quickstart/policy")
    try {
      const ids = [...prompt, ...(await ours(model, prompt)).tokens]
      const reference = await LogProbs.ofIds(model, ids)
      const gaps: Record<string, number> = {}
      for (const type of ["F16", "BF16", "Q8_0"] as const) {
        const file = path.join(tmp, `cli-${type}.gguf`)
        const result = await Effect.runPromise(ModelCommand.exportGguf("data/quickstart/policy", file, type))
        assert.strictEqual(result.type, type)
        const loaded = await llamaCpp.get().loadModel({ modelPath: file, gpuLayers: 0 })
        try {
          const forced = await llamaTeacherForced(loaded, ids)
          gaps[type] = forced.reduce((sum, x, i) => sum + Math.abs(x - reference[i]!), 0) / forced.length
        } finally {
          await loaded.dispose()
        }
      }
      // mean |Δ log p| per token: nonzero (the export is rounded) and small (it is the same model)
      for (const [type, gap] of Object.entries(gaps)) {
        assert.isAbove(gap, 1e-6, type)
        assert.isBelow(gap, 0.1, type) // measured: F16 0.0009, BF16 0.008, Q8_0 0.028
      }
    } finally {
      Transformer.dispose(model)
    }
  }, 120_000)

  it("the byte tokenizer: llama.cpp tokenizes and detokenizes as ours does", async () => {
    const { model } = await Checkpoint.load("data/quickstart/policy")
    const loaded = await loadInLlamaCpp(model, "F32", "tokenizer")
    Transformer.dispose(model)
    try {
      const text =
        '<|im_start|>user\nCall add(2, 3) — "ünïcödé" ✓ 🙂\t<tool_call>{"name": "add"}</tool_call><|im_end|>\n<think>x</think>'
      const ids = tokenizer.encode(text)
      assert.deepStrictEqual(loaded.tokenize(text, true), ids)
      assert.strictEqual(loaded.detokenize(ids as Array<never>, true), tokenizer.decode(ids))
      assert.strictEqual(
        loaded.detokenize(ids as Array<never>, false),
        tokenizer.decode(ids, { skipSpecialTokens: true })
      )
      // every single id decodes to the same bytes (a byte alone may be half a character: compare bytes)
      for (let id = 0; id < tokenizer.vocabSize; id++) {
        const piece = Buffer.from(loaded.detokenize([id as never], true, []), "utf8")
        if (id < 256 && id >= 0x80) continue // lone UTF-8 continuation / lead bytes are not valid text on either side
        assert.strictEqual(piece.toString("utf8"), tokenizer.decode([id]), `token ${id}`)
      }
    } finally {
      await loaded.dispose()
    }
  }, 120_000)
})

describe("Gguf", () => {
  it("writes the v3 header, and rounds F16 and Q8_0 as ggml does", () => {
    const metadata = [["general.architecture", Gguf.string("qwen3")]] as const
    const tensors = [
      { name: "w", shape: [1, 32], type: "Q8_0", data: Float32Array.from({ length: 32 }, (_, i) => i - 16) }
    ] as const
    const bytes = Gguf.encode(metadata, tensors)
    const view = new DataView(bytes.buffer)
    assert.strictEqual(new TextDecoder().decode(bytes.subarray(0, 4)), "GGUF")
    assert.strictEqual(view.getUint32(4, true), 3)
    assert.strictEqual(Number(view.getBigUint64(8, true)), 1)
    // half: 1 + 2^-11 is a tie between 1 and 1 + 2^-10 → even (1); 65520 overflows to +inf
    assert.strictEqual(Gguf.toF16(1 + 2 ** -11), 0x3c00)
    assert.strictEqual(Gguf.toF16(65520), 0x7c00)
    assert.strictEqual(Gguf.fromF16(Gguf.toF16(-2.5)), -2.5)
    // Q8_0 of −16 … 15: d = 16/127, q = round(x·127/16); dequantised within d/2
    const start = Gguf.header(metadata, tensors).bytes.length
    const data = bytes.subarray(start, start + 34)
    const back = Gguf.dequantizeQ8(data, 32)
    for (let i = 0; i < 32; i++) assert.isAtMost(Math.abs(back[i]! - (i - 16)), 16 / 127 / 2 + 1e-3)
    assert.strictEqual(new Int8Array(data.buffer, data.byteOffset + 2, 32)[0], -127)
  })
})
