import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import { assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as WeightView from "../../src/model/WeightView.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 40,
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 10,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: false
})

const params = (over: Partial<Sampling.SamplingParams>): Sampling.SamplingParams => ({
  ...Sampling.defaultParams,
  ...over
})
const prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]

let model: Transformer.Transformer
beforeAll(async () => {
  await Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" }))
  model = Transformer.init(config, 5, 0.3)
})

describe("Sampling.generate", () => {
  it("greedy with the KV cache equals greedy recomputing everything, on a ragged batch", async () => {
    const requests = prompts.map((p, i) => ({
      promptIds: p,
      sampling: params({ temperature: 0, maxNewTokens: 6 + i })
    }))
    const cached = await Sampling.generate(model, requests)
    const reference = await Sampling.generate(model, requests, { useCache: false })
    assert.deepStrictEqual(
      cached.map((c) => c.tokens),
      reference.map((c) => c.tokens)
    )
    cached.forEach((c, i) => {
      assert.strictEqual(c.tokens.length, 6 + i)
      assert.strictEqual(c.finishReason, "length")
      c.logprobs.forEach((lp, t) => assert.approximately(lp, reference[i]!.logprobs[t]!, 1e-4))
    })
    // and a row decodes the same alone as in the padded batch
    const alone = await Sampling.generate(model, [requests[1]!])
    assert.deepStrictEqual(alone[0]!.tokens, cached[1]!.tokens)
  })

  it("a group of identical prompts (prefilled once) samples like the no-cache path, each row with its own seed", async () => {
    const requests = [0, 1, 2, 3].map((seed) => ({
      promptIds: [5, 4, 3, 2, 1],
      sampling: params({ temperature: 1, maxNewTokens: 6, seed })
    }))
    const withOther = [...requests, { promptIds: [7, 7], sampling: params({ temperature: 0, maxNewTokens: 4 }) }]
    const cached = await Sampling.generate(model, withOther)
    const reference = await Sampling.generate(model, withOther, { useCache: false })
    assert.deepStrictEqual(
      cached.map((c) => c.tokens),
      reference.map((c) => c.tokens)
    )
    assert.isAbove(new Set(cached.slice(0, 4).map((c) => c.tokens.join(","))).size, 1)
  })

  it("the same seed gives the same tokens, whatever else is in the batch; another seed differs", async () => {
    const s = params({ temperature: 1.3, maxNewTokens: 12, seed: 42 })
    const a = await Sampling.generate(model, [{ promptIds: [1, 2, 3], sampling: s }])
    const b = await Sampling.generate(model, [
      { promptIds: [9, 9, 9, 9, 9], sampling: params({ seed: 1, maxNewTokens: 3 }) },
      { promptIds: [1, 2, 3], sampling: s }
    ])
    const c = await Sampling.generate(model, [{ promptIds: [1, 2, 3], sampling: { ...s, seed: 43 } }])
    assert.deepStrictEqual(b[1]!.tokens, a[0]!.tokens)
    assert.notDeepEqual(c[0]!.tokens, a[0]!.tokens)
  })

  it("processed log-probs (top-k/p off) equal the trainer's LogProbs at the same temperature", async () => {
    const [out] = await Sampling.generate(model, [
      { promptIds: [5, 6, 7], sampling: params({ temperature: 0.8, maxNewTokens: 8, seed: 3 }) }
    ])
    const ids = [5, 6, 7, ...out!.tokens]
    const { logprobs } = LogProbs.ofSequences(model, { ids: [ids] }, { temperature: 0.8 })
    const trainer = Array.from(logprobs.dataSync()).slice(3)
    logprobs.dispose()
    out!.logprobs.forEach((lp, t) => assert.approximately(lp, trainer[t]!, 1e-4))
  })

  it("stops on a stop token (kept) and on a stop string", async () => {
    const [greedy] = await Sampling.generate(model, [
      { promptIds: [1, 2], sampling: params({ temperature: 0, maxNewTokens: 8 }) }
    ])
    const stopAt = greedy!.tokens[2]!
    const first = greedy!.tokens.indexOf(stopAt)
    const [stopped] = await Sampling.generate(model, [
      { promptIds: [1, 2], sampling: params({ temperature: 0, maxNewTokens: 8, stopTokenIds: [stopAt] }) }
    ])
    assert.deepStrictEqual(stopped!.tokens, greedy!.tokens.slice(0, first + 1))
    assert.strictEqual(stopped!.finishReason, "stop")
    const decode = (ids: ReadonlyArray<number>) => ids.map((i) => String.fromCharCode(97 + (i % 26))).join("")
    const text = decode(greedy!.tokens.slice(0, 4))
    const [byString] = await Sampling.generate(
      model,
      [{ promptIds: [1, 2], sampling: params({ temperature: 0, maxNewTokens: 8, stopStrings: [text.slice(2, 4)] }) }],
      { decode }
    )
    assert.strictEqual(byString!.finishReason, "stop")
    assert.isAtMost(byString!.tokens.length, 4)
  })

  it("records the weights version per token when weights change between decode steps", async () => {
    const other = Transformer.init(config, 6, 0.3)
    const copy = Transformer.init(config, 5, 0.3)
    const otherWeights = await Transformer.toHfArrays(other)
    let step = 0
    const [out] = await Sampling.generate(
      copy,
      [{ promptIds: [1, 2, 3], sampling: params({ temperature: 0, maxNewTokens: 6 }) }],
      {
        beforeStep: () => {
          step++
          if (step === 4) for (const t of otherWeights) Transformer.assignHf(copy, t.name, t.shape, t.data)
          return step >= 4 ? 1 : 0
        }
      }
    )
    assert.deepStrictEqual(out!.versions, [0, 0, 0, 1, 1, 1])
    // the first three tokens are the old model's greedy tokens
    const [old] = await Sampling.generate(model, [
      { promptIds: [1, 2, 3], sampling: params({ temperature: 0, maxNewTokens: 3 }) }
    ])
    assert.deepStrictEqual(out!.tokens.slice(0, 3), old!.tokens)
    Transformer.dispose(other)
    Transformer.dispose(copy)
  })

  it("leaves no tensors behind", async () => {
    const before = tf.memory().numTensors
    await Sampling.generate(
      model,
      prompts.map((p, i) => ({
        promptIds: p,
        sampling: params({ maxNewTokens: 3 + 2 * i, seed: i, topK: 5, topP: 0.9 })
      }))
    )
    assert.strictEqual(tf.memory().numTensors, before)
  })
})

