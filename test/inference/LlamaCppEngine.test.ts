/**
 * LlamaCppEngine: rollouts on llama.cpp from a GGUF export of the policy. Greedy tokens and their log-probs match the
 * in-process LocalEngine's (F32 export); a new version is re-exported and recorded on the requests admitted after it.
 * A LoRA run's versions are GGUF LoRA adapters on one exported base, and sample as LocalEngine does with them.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect } from "effect"
import { afterAll, assert, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import * as LlamaCppEngine from "../../src/inference/LlamaCppEngine.ts"
import * as LocalEngine from "../../src/inference/LocalEngine.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as Prng from "../../src/model/Prng.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as LlamaCpp from "../fixtures/LlamaCpp.ts"

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "llamacpp-engine-"))
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

const tokenizer = ByteTokenizer.make()
const files = tokenizer.hfFiles()
const tokenizerFiles = { tokenizerJson: files["tokenizer.json"], tokenizerConfig: files["tokenizer_config.json"] }
const prompts = ["What is 2 + 2?", "Call the add tool.", "Hello"].map((q) =>
  tokenizer.encode(`<|im_start|>user\n${q}<|im_end|>\n<|im_start|>assistant\n`)
)
const sampling = {
  maxNewTokens: 24,
  temperature: 0,
  topK: 0,
  topP: 1,
  stopTokenIds: tokenizer.eosIds,
  stopStrings: [],
  seed: 1
}
const requests = prompts.map((promptIds) => ({ promptIds, sampling }))

describe.skipIf(!LlamaCpp.available)(`LlamaCppEngine${LlamaCpp.skipped}`, () => {
  it("samples greedily as LocalEngine does (tokens, log-probs within 1e-3) and records each request's version", async () => {
    await Effect.runPromise(TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" }))
    const { model } = await Checkpoint.load("data/quickstart/policy")
    try {
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const llamaEngine = yield* LlamaCppEngine.make({
              model,
              tokenizer: tokenizerFiles,
              type: "F32",
              dir: tmp,
              maxBatch: 10
            })
            const localEngine = yield* LocalEngine.make({ model, decode: (ids) => tokenizer.decode(ids), maxBatch: 4 })
            const theirs = yield* llamaEngine.generate(requests)
            const ours = yield* localEngine.generate(requests)
            theirs.forEach((r, i) => {
              assert.deepStrictEqual(r.tokens, ours[i]!.tokens)
              assert.strictEqual(r.finishReason, ours[i]!.finishReason)
              r.logprobs.forEach((lp, t) => assert.approximately(lp, ours[i]!.logprobs[t]!, 1e-3))
              assert.strictEqual(r.policyVersionFirst, 0)
            })
            // next turns: each prompt extends an earlier prompt and its completion, so a sequence's cached prefix is
            // kept and only the new tokens are evaluated; the results still match LocalEngine's
            const turns = prompts.map((promptIds, i) => ({
              promptIds: [...promptIds, ...theirs[i]!.tokens, ...tokenizer.encode("\n<|im_start|>user\nAnd 3 + 4?")],
              sampling
            }))
            // and stop strings, which the engine's thread decodes with the tokenizer's files
            const stopped = requests.map((r) => ({
              ...r,
              sampling: { ...sampling, stopStrings: ["<tool_call>", "\n"] }
            }))
            const theirTurns = yield* llamaEngine.generate([...turns, ...requests, ...stopped])
            const ourTurns = yield* localEngine.generate([...turns, ...requests, ...stopped])
            assert.isTrue(theirTurns.slice(-3).some((r) => r.finishReason === "stop"))
            theirTurns.forEach((r, i) => {
              assert.deepStrictEqual(r.tokens, ourTurns[i]!.tokens)
              assert.strictEqual(r.finishReason, ourTurns[i]!.finishReason)
              r.logprobs.forEach((lp, t) => assert.approximately(lp, ourTurns[i]!.logprobs[t]!, 1e-3))
            })
            // a version with no tensors: re-exported from the shared model's variables
            yield* llamaEngine.updateWeights({ version: PolicyVersion.make(1), names: [], shapes: [], data: [] })
            assert.strictEqual(yield* llamaEngine.version, 1)
            const [after] = yield* llamaEngine.generate([requests[0]!])
            assert.strictEqual(after!.policyVersionLast, 1)
            assert.deepStrictEqual(after!.tokens, theirs[0]!.tokens)
          })
        )
      )
    } finally {
      Transformer.dispose(model)
    }
  }, 120_000)

  it("a LoRA run: one exported base, each version's adapters as a GGUF LoRA adapter, sampled as LocalEngine does", async () => {
    await Effect.runPromise(TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" }))
    const { model } = await Checkpoint.load("data/quickstart/policy")
    const options = {
      rank: 4,
      alpha: 8,
      dropout: 0,
      targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    }
    Lora.attach(model, options, 7)
    // PEFT starts B at zero (no change); random A and B, large enough to change the greedy tokens
    const randomAdapter = async (seed: number) => {
      const prng = Prng.make(seed)
      const weights = await Lora.toWeights(model)
      return { ...weights, data: weights.data.map((d) => d.map(() => (2 * prng.next() - 1) * 0.3)) }
    }
    const dir = path.join(tmp, "lora")
    try {
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const localEngine = yield* LocalEngine.make({ model, decode: (ids) => tokenizer.decode(ids), maxBatch: 4 })
            const base = yield* localEngine.generate(requests)
            Lora.attachWeights(model, yield* Effect.promise(() => randomAdapter(1)))
            yield* localEngine.updateWeights({ version: PolicyVersion.make(1), names: [], shapes: [], data: [] })
            const llamaEngine = yield* LlamaCppEngine.make({
              model,
              tokenizer: tokenizerFiles,
              type: "F32",
              dir,
              maxBatch: 4
            })
            const compare = Effect.fnUntraced(function* (version: number) {
              const theirs = yield* llamaEngine.generate(requests)
              const ours = yield* localEngine.generate(requests)
              theirs.forEach((r, i) => {
                assert.deepStrictEqual(r.tokens, ours[i]!.tokens, `version ${version}, prompt ${i}`)
                r.logprobs.forEach((lp, t) => assert.approximately(lp, ours[i]!.logprobs[t]!, 1e-3))
                assert.strictEqual(r.policyVersionLast, version)
              })
              return theirs
            })
            const first = yield* compare(0)
            // the adapters are applied: the base alone answers otherwise
            assert.isTrue(first.some((r, i) => r.tokens.join() !== base[i]!.tokens.join()))
            // versions as a worker sync delivers them: the snapshot carries the adapter
            for (let v = 1; v <= 4; v++) {
              const adapter = yield* Effect.promise(() => randomAdapter(1 + v))
              Lora.attachWeights(model, adapter)
              yield* localEngine.updateWeights({ version: PolicyVersion.make(1 + v), names: [], shapes: [], data: [] })
              yield* llamaEngine.updateWeights({
                version: PolicyVersion.make(v),
                names: [],
                shapes: [],
                data: [],
                adapter
              })
              yield* compare(v)
            }
            // and as an in-process sync does: no tensors, the adapters read from the shared model
            Lora.attachWeights(model, yield* Effect.promise(() => randomAdapter(9)))
            yield* localEngine.updateWeights({ version: PolicyVersion.make(9), names: [], shapes: [], data: [] })
            yield* llamaEngine.updateWeights({ version: PolicyVersion.make(5), names: [], shapes: [], data: [] })
            const fifth = yield* compare(5)
            // the base once, and the newest two versions' adapters
            assert.deepStrictEqual(fs.readdirSync(dir).sort(), [
              "v000000-base.gguf",
              "v000004-lora.gguf",
              "v000005-lora.gguf"
            ])
            // a snapshot that changes the base: written again under a new name (the worker shares a loaded model
            // between the versions that name the same file, so the old name would keep the old base)
            const prng = Prng.make(11)
            const changed = (yield* Effect.promise(() => Transformer.toHfArrays(model))).filter((a) =>
              a.name.includes("mlp.down_proj")
            )
            const baseSnapshot = {
              names: changed.map((a) => a.name),
              shapes: changed.map((a) => a.shape),
              data: changed.map((a) => a.data.map((x) => x + (2 * prng.next() - 1) * 0.3))
            }
            yield* localEngine.updateWeights({ version: PolicyVersion.make(10), ...baseSnapshot })
            yield* llamaEngine.updateWeights({ version: PolicyVersion.make(6), ...baseSnapshot })
            const sixth = yield* compare(6)
            assert.isTrue(sixth.some((r, i) => r.tokens.join() !== fifth[i]!.tokens.join()))
            assert.deepStrictEqual(fs.readdirSync(dir).sort(), [
              "v000005-lora.gguf",
              "v000006-base.gguf",
              "v000006-lora.gguf"
            ])
          })
        )
      )
    } finally {
      Transformer.dispose(model)
    }
  }, 120_000)
})

// runs where node-llama-cpp is not installed (a checkout before `npm run setup:llamacpp`)
describe.skipIf(LlamaCpp.available)("LlamaCppEngine without node-llama-cpp", () => {
  it("fails to start, saying the command that installs it", async () => {
    await Effect.runPromise(TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" }))
    const { model } = await Checkpoint.load("data/quickstart/policy")
    try {
      const exit = await Effect.runPromiseExit(
        Effect.scoped(LlamaCppEngine.make({ model, tokenizer: tokenizerFiles, type: "F32", dir: tmp, maxBatch: 1 }))
      )
      assert.isTrue(exit._tag === "Failure")
      assert.match(
        String(exit),
        /generator\.engine\.kind llamacpp: node-llama-cpp is not installed.*npm run setup:llamacpp/
      )
    } finally {
      Transformer.dispose(model)
    }
  })
})
