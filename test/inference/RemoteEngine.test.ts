import * as fs from "node:fs/promises"
import * as http from "node:http"
import * as os from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import { FetchHttpClient } from "effect/http"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import { InferenceEngine, type SamplingParams } from "../../src/inference/InferenceEngine.ts"
import * as ChatReply from "../../src/serve/ChatReply.ts"
import * as RemoteEngine from "../../src/inference/RemoteEngine.ts"
import * as RemoteWire from "../../src/inference/RemoteWire.ts"
import * as WeightUpload from "../../src/weights/WeightUpload.ts"
import * as Serve from "../../src/layers/Serve.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Sampling from "../../src/model/Sampling.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as FileWeightSync from "../../src/sync/FileWeightSync.ts"
import * as HttpWeightSync from "../../src/sync/HttpWeightSync.ts"
import { WeightSync } from "../../src/sync/WeightSync.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 320, // the byte tokenizer's
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 512, // the chat test's prompt (template + tools, byte tokens) is 453 tokens
  tie_word_embeddings: true
})
const token = "s3cret-token"
const greedy = (maxNewTokens: number): SamplingParams => ({ ...Sampling.defaultParams, temperature: 0, maxNewTokens })

/** A checkpoint directory (seed 11 weights + byte tokenizer) served on a free loopback port for the scope. */
const withServer = <A, E, R>(body: (url: string, dir: string) => Effect.Effect<A, E, R>, watch?: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
      const dir = yield* Effect.acquireRelease(
        Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "serve-test-"))),
        (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
      )
      const model = Transformer.init(config, 11, 0.3)
      yield* Effect.promise(() => Checkpoint.save(model, dir))
      Transformer.dispose(model)
      yield* AutoTokenizer.save(ByteTokenizer.make(), dir).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
      const url = yield* Serve.start({
        model: dir,
        host: "127.0.0.1",
        port: 0,
        token,
        modelName: "tiny",
        ...(watch === undefined ? {} : { watch })
      }).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
      return yield* body(url, dir)
    })
  )

/** Greedy tokens of seed `seed`'s weights, sampled in this process. */
const localGreedy = (seed: number, prompt: ReadonlyArray<number>, n: number) =>
  Effect.promise(async () => {
    const model = Transformer.init(config, seed, 0.3)
    const [c] = await Sampling.generate(model, [{ promptIds: prompt, sampling: greedy(n) }])
    Transformer.dispose(model)
    return c!
  })

/** The parts of a completions response the tests read. */
interface CompletionBody {
  readonly choices: ReadonlyArray<{
    readonly index: number
    readonly token_ids: ReadonlyArray<number>
    readonly finish_reason: string
    readonly logprobs: { readonly tokens: ReadonlyArray<string> } & Record<string, unknown>
    readonly message: { readonly role: string }
    readonly prompt_logprobs?: ReadonlyArray<Record<string, { readonly logprob: number }> | null>
  }>
  readonly usage: { readonly prompt_tokens: number }
  readonly prompt_token_ids: ReadonlyArray<number>
}

const post = (url: string, body: unknown, headers: Record<string, string> = {}) =>
  Effect.promise(async () => {
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body)
    })
    return { status: res.status, body: (await res.json()) as CompletionBody }
  })

