import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as http from "node:http"
import * as os from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it, layer } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"

const config = ModelConfig.fromInit({
  architecture: "qwen3",
  vocab_size: 320,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  max_position_embeddings: 64,
  tie_word_embeddings: true
})

/** `node src/main.ts serve ...` as a child, killed with the scope; resolves with its listening URL. */
const serve = (args: ReadonlyArray<string>, env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ child: ChildProcess; url: string; stderr: () => string }>((resolve, reject) => {
          const child = spawn(process.execPath, ["src/main.ts", "serve", ...args], {
            env: { ...process.env, NO_COLOR: "1", ...env },
            stdio: ["ignore", "pipe", "pipe"]
          })
          let out = ""
          let err = ""
          child.stderr!.on("data", (d) => {
            err += String(d)
          })
          child.stdout!.on("data", (d) => {
            out += String(d)
            const line = out.split("\n").find((l) => l.startsWith('{"event":"listening"'))
            if (line !== undefined) resolve({ child, url: JSON.parse(line).url, stderr: () => err })
          })
          child.on("exit", (code) => reject(new Error(`serve exited with ${code}: ${err}`)))
        })
    ),
    ({ child }) =>
      Effect.promise(
        () =>
          new Promise<void>((resolve) => {
            if (child.exitCode !== null) return resolve()
            child.once("exit", () => resolve())
            child.kill("SIGTERM")
          })
      )
  )

/** A checkpoint directory of `config` (seed 3) with the byte tokenizer, removed with the scope. */
const checkpointDir = Effect.gen(function* () {
  yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
  const dir = yield* Effect.acquireRelease(
    Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "serve-cli-"))),
    (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
  )
  const model = Transformer.init(config, 3, 0.3)
  yield* Effect.promise(() => Checkpoint.save(model, dir))
  Transformer.dispose(model)
  yield* AutoTokenizer.save(ByteTokenizer.make(), dir).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
  return dir
})

describe("serve (the command, as a child process)", () => {
  it.live("listens on loopback, answers /health and completions, gates /v1/weights by token, stops on SIGTERM", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const dir = yield* checkpointDir

        const withToken = yield* serve(["--model", dir, "--port", "0", "--token-env", "TEST_SERVE_TOKEN"], {
          TEST_SERVE_TOKEN: "tok"
        })
        assert.match(withToken.url, /^http:\/\/127\.0\.0\.1:\d+$/)
        // no --backend: auto, as configs default it (a checkpoint too big for wasm's 4 GB heap serves)
        assert.match(withToken.stderr(), /tensor backend: [\w-]+ \(auto\)/)
        const health = yield* Effect.promise(() => fetch(`${withToken.url}/health`).then((r) => r.json()))
        assert.deepStrictEqual(health, { status: "ok", policy_version: 0 })
        const completion = yield* Effect.promise(() =>
          fetch(`${withToken.url}/v1/completions`, {
            method: "POST",
            body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 4, temperature: 0, ignore_eos: true })
          }).then((r) => r.json() as Promise<{ choices: ReadonlyArray<{ token_ids: ReadonlyArray<number> }> }>)
        )
        assert.strictEqual(completion.choices[0]!.token_ids.length, 4)
        const unauthorised = yield* Effect.promise(() =>
          fetch(`${withToken.url}/v1/weights`, { method: "POST", headers: { authorization: "Bearer nope" } })
        )
        assert.strictEqual(unauthorised.status, 401)

        // no token in the environment: the server runs, the weight endpoint stays closed
        const noToken = yield* serve(["--model", dir, "--port", "0", "--token-env", "TEST_SERVE_TOKEN_UNSET"], {})
        assert.include(noToken.stderr(), "TEST_SERVE_TOKEN_UNSET is not set")
        const closed = yield* Effect.promise(() =>
          fetch(`${noToken.url}/v1/weights`, { method: "POST", headers: { authorization: "Bearer " } })
        )
        assert.strictEqual(closed.status, 403)

        const exited = yield* Effect.promise(
          () =>
            new Promise<number | null>((resolve) => {
              withToken.child.once("exit", (code) => resolve(code))
              withToken.child.kill("SIGTERM")
            })
        )
        assert.isNotNull(exited) // ended by the signal's interrupt, not killed hard
      })
    )
  )
})

/** Two `serve` children over one checkpoint: default limits, and limits set by flags. */
class Servers extends Context.Service<Servers, { readonly defaults: string; readonly flagged: string }>()(
  "test/cli/Servers"
) {}

