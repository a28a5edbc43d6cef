import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Safetensors from "../../src/model/Safetensors.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 30,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: true
})
const options: Lora.LoraOptions = { rank: 4, alpha: 8, dropout: 0, targetModules: ["q_proj", "v_proj", "down_proj"] }
const ids = [[3, 1, 4, 1, 5, 9, 2, 6]]
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lora-"))

const logp = (model: Transformer.Transformer) =>
  tf.tidy(() => Array.from(LogProbs.ofSequences(model, { ids }).logprobs.dataSync()))

/** A few Adam steps on the adapters, so B ≠ 0. */
const train = (model: Transformer.Transformer) => {
  const optimizer = tf.train.adam(0.05)
  for (let i = 0; i < 3; i++) {
    optimizer.minimize(
      () => tf.neg(tf.mean(LogProbs.ofSequences(model, { ids }).logprobs)) as tf.Scalar,
      false,
      Transformer.trainableVariables(model)
    )
  }
  optimizer.dispose()
}

beforeAll(() => Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })))
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

describe("Lora", () => {
  it("attaching changes nothing (B = 0); training moves only the adapters; merge reproduces the adapted model", () => {
    const model = Transformer.init(config, 1, 0.3)
    const base = logp(model)
    const embedBefore = model.params.get("model.embed_tokens.weight")!.dataSync().slice()
    Lora.attach(model, options, 1)
    assert.strictEqual(model.adapters.size, 2 * 3) // 2 layers × 3 target modules
    assert.deepStrictEqual(logp(model), base)
    assert.strictEqual(Transformer.trainableVariables(model).length, 12)
    train(model)
    const adapted = logp(model)
    assert.isAbove(
      adapted.reduce((s, v) => s + v, 0),
      base.reduce((s, v) => s + v, 0)
    ) // training raised log-likelihood
    assert.deepStrictEqual(model.params.get("model.embed_tokens.weight")!.dataSync(), embedBefore)
    Lora.merge(model)
    assert.strictEqual(model.adapters.size, 0)
    logp(model).forEach((v, i) => assert.approximately(v, adapted[i]!, 1e-5))
    Transformer.dispose(model)
  })

  it("saves PEFT layout (names, [r, in] / [out, r]) and loads back to the same outputs", async () => {
    const model = Transformer.init(config, 2, 0.3)
    Lora.attach(model, options, 2)
    train(model)
    const adapted = logp(model)
    await Lora.save(model, path.join(tmp, "adapter"), options)
    const cfg = JSON.parse(fs.readFileSync(path.join(tmp, "adapter/adapter_config.json"), "utf8"))
    assert.strictEqual(cfg.peft_type, "LORA")
    assert.strictEqual(cfg.r, 4)
    const { tensors } = Safetensors.decode(fs.readFileSync(path.join(tmp, "adapter/adapter_model.safetensors")))
    assert.deepStrictEqual(
      tensors.get("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")!.shape,
      [4, 16]
    )
    assert.deepStrictEqual(tensors.get("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")!.shape, [16, 4])
    Lora.detach(model)
    assert.notDeepEqual(logp(model), adapted)
    await Lora.load(model, path.join(tmp, "adapter"))
    logp(model).forEach((v, i) => assert.approximately(v, adapted[i]!, 1e-6))
    // a snapshot carries the merged weights: a plain model loaded from it computes the adapted outputs
    const plain = Transformer.init(config, 99)
    Snapshot.load(plain, await Snapshot.fromModel(model, PolicyVersion.make(3)))
    logp(plain).forEach((v, i) => assert.approximately(v, adapted[i]!, 1e-5))
    Transformer.dispose(model)
    Transformer.dispose(plain)
    assert.strictEqual(tf.memory().numTensors, 0)
  })
})

describe("Snapshot", () => {
  it("fromModel → load copies weights exactly in HF layout; rejects shape mismatches untouched", async () => {
    const a = Transformer.init(config, 3)
    const b = Transformer.init(config, 4)
    const snap = await Snapshot.fromModel(a, PolicyVersion.make(1))
    assert.deepStrictEqual(snap.shapes[snap.names.indexOf("model.layers.0.mlp.gate_proj.weight")], [24, 16])
    Snapshot.load(b, snap)
    assert.deepStrictEqual(await Transformer.toHfArrays(b), await Transformer.toHfArrays(a))
    const bad = { ...snap, shapes: snap.shapes.map((s, i) => (i === 1 ? [s[0]! + 1] : s)) }
    assert.throws(() => Snapshot.load(b, bad), /has shape/)
    Transformer.dispose(a)
    Transformer.dispose(b)
  })
})