describe("Sampling.pick", () => {
  // z = log [0.5, 0.3, 0.15, 0.05]
  const z = Float32Array.from([0.5, 0.3, 0.15, 0.05].map(Math.log))
  it("top-p 0.7 keeps {0.5, 0.3} and renormalises: log-probs log(5/8), log(3/8)", () => {
    const prng = Prng.make(1)
    const seen = new Map<number, number>()
    for (let i = 0; i < 200; i++) {
      const { token, logprob } = Sampling.pick(z, { temperature: 1, topK: 0, topP: 0.7 }, prng)
      seen.set(token, logprob)
    }
    assert.deepStrictEqual([...seen.keys()].sort(), [0, 1])
    assert.approximately(seen.get(0)!, Math.log(5 / 8), 1e-6)
    assert.approximately(seen.get(1)!, Math.log(3 / 8), 1e-6)
  })
  it("top-k 1 is greedy with log-prob 0; raw mode reports log softmax(z)", () => {
    const prng = Prng.make(2)
    assert.deepStrictEqual(Sampling.pick(z, { temperature: 1, topK: 1, topP: 1 }, prng), { token: 0, logprob: 0 })
    const raw = Sampling.pick(z, { temperature: 2, topK: 1, topP: 1 }, prng, "raw")
    assert.approximately(raw.logprob, Math.log(0.5), 1e-6)
  })
  it("on a 5000-token vocabulary, top-k ∘ top-p draws from the exact nucleus with its renormalised log-prob", () => {
    const gen = Prng.make(7)
    const big = Float32Array.from({ length: 5000 }, () => 3 * gen.normal())
    // naive reference: full sort, softmax(z/τ) over the top k, then the smallest prefix reaching p
    const naive = (tau: number, k: number, p: number): Map<number, number> => {
      const order = Array.from({ length: big.length }, (_, i) => i).sort((a, b) => big[b]! - big[a]! || a - b)
      const top = k > 0 ? order.slice(0, k) : order
      const w = top.map((i) => Math.exp(big[i]! / tau))
      const sum = w.reduce((x, y) => x + y, 0)
      let mass = 0
      let kept = top.length
      for (let i = 0; i < top.length; i++) {
        mass += w[i]! / sum
        if (mass >= p) {
          kept = i + 1
          break
        }
      }
      const keptSum = w.slice(0, kept).reduce((x, y) => x + y, 0)
      return new Map(top.slice(0, kept).map((id, i) => [id, Math.log(w[i]! / keptSum)]))
    }
    for (const [tau, k, p] of [
      [0.7, 0, 0.9],
      [1.5, 200, 0.95],
      [1, 40, 1]
    ] as const) {
      const expected = naive(tau, k, p)
      const prng = Prng.make(1)
      for (let i = 0; i < 50; i++) {
        const { token, logprob } = Sampling.pick(big, { temperature: tau, topK: k, topP: p }, prng)
        assert.isTrue(expected.has(token), `token ${token} outside the nucleus (τ ${tau}, k ${k}, p ${p})`)
        assert.approximately(logprob, expected.get(token)!, 1e-9)
      }
    }
  })
})