const servers = Layer.effect(
  Servers,
  Effect.gen(function* () {
    const dir = yield* checkpointDir
    const [defaults, flagged] = yield* Effect.all(
      [
        serve(["--model", dir, "--port", "0"], {}),
        serve(
          ["--model", dir, "--port", "0", "--max-model-len", "32", "--max-request-bytes", "4096", "--max-n", "2"],
          {}
        )
      ],
      { concurrency: 2 }
    )
    return Servers.of({ defaults: defaults.url, flagged: flagged.url })
  })
)

interface ErrorBody {
  readonly error: {
    readonly message: string
    readonly type: string
    readonly param: string | null
    readonly code: number
  }
}

/** POST a body (JSON-encoded unless a string) and read the status and the JSON answer. */
const post = (url: string, body: unknown) =>
  Effect.promise(async () => {
    const res = await fetch(url, { method: "POST", body: typeof body === "string" ? body : JSON.stringify(body) })
    return { status: res.status, body: (await res.json()) as ErrorBody & { readonly choices?: ReadonlyArray<unknown> } }
  })

/** vLLM's 400 body (since v0.10.1): nested under `error`, `type` BadRequestError, `param` the field at fault. */
const badRequest = (message: string, param: string | null) => ({
  status: 400,
  body: { error: { message, type: "BadRequestError", param, code: 400 } }
})

/**
 * POST `total` bytes of `{"prompt": "aaa…` in 64 KiB chunks, each after the last drained, until the server answers.
 * Resolves with the answer and the bytes written by then: a server that reads the whole body answers only after all.
 */
const upload = (url: string, total: number, declareLength: boolean) =>
  Effect.promise(
    () =>
      new Promise<{ status: number; body: ErrorBody; written: number }>((resolve, reject) => {
        const request = http.request(`${url}/v1/completions`, {
          method: "POST",
          headers: declareLength ? { "content-length": String(total) } : {} // else chunked
        })
        let written = 0
        let answered = false
        request.on("response", (res) => {
          answered = true
          let text = ""
          res.setEncoding("utf8")
          res.on("data", (d) => {
            text += d
          })
          res.on("end", () => resolve({ status: res.statusCode!, body: JSON.parse(text), written }))
        })
        // once it has answered, the server closes the connection under the rest of the upload
        request.on("error", (e) => (answered ? undefined : reject(e)))
        const chunk = Buffer.alloc(64 * 1024, "a")
        chunk.write('{"prompt": "')
        const pump = () => {
          while (!answered && written < total) {
            written += chunk.length
            if (!request.write(chunk)) return void request.once("drain", pump)
          }
          if (!answered) request.end()
        }
        pump()
      })
  )

