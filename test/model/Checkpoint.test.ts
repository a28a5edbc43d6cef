import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "../../src/tensor/Tf.ts"
import { afterAll, assert, describe, it } from "vitest"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Safetensors from "../../src/model/Safetensors.ts"
import * as Transformer from "../../src/model/Transformer.ts"

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "ckpt-"))
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 40,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 6,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: false
})

const bytesOf = async (model: Transformer.Transformer) =>
  (await Transformer.toHfArrays(model)).map((t) => ({
    name: t.name,
    bytes: Buffer.from(t.data.buffer).toString("hex")
  }))

describe("Safetensors", () => {
  it("round-trips F32 exactly and rounds to BF16 to nearest even", () => {
    const data = Float32Array.from([1, -2.5, Math.PI, 1e-30, 65504, 1 + 2 ** -8, 1 + 3 * 2 ** -8])
    const f32 = Safetensors.decode(Safetensors.encode([{ name: "x", shape: [7], data }], "F32"))
    assert.deepStrictEqual(Array.from(f32.tensors.get("x")!.data), Array.from(data))
    assert.strictEqual(f32.metadata["format"], "pt")
    const bf = Safetensors.decode(Safetensors.encode([{ name: "x", shape: [7], data }], "BF16")).tensors.get("x")!
    assert.strictEqual(bf.dtype, "BF16")
    // π → 3.140625; 1 + 2⁻⁸ is a tie → rounds to even 1; 1 + 3·2⁻⁸ → 1 + 2⁻⁶ (even)
    assert.deepStrictEqual(Array.from(bf.data).slice(0, 3), [1, -2.5, 3.140625])
    assert.strictEqual(bf.data[5], 1)
    assert.strictEqual(bf.data[6], 1 + 2 ** -6)
  })

  it("reads F16 and the header is 8-byte aligned", () => {
    // 1.0 = 0x3c00, -2 = 0xc000, 0.5 = 0x3800 in IEEE half
    const header = JSON.stringify({ h: { dtype: "F16", shape: [3], data_offsets: [0, 6] } })
    const hb = new TextEncoder().encode(header)
    const file = new Uint8Array(8 + hb.length + 6)
    new DataView(file.buffer).setBigUint64(0, BigInt(hb.length), true)
    file.set(hb, 8)
    new DataView(file.buffer).setUint16(8 + hb.length, 0x3c00, true)
    new DataView(file.buffer).setUint16(8 + hb.length + 2, 0xc000, true)
    new DataView(file.buffer).setUint16(8 + hb.length + 4, 0x3800, true)
    assert.deepStrictEqual(Array.from(Safetensors.decode(file).tensors.get("h")!.data), [1, -2, 0.5])
    const written = Safetensors.encode([{ name: "a", shape: [1], data: Float32Array.of(1) }])
    assert.strictEqual(Number(new DataView(written.buffer).getBigUint64(0, true)) % 8, 0)
  })
})

describe("Checkpoint", () => {
  it("load → save → load is bit-identical (F32, single file)", async () => {
    const model = Transformer.init(config, 7)
    await Checkpoint.save(model, path.join(tmp, "a"))
    const a = await Checkpoint.load(path.join(tmp, "a"))
    await Checkpoint.save(a.model, path.join(tmp, "b"))
    const b = await Checkpoint.load(path.join(tmp, "b"))
    assert.deepStrictEqual(await bytesOf(b.model), await bytesOf(model))
    assert.deepStrictEqual(
      fs.readFileSync(path.join(tmp, "a/model.safetensors")),
      fs.readFileSync(path.join(tmp, "b/model.safetensors"))
    )
    const hf = JSON.parse(fs.readFileSync(path.join(tmp, "a/config.json"), "utf8"))
    assert.strictEqual(hf.architectures[0], "Qwen3ForCausalLM")
    assert.strictEqual(hf.head_dim, 6)
    ;[model, a.model, b.model].forEach(Transformer.dispose)
  })

  it("BF16 and sharded checkpoints (with index) round-trip bit-identically", async () => {
    const model = Transformer.init(config, 8)
    await Checkpoint.save(model, path.join(tmp, "c"), {
      dtype: "BF16",
      maxShardBytes: 4000,
      generationConfig: { eos_token_id: 2 }
    })
    const index = JSON.parse(fs.readFileSync(path.join(tmp, "c/model.safetensors.index.json"), "utf8"))
    const shards = new Set(Object.values(index.weight_map as Record<string, string>))
    assert.isAbove(shards.size, 2)
    assert.isTrue(fs.existsSync(path.join(tmp, "c/generation_config.json")))
    const c = await Checkpoint.load(path.join(tmp, "c"))
    assert.strictEqual(c.dtype, "BF16")
    await Checkpoint.save(c.model, path.join(tmp, "d"), { dtype: "BF16", maxShardBytes: 4000 })
    const d = await Checkpoint.load(path.join(tmp, "d"))
    assert.deepStrictEqual(await bytesOf(d.model), await bytesOf(c.model))
    ;[model, c.model, d.model].forEach(Transformer.dispose)
    assert.strictEqual(tf.memory().numTensors, 0)
  })

  it("names what is missing", async () => {
    const model = Transformer.init(config, 9)
    const dir = path.join(tmp, "e")
    await Checkpoint.save(model, dir)
    Transformer.dispose(model)
    const tensors = await Checkpoint.readTensors(dir)
    tensors.delete("lm_head.weight")
    await Checkpoint.writeTensors(
      dir,
      [...tensors].map(([name, t]) => ({ name, shape: t.shape, data: t.data }))
    )
    const error = await Checkpoint.load(dir).then(
      () => undefined,
      (e: unknown) => e as Error
    )
    assert.instanceOf(error, Checkpoint.CheckpointLoadError)
    assert.include(error!.message, "missing tensor lm_head.weight")
  })
})
