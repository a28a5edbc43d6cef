import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import { assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as Decoder from "../../src/model/Decoder.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Transformer from "../../src/model/Transformer.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 30,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: true
})

beforeAll(() => Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })))

describe("LogProbs.ofSequences", () => {
  it("equals log_softmax(logits / τ) picked at the next token, with entropy −Σ p log p", () => {
    const model = Transformer.init(config, 1, 0.5)
    const ids = [[3, 7, 1, 29, 4]]
    const { logprobs, entropy } = LogProbs.ofSequences(model, { ids }, { temperature: 0.7, entropy: true })
    const logits = Decoder.forward(model, { ids })
    const logp = tf.tidy(() => tf.logSoftmax(tf.div(logits, 0.7)).arraySync() as Array<Array<Array<number>>>)
    const lp = logprobs.arraySync()[0]!
    const h = entropy!.arraySync()[0]!
    assert.strictEqual(lp[0], 0)
    for (let t = 1; t < 5; t++) {
      assert.approximately(lp[t]!, logp[0]![t - 1]![ids[0]![t]!]!, 1e-5)
      const row = logp[0]![t - 1]!
      assert.approximately(h[t]!, -row.reduce((s, v) => s + Math.exp(v) * v, 0), 1e-5)
    }
    tf.dispose([logprobs, entropy!, logits])
    Transformer.dispose(model)
  })

  it("gives gradients to every weight through tf.variableGrads and leaves no tensors behind", () => {
    const model = Transformer.init(config, 2, 0.5)
    const before = tf.memory().numTensors
    const vars = Transformer.trainableVariables(model)
    const { value, grads } = tf.variableGrads(() => {
      const { logprobs, entropy } = LogProbs.ofSequences(
        model,
        {
          ids: [
            [0, 0, 5, 6, 7],
            [1, 2, 3, 4, 5]
          ],
          attentionMask: [
            [0, 0, 1, 1, 1],
            [1, 1, 1, 1, 1]
          ]
        },
        { entropy: true }
      )
      return tf.add(tf.neg(tf.mean(logprobs)), tf.mul(0.01, tf.mean(entropy!))) as tf.Scalar
    }, vars)
    assert.strictEqual(Object.keys(grads).length, vars.length)
    const normEmbed = tf.tidy(() => tf.norm(Object.values(grads)[0]!).dataSync()[0]!)
    assert.isAbove(normEmbed, 0)
    tf.dispose([value, ...Object.values(grads)])
    assert.strictEqual(tf.memory().numTensors, before)
    Transformer.dispose(model)
    assert.strictEqual(tf.memory().numTensors, 0)
  })

  it("analytic gradient of the custom linear matches a finite difference", () => {
    const model = Transformer.init(config, 3, 0.5)
    const w = model.params.get("model.layers.1.mlp.down_proj.weight")!
    const loss = () =>
      tf.tidy(() => tf.neg(tf.sum(LogProbs.ofSequences(model, { ids: [[4, 8, 15, 16, 23]] }).logprobs)) as tf.Scalar)
    const { grads } = tf.variableGrads(loss, [w])
    const g = grads[w.name]!.dataSync()
    const eps = 1e-2
    const orig = w.dataSync().slice()
    for (const i of [0, 17, 100]) {
      const plus = orig.slice()
      plus[i] += eps
      w.assign(tf.tensor(plus, w.shape))
      const lp = loss().dataSync()[0]!
      const minus = orig.slice()
      minus[i] -= eps
      w.assign(tf.tensor(minus, w.shape))
      const lm = loss().dataSync()[0]!
      assert.approximately(g[i]!, (lp - lm) / (2 * eps), 2e-3)
    }
    tf.dispose(Object.values(grads))
    Transformer.dispose(model)
  })
})

describe("LogProbs fused head", () => {
  it("chunked with a recomputing gradient: same log-probs, entropy and gradients as the plain path", () => {
    const model = Transformer.init(config, 4, 0.5)
    const input = {
      ids: [
        [0, 0, 5, 6, 7, 8],
        [1, 2, 3, 4, 5, 29]
      ],
      attentionMask: [
        [0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1]
      ]
    }
    const vars = Transformer.trainableVariables(model)
    const run = (options: LogProbs.Options) => {
      const values = tf.tidy(() => {
        const out = LogProbs.ofSequences(model, input, { ...options, entropy: true, temperature: 0.9 })
        return [Array.from(out.logprobs.dataSync()), Array.from(out.entropy!.dataSync())]
      })
      const { value, grads } = tf.variableGrads(() => {
        const out = LogProbs.ofSequences(model, input, { ...options, entropy: true, temperature: 0.9 })
        return tf.sub(
          tf.sum(tf.mul(out.logprobs, tf.range(0, 6).reshape([1, 6]))),
          tf.mul(0.3, tf.sum(out.entropy!))
        ) as tf.Scalar
      }, vars)
      const g = vars.map((v) => Array.from(grads[v.name]!.dataSync()))
      tf.dispose([value, ...Object.values(grads)])
      return { values, g }
    }
    const before = tf.memory().numTensors
    const plain = run({})
    const fused = run({ fusedAbove: 0, chunkRows: 3 }) // 10 rows in chunks of 3, 3, 3, 1
    assert.strictEqual(tf.memory().numTensors, before)
    plain.values.flat().forEach((v, i) => assert.approximately(fused.values.flat()[i]!, v, 1e-5))
    plain.g.forEach((g, k) => g.forEach((v, i) => assert.approximately(fused.g[k]![i]!, v, 1e-4)))
    Transformer.dispose(model)
  })

  it("`only` computes the selected positions (plain and fused head) and zeros elsewhere, with matching gradients", () => {
    const model = Transformer.init(config, 5, 0.5)
    const input = {
      ids: [
        [0, 0, 5, 6, 7, 8],
        [1, 2, 3, 4, 5, 29]
      ],
      attentionMask: [
        [0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1]
      ]
    }
    const only = [
      [0, 0, 0, 1, 1, 0],
      [0, 0, 0, 0, 1, 1]
    ]
    const vars = Transformer.trainableVariables(model)
    const before = tf.memory().numTensors
    const run = (options: LogProbs.Options) => {
      const value = tf.tidy(() =>
        Array.from(LogProbs.ofSequences(model, input, { ...options, entropy: true }).logprobs.dataSync())
      )
      const { value: loss, grads } = tf.variableGrads(() => {
        const out = LogProbs.ofSequences(model, input, { ...options, entropy: true })
        return tf.add(
          tf.sum(tf.mul(out.logprobs, tf.tensor2d(only))),
          tf.mul(0.1, tf.sum(tf.mul(out.entropy!, tf.tensor2d(only))))
        ) as tf.Scalar
      }, vars)
      const g = vars.map((v) => Array.from(grads[v.name]!.dataSync()))
      tf.dispose([loss, ...Object.values(grads)])
      return { value, g }
    }
    const full = run({})
    for (const options of [{ only }, { only, fusedAbove: 0, chunkRows: 2 }]) {
      const part = run(options)
      part.value.forEach((v, i) => assert.approximately(v, only.flat()[i] === 1 ? full.value[i]! : 0, 1e-5))
      full.g.forEach((g, k) => g.forEach((v, i) => assert.approximately(part.g[k]![i]!, v, 1e-4)))
    }
    assert.strictEqual(tf.memory().numTensors, before)
    Transformer.dispose(model)
  })
})