layer(servers, { excludeTestServices: true, timeout: "120 seconds" })("serve: request limits (vLLM's 400s)", (it) => {
  it.effect("refuses a body that is not JSON, or not an object, with 400 in vLLM's error shape", () =>
    Effect.gen(function* () {
      const { defaults } = yield* Servers
      const broken = yield* post(`${defaults}/v1/completions`, '{"prompt": [1, 2')
      assert.strictEqual(broken.status, 400)
      assert.match(broken.body.error.message, /^the body is not valid JSON: /)
      assert.deepStrictEqual(
        { ...broken.body.error, message: "" },
        { message: "", type: "BadRequestError", param: null, code: 400 }
      )
      assert.deepStrictEqual(
        yield* post(`${defaults}/v1/chat/completions`, [1, 2]),
        badRequest("the body must be a JSON object", null)
      )
    })
  )

  it.effect("refuses prompt + max_tokens past max_model_len (64) with vLLM's message, and serves 60 + 4", () =>
    Effect.gen(function* () {
      const { defaults } = yield* Servers
      const prompt = Array.from({ length: 60 }, (_, i) => 1 + (i % 200))
      assert.deepStrictEqual(
        yield* post(`${defaults}/v1/completions`, { prompt, max_tokens: 10 }),
        badRequest(
          "This model's maximum context length is 64 tokens. However, you requested 70 tokens (60 in the messages, " +
            "10 in the completion). Please reduce the length of the messages or completion.",
          "max_tokens"
        )
      )
      // 500,000 characters of text: 500,000 byte tokens, refused before any is generated
      assert.deepStrictEqual(
        yield* post(`${defaults}/v1/completions`, { prompt: "a".repeat(500_000) }),
        badRequest(
          "This model's maximum context length is 64 tokens. However, you requested 500000 tokens in the messages, " +
            "Please reduce the length of the messages.",
          "input_tokens"
        )
      )
      const chat = yield* post(`${defaults}/v1/chat/completions`, {
        messages: [{ role: "user", content: "x".repeat(100) }],
        max_completion_tokens: 1
      })
      assert.strictEqual(chat.status, 400)
      assert.match(
        chat.body.error.message,
        /^This model's maximum context length is 64 tokens\. However, you requested \d+ tokens \(\d+ in the messages, 1 in the completion\)/
      )
      // exactly the context: 60 + 4 = 64; without max_tokens the default 16 is cut to the 4 left
      for (const body of [{ prompt, max_tokens: 4 }, { prompt }]) {
        const ok = yield* post(`${defaults}/v1/completions`, { ...body, ignore_eos: true })
        assert.strictEqual(ok.status, 200)
        assert.strictEqual(
          (ok.body.choices as ReadonlyArray<{ token_ids: ReadonlyArray<number> }>)[0]!.token_ids.length,
          4
        )
      }
    })
  )

  it.effect("bounds n to 1..64 and max_tokens to positive integers", () =>
    Effect.gen(function* () {
      const { defaults } = yield* Servers
      const completions = `${defaults}/v1/completions`
      const refused: ReadonlyArray<readonly [Record<string, unknown>, string, string]> = [
        [{ n: 0 }, "n must be at least 1, got 0.", "n"],
        [{ n: 65 }, "n must be at most 64, got 65.", "n"],
        [{ n: 1.5 }, "n must be an integer, got 1.5.", "n"],
        [{ max_tokens: 0 }, "max_tokens must be at least 1, got 0.", "max_tokens"],
        [{ max_tokens: -5 }, "max_tokens must be at least 1, got -5.", "max_tokens"],
        [{ max_tokens: 2.5 }, "max_tokens must be an integer, got 2.5.", "max_tokens"],
        [{ max_tokens: "3" }, 'max_tokens must be an integer, got "3".', "max_tokens"]
      ]
      for (const [fields, message, param] of refused) {
        assert.deepStrictEqual(yield* post(completions, { prompt: [1, 2], ...fields }), badRequest(message, param))
      }
      assert.deepStrictEqual(
        yield* post(`${defaults}/v1/chat/completions`, {
          messages: [{ role: "user", content: "hi" }],
          max_completion_tokens: 0
        }),
        badRequest("max_completion_tokens must be at least 1, got 0.", "max_completion_tokens")
      )
      const most = yield* post(completions, { prompt: [1, 2], n: 64, max_tokens: 1 })
      assert.strictEqual(most.body.choices?.length, 64)
    })
  )

  it.effect("refuses a 32 MiB body with 413 after reading at most the limit (1 MiB), then keeps serving", () =>
    Effect.gen(function* () {
      const { defaults } = yield* Servers
      const total = 32 * 2 ** 20
      // declared: refused from the headers; chunked: refused once 1 MiB has arrived. Either way the upload is cut
      // short (what was written beyond the limit sits in socket buffers, a few MiB at most)
      for (const declareLength of [true, false]) {
        const { status, body, written } = yield* upload(defaults, total, declareLength)
        assert.deepStrictEqual(
          { status, body },
          {
            status: 413,
            body: {
              error: {
                message: "the request body exceeds this server's limit of 1048576 bytes",
                type: "RequestEntityTooLargeError",
                param: null,
                code: 413
              }
            }
          }
        )
        assert.isBelow(written, total / 2, declareLength ? "Content-Length" : "chunked")
      }
      const health = yield* Effect.promise(() => fetch(`${defaults}/health`).then((r) => r.json()))
      assert.deepStrictEqual(health, { status: "ok", policy_version: 0 })
      const ok = yield* post(`${defaults}/v1/completions`, { prompt: [1, 2, 3], max_tokens: 2, ignore_eos: true })
      assert.strictEqual(ok.status, 200)
    })
  )

  it.effect("takes its limits from --max-model-len, --max-request-bytes and --max-n", () =>
    Effect.gen(function* () {
      const { flagged } = yield* Servers
      const models = yield* Effect.promise(() => fetch(`${flagged}/v1/models`).then((r) => r.json()))
      assert.strictEqual((models as { data: ReadonlyArray<{ max_model_len: number }> }).data[0]!.max_model_len, 32)
      assert.deepStrictEqual(
        yield* post(`${flagged}/v1/completions`, { prompt: Array.from({ length: 30 }, () => 7), max_tokens: 3 }),
        badRequest(
          "This model's maximum context length is 32 tokens. However, you requested 33 tokens (30 in the messages, " +
            "3 in the completion). Please reduce the length of the messages or completion.",
          "max_tokens"
        )
      )
      assert.deepStrictEqual(
        yield* post(`${flagged}/v1/completions`, { prompt: [1], n: 3 }),
        badRequest("n must be at most 2, got 3.", "n")
      )
      const big = yield* post(`${flagged}/v1/completions`, { prompt: "a".repeat(5000) })
      assert.strictEqual(big.status, 413)
      assert.strictEqual(big.body.error.message, "the request body exceeds this server's limit of 4096 bytes")
    })
  )
})
