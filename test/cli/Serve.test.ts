import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
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

describe("serve (the command, as a child process)", () => {
  it.live("listens on loopback, answers /health and completions, gates /v1/weights by token, stops on SIGTERM", () =>
    Effect.scoped(
      Effect.gen(function* () {
        yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
        const dir = yield* Effect.acquireRelease(
          Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "serve-cli-"))),
          (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
        )
        const model = Transformer.init(config, 3, 0.3)
        yield* Effect.promise(() => Checkpoint.save(model, dir))
        Transformer.dispose(model)
        yield* AutoTokenizer.save(ByteTokenizer.make(), dir).pipe(Effect.provide(NodeServices.layer), Effect.orDie)

        const withToken = yield* serve(["--model", dir, "--port", "0", "--token-env", "TEST_SERVE_TOKEN"], {
          TEST_SERVE_TOKEN: "tok"
        })
        assert.match(withToken.url, /^http:\/\/127\.0\.0\.1:\d+$/)
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
