/**
 * LlamaCppEngine: rollouts on llama.cpp from a GGUF export of the policy. Greedy tokens and their log-probs match the
 * in-process LocalEngine's (F32 export); a new version is re-exported and recorded on the requests admitted after it.
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
import * as Transformer from "../../src/model/Transformer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "llamacpp-engine-"))
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }))

describe("LlamaCppEngine", () => {
  it("samples greedily as LocalEngine does (tokens, log-probs within 1e-3) and records each request's version", async () => {
    await Effect.runPromise(TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" }))
    const { model } = await Checkpoint.load("data/quickstart/policy")
    const tokenizer = ByteTokenizer.make()
    const files = tokenizer.hfFiles()
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
    try {
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const llamaEngine = yield* LlamaCppEngine.make({
              model,
              tokenizer: { tokenizerJson: files["tokenizer.json"], tokenizerConfig: files["tokenizer_config.json"] },
              type: "F32",
              dir: tmp,
              maxBatch: 10
            })
            const localEngine = yield* LocalEngine.make({ model, decode: (ids) => tokenizer.decode(ids), maxBatch: 4 })
            const requests = prompts.map((promptIds) => ({ promptIds, sampling }))
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
})