describe("serve + RemoteEngine", () => {
  it.live("generates token ids with log-probs over HTTP, as the same weights do in process", () =>
    withServer(
      (url) =>
        Effect.gen(function* () {
          const engine = yield* InferenceEngine
          const prompt = [72, 105, 33]
          const [result] = yield* engine.generate([{ promptIds: prompt, sampling: greedy(8) }])
          const expected = yield* localGreedy(11, prompt, 8)
          assert.deepStrictEqual(result!.tokens, expected.tokens)
          assert.strictEqual(result!.logprobs.length, 8)
          result!.logprobs.forEach((lp, i) => assert.closeTo(lp, expected.logprobs[i]!, 1e-4))
          assert.deepStrictEqual(
            [result!.finishReason, result!.policyVersionFirst, result!.policyVersionLast],
            ["length", 0, 0]
          )
        }).pipe(Effect.provide(RemoteEngine.layer({ url, weightToken: token }))) // model: the served one
    )
  )

  it.live("a weight update over HTTP changes greedy decoding and the reported version", () =>
    withServer((url) =>
      Effect.gen(function* () {
        const engine = yield* InferenceEngine
        const sync = yield* WeightSync
        const prompt = [1, 2, 3, 4]
        const before = yield* engine.generate([{ promptIds: prompt, sampling: greedy(10) }])
        const other = Transformer.init(config, 12, 0.3)
        const snapshot = yield* Effect.promise(() => Snapshot.fromModel(other, PolicyVersion.make(1)))
        Transformer.dispose(other)
        const timings: Array<WeightUpload.Timing> = []
        yield* HttpWeightSync.make({ url, token, chunkBytes: 4096, onSynced: (t) => timings.push(t) }).pipe(
          Effect.flatMap((s) => s.publish({ version: PolicyVersion.make(1), snapshot: Effect.succeed(snapshot) })),
          Effect.provide(FetchHttpClient.layer)
        )
        const after = yield* engine.generate([{ promptIds: prompt, sampling: greedy(10) }])
        const expected = yield* localGreedy(12, prompt, 10)
        assert.deepStrictEqual(after[0]!.tokens, expected.tokens)
        assert.notDeepEqual(after[0]!.tokens, before[0]!.tokens)
        assert.deepStrictEqual([after[0]!.policyVersionFirst, after[0]!.policyVersionLast], [1, 1])
        assert.strictEqual(yield* engine.version, 1)
        // 2 layers of d=32 plus a 320×32 embedding, in 4 KiB chunks
        assert.isAbove(timings[0]!.chunks, 10)
        assert.strictEqual(sync.kind, "http")
        const health = yield* Effect.promise(() => fetch(`${url}/health`).then((r) => r.json()))
        assert.deepStrictEqual(health, { status: "ok", policy_version: 1 })
      }).pipe(
        Effect.provide(HttpWeightSync.layer({ url, token })),
        Effect.provide(RemoteEngine.layer({ url, model: "tiny" }))
      )
    )
  )

  it.live("the weight endpoint refuses a missing or wrong token with 401 and keeps the weights", () =>
    withServer((url) =>
      Effect.gen(function* () {
        const missing = yield* Effect.promise(() => fetch(`${url}/v1/weights`, { method: "POST", body: "x" }))
        assert.strictEqual(missing.status, 401)
        const other = Transformer.init(config, 12, 0.3)
        const snapshot = yield* Effect.promise(() => Snapshot.fromModel(other, PolicyVersion.make(3)))
        Transformer.dispose(other)
        const wrong = yield* WeightUpload.upload({ url, token: "wrong" }, snapshot).pipe(
          Effect.provide(FetchHttpClient.layer),
          Effect.flip
        )
        assert.include(wrong.message, "HTTP 401")
        const health = yield* Effect.promise(() => fetch(`${url}/health`).then((r) => r.json()))
        assert.deepStrictEqual(health, { status: "ok", policy_version: 0 })
      })
    )
  )

  it.live("completions take text and batched token-id prompts and answer in vLLM's shape", () =>
    withServer((url) =>
      Effect.gen(function* () {
        const text = yield* post(`${url}/v1/completions`, {
          model: "tiny",
          prompt: "Hi",
          max_tokens: 3,
          temperature: 0,
          logprobs: 0,
          ignore_eos: true
        })
        assert.strictEqual(text.status, 200)
        const choice = text.body.choices[0]
        assert.deepStrictEqual(Object.keys(choice.logprobs).sort(), [
          "text_offset",
          "token_logprobs",
          "tokens",
          "top_logprobs"
        ])
        assert.strictEqual(choice.token_ids.length, 3)
        assert.strictEqual(text.body.usage.prompt_tokens, 2) // "H", "i": no bos in the byte tokenizer
        const batch = yield* post(`${url}/v1/completions`, {
          model: "tiny",
          prompt: [[1, 2], [3]],
          n: 2,
          max_tokens: 2,
          seed: 5,
          logprobs: 0,
          return_tokens_as_token_ids: true,
          ignore_eos: true
        })
        assert.deepStrictEqual(
          batch.body.choices.map((c) => c.index),
          [0, 1, 2, 3]
        )
        const c0 = batch.body.choices[0]!
        assert.deepStrictEqual(
          c0.logprobs.tokens,
          c0.token_ids.map((id) => `token_id:${id}`)
        )
        // what RemoteEngine reads from it
        const read = RemoteWire.readChoice({ choices: [c0] })
        assert.deepStrictEqual(typeof read === "string" ? read : read.tokens, c0.token_ids)
        // prompt_logprobs (vLLM): null, then the log-prob of each later prompt token under the served weights
        const scored = yield* post(`${url}/v1/completions`, { prompt: [7, 8, 9], max_tokens: 1, prompt_logprobs: 0 })
        const entries = scored.body.choices[0]!.prompt_logprobs!
        assert.strictEqual(entries[0], null)
        const expectedPrompt = yield* Effect.promise(() => {
          const model = Transformer.init(config, 11, 0.3)
          return LogProbs.ofIds(model, [7, 8, 9]).finally(() => Transformer.dispose(model))
        })
        assert.closeTo(entries[1]!["8"]!.logprob, expectedPrompt[0]!, 1e-4)
        assert.closeTo(entries[2]!["9"]!.logprob, expectedPrompt[1]!, 1e-4)
        const bad = yield* post(`${url}/v1/completions`, { model: "tiny", prompt: [] })
        assert.strictEqual(bad.status, 400)
        const models = yield* Effect.promise(
          () =>
            fetch(`${url}/v1/models`).then((r) => r.json()) as Promise<{
              data: ReadonlyArray<{ id: string; max_model_len: number }>
            }>
        )
        assert.strictEqual(models.data[0]!.id, "tiny")
        assert.strictEqual(models.data[0]!.max_model_len, 512)
      })
    )
  )

  it.live("chat completions render the template with tools and answer with a message", () =>
    withServer((url) =>
      Effect.gen(function* () {
        const res = yield* post(`${url}/v1/chat/completions`, {
          model: "tiny",
          messages: [{ role: "user", content: "add 2 and 3" }],
          tools: [{ type: "function", function: { name: "add", parameters: { type: "object" } } }],
          max_tokens: 4,
          temperature: 0
        })
        assert.strictEqual(res.status, 200)
        assert.strictEqual(res.body.choices[0].message.role, "assistant")
        assert.include(["stop", "length", "tool_calls"], res.body.choices[0].finish_reason)
        assert.isAbove(res.body.prompt_token_ids.length, 10)
      })
    )
  )

  it.live("serve --watch loads each version a FileWeightSync writes, and greedy decoding follows it", () => {
    const watchDir = path.join(os.tmpdir(), `serve-watch-${process.pid}-${Date.now()}`)
    return withServer(
      (url) =>
        Effect.gen(function* () {
          yield* Effect.addFinalizer(() => Effect.promise(() => fs.rm(watchDir, { recursive: true, force: true })))
          const engine = yield* InferenceEngine
          const other = Transformer.init(config, 12, 0.3)
          const snapshot = yield* Effect.promise(() => Snapshot.fromModel(other, PolicyVersion.make(2)))
          Transformer.dispose(other)
          yield* FileWeightSync.make({ dir: watchDir }).publish({
            version: PolicyVersion.make(2),
            snapshot: Effect.succeed(snapshot)
          })
          const health = Effect.promise(
            () => fetch(`${url}/health`).then((r) => r.json()) as Promise<{ policy_version: number }>
          )
          const seen = yield* health.pipe(
            Effect.repeat({ schedule: Schedule.spaced("20 millis"), until: (h) => h.policy_version === 2, times: 200 })
          )
          assert.strictEqual(seen.policy_version, 2)
          const [result] = yield* engine.generate([{ promptIds: [5, 6], sampling: greedy(6) }])
          assert.deepStrictEqual(result!.tokens, (yield* localGreedy(12, [5, 6], 6)).tokens)
          assert.deepStrictEqual([result!.policyVersionFirst, result!.policyVersionLast], [2, 2])
        }).pipe(Effect.provide(RemoteEngine.layer({ url })), Effect.scoped),
      watchDir
    )
  })

  it.live("an unreachable server is a retryable InferenceError", () =>
    Effect.gen(function* () {
      const engine = yield* InferenceEngine
      const e = yield* engine.generate([{ promptIds: [1], sampling: greedy(2) }]).pipe(Effect.flip)
      assert.strictEqual(e.reason, "Unreachable")
      assert.isTrue(e.isRetryable)
    }).pipe(Effect.provide(RemoteEngine.layer({ url: "http://127.0.0.1:9", model: "m", maxRetries: 0 })))
  )
})