describe("KvCache.merge / trim", () => {
  it("rows decode the same after merging caches of different lengths and trimming shared padding", async () => {
    const { prefill, extend, merge, select, trim, dispose } = await import("../../src/model/KvCache.ts")
    const view = WeightView.inference(model)
    const before = tf.memory().numTensors
    const argmax = (row: Float32Array) => row.indexOf(Math.max(...row))
    // reference: each prompt alone, greedy for 4 steps
    const greedyAlone = async (prompt: Array<number>) => {
      let s = await prefill(model, view, [prompt])
      const out = [argmax(s.logits)]
      for (let i = 0; i < 3; i++) {
        s = await extend(model, view, s.cache, [out[out.length - 1]!])
        out.push(argmax(s.logits))
      }
      dispose(s.cache)
      return out
    }
    const a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    const b = [20, 21]
    const expected = [await greedyAlone(a), await greedyAlone(b)]
    const sa = await prefill(model, view, [a])
    const sb = await prefill(model, view, [b])
    let cache = merge(sa.cache, sb.cache)
    assert.strictEqual(cache.length, 9)
    const V = config.vocabSize
    let tokens = [argmax(sa.logits), argmax(sb.logits)]
    const got = [[tokens[0]!], [tokens[1]!]]
    for (let i = 0; i < 3; i++) {
      const s = await extend(model, view, cache, tokens)
      cache = s.cache
      tokens = [argmax(s.logits.subarray(0, V)), argmax(s.logits.subarray(V))]
      got[0]!.push(tokens[0]!)
      got[1]!.push(tokens[1]!)
    }
    assert.deepStrictEqual(got, expected)
    // dropping the long row leaves 7 leading padding slots, which trim removes
    cache = trim(select(cache, [1]))
    assert.strictEqual(cache.length, b.length + 3)
    dispose(cache)
    assert.strictEqual(tf.memory().numTensors, before)
    WeightView.dispose(view)
  })
})

describe("PrefixCache", () => {
  it("serves the longest cached prefix (keeping the prompt's last token to run), supersedes and evicts LRU", async () => {
    const KvCache = await import("../../src/model/KvCache.ts")
    const PrefixCache = await import("../../src/model/PrefixCache.ts")
    const view = WeightView.inference(model)
    const before = tf.memory().numTensors
    const cacheOf = async (tokens: Array<number>) => (await KvCache.prefill(model, view, [tokens])).cache
    const a = [1, 2, 3, 4, 5, 6]
    const probe = await cacheOf(a)
    const perToken = KvCache.byteSize(probe) / a.length
    KvCache.dispose(probe)
    const prefixes = PrefixCache.make(perToken * 15)
    prefixes.store(a, await cacheOf(a))
    prefixes.store([...a, 7, 8], await cacheOf([...a, 7, 8])) // supersedes `a`
    assert.strictEqual(prefixes.bytes(), perToken * 8)
    const hit = prefixes.lookup([...a, 7, 8])! // capped at length − 1
    assert.strictEqual(hit.length, 7)
    assert.strictEqual(hit.cache.length, 7)
    KvCache.dispose(hit.cache)
    assert.isUndefined(prefixes.lookup([9, 9, 9, 9, 9, 9]))
    prefixes.store([9, 9, 9, 9, 9, 9, 9, 9], await cacheOf([9, 9, 9, 9, 9, 9, 9, 9])) // 16 tokens > 15: evicts the oldest
    assert.isUndefined(prefixes.lookup([...a, 7, 8, 10]))
    const nines = prefixes.lookup([9, 9, 9, 9, 9, 9, 9, 9, 1])!
    assert.strictEqual(nines.length, 8)
    KvCache.dispose(nines.cache)
    prefixes.clear()
    assert.strictEqual(tf.memory().numTensors, before)
    WeightView.dispose(view)
  })
})