describe("RemoteEngine against a vLLM-shaped server", () => {
  /** A loopback server whose every completion is `n` tokens (id 7, log-prob −0.5), as vLLM answers with token ids. */
  const longServer = (n: number) =>
    Effect.acquireRelease(
      Effect.promise(
        () =>
          new Promise<http.Server>((ok) => {
            const body = JSON.stringify({
              choices: [
                {
                  index: 0,
                  token_ids: new Array<number>(n).fill(7),
                  logprobs: { token_logprobs: new Array<number>(n).fill(-0.5) },
                  finish_reason: "length"
                }
              ]
            })
            const server = http.createServer((request, response) => {
              request.resume()
              request.on("end", () => response.writeHead(200, { "content-type": "application/json" }).end(body))
            })
            server.listen(0, "127.0.0.1", () => ok(server))
          })
      ),
      (server) => Effect.promise(() => new Promise<void>((ok) => server.close(() => ok())))
    )

  it.live("takes an answer of 200,000 tokens (joined in a loop: push(...tokens) overflowed the stack)", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const server = yield* longServer(200_000)
        const { port } = server.address() as { port: number }
        const engine = yield* RemoteEngine.make({ url: `http://127.0.0.1:${port}`, model: "m", maxRetries: 0 })
        const [result] = yield* engine.generate([{ promptIds: [1, 2], sampling: greedy(200_000) }])
        assert.strictEqual(result!.tokens.length, 200_000)
        assert.strictEqual(result!.logprobs.length, 200_000)
        assert.strictEqual(result!.finishReason, "length")
      }).pipe(Effect.provide(FetchHttpClient.layer))
    )
  )
})

describe("ChatReply.chatMessage", () => {
  it("returns a hermes tool call in the text as tool_calls, with the text before it as content", () => {
    const text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    const { message, finishReason } = ChatReply.chatMessage(text, true)
    assert.strictEqual(finishReason, "tool_calls")
    assert.deepStrictEqual(message, {
      role: "assistant",
      content: "Let me add.",
      // arguments as vLLM's hermes parser writes them, json.dumps: what a template prints back is what was sampled
      tool_calls: [{ id: "call_0", type: "function", function: { name: "add", arguments: '{"a": 2, "b": 3}' } }]
    })
  })

  it("leaves text without calls, or a request without tools, as plain content", () => {
    assert.deepStrictEqual(ChatReply.chatMessage("5", true), {
      message: { role: "assistant", content: "5" },
      finishReason: undefined
    })
    const call = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    assert.deepStrictEqual(ChatReply.chatMessage(call, false).message, { role: "assistant", content: call })
  })
})
