import { spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect, Fiber } from "effect"
import { FetchHttpClient } from "effect/http"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as Snapshot from "../../src/model/Snapshot.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as WeightUpload from "../../src/weights/WeightUpload.ts"
import {
  checkpointDir,
  config,
  inProcessLogprobs,
  models,
  post,
  randomAdapter,
  serve,
  servedName,
  tempDir,
  token
} from "../fixtures/LoraServe.ts"
import pinned from "../fixtures/vllm-lora-api.json" with { type: "json" }

/** `node src/main.ts serve ARGS` as a child, killed with the scope; its listening URL. */
const serveCommand = (args: ReadonlyArray<string>, env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ readonly url: string; readonly stop: () => Promise<void> }>((resolve, reject) => {
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
            if (line === undefined) return
            const stop = () =>
              new Promise<void>((done) => {
                if (child.exitCode !== null) return done()
                child.once("exit", () => done())
                child.kill("SIGTERM")
              })
            resolve({ url: JSON.parse(line).url, stop })
          })
          child.on("exit", (code) => reject(new Error(`serve exited with ${code}: ${err}`)))
        })
    ),
    ({ stop }) => Effect.promise(stop)
  )

/** A pinned shape with its `<name>`, `<path>`, `<base>` placeholders filled in. */
const fill = <A>(shape: A, values: Record<string, string>): A =>
  JSON.parse(JSON.stringify(shape).replace(/<(name|path|base)>/g, (whole, key: string) => values[key] ?? whole)) as A

interface Choice {
  readonly token_ids: ReadonlyArray<number>
  readonly logprobs: { readonly token_logprobs: ReadonlyArray<number> }
  readonly policy_version_first: number
  readonly policy_version_last: number
  readonly prompt_logprobs?: ReadonlyArray<Record<string, { readonly logprob: number }> | null>
}
interface Completion {
  readonly model: string
  readonly choices: ReadonlyArray<Choice>
}

const prompt = [72, 105, 33, 7]

/** A sampled completion (temperature 1, seeded) of `prompt` for `model` (undefined: no `model` field). */
const sample = (url: string, model: string | undefined, maxTokens = 8, extra: Record<string, unknown> = {}) =>
  Effect.map(
    post(`${url}/v1/completions`, {
      ...(model === undefined ? {} : { model }),
      prompt,
      max_tokens: maxTokens,
      temperature: 1,
      seed: 3,
      logprobs: 0,
      ignore_eos: true,
      ...extra
    }),
    (r) => {
      assert.strictEqual(r.status, 200, r.text)
      return r.json as Completion
    }
  )

const load = (url: string, name: string, dir: string, extra: Record<string, unknown> = {}) =>
  post(`${url}/v1/load_lora_adapter`, { lora_name: name, lora_path: dir, ...extra })
const unload = (url: string, name: string) => post(`${url}/v1/unload_lora_adapter`, { lora_name: name })

/** Write `weights` as a PEFT directory under `root`; returns its path. */
const writeAdapter = (root: string, name: string, weights: Parameters<typeof Lora.writeDir>[1]) =>
  Effect.promise(async () => {
    const dir = path.join(root, name)
    await Lora.writeDir(dir, weights)
    return dir
  })

describe("serve: LoRA adapters through vLLM's runtime LoRA API", () => {
  it.live("an adapter with B = 0 samples exactly as the base", () =>
    Effect.gen(function* () {
      const url = yield* serve()
      const root = yield* tempDir("adapters-")
      const dir = yield* writeAdapter(root, "zero", yield* Effect.promise(() => randomAdapter(5, 0)))
      const loaded = yield* load(url, "zero", dir)
      assert.deepStrictEqual({ status: loaded.status, text: loaded.text }, fill(pinned.load.success, { name: "zero" }))
      const base = yield* sample(url, undefined, 12)
      const adapted = yield* sample(url, "zero", 12)
      assert.strictEqual(adapted.model, "zero")
      assert.strictEqual(base.model, servedName)
      assert.deepStrictEqual(adapted.choices[0]!.token_ids, base.choices[0]!.token_ids)
      assert.deepStrictEqual(adapted.choices[0]!.logprobs.token_logprobs, base.choices[0]!.logprobs.token_logprobs)
    }).pipe(Effect.scoped)
  )

  it.live("an adapter's served log-probs are the trainer's with that adapter attached", () =>
    Effect.gen(function* () {
      const url = yield* serve()
      const root = yield* tempDir("adapters-")
      const weights = yield* Effect.promise(() => randomAdapter(7, 0.5))
      const dir = yield* writeAdapter(root, "policy-v7", weights)
      assert.strictEqual((yield* load(url, "policy-v7", dir)).status, 200)
      const result = yield* sample(url, "policy-v7", 10, { prompt_logprobs: 0 })
      const choice = result.choices[0]!
      const ids = [...prompt, ...choice.token_ids]
      const expected = inProcessLogprobs(ids, prompt.length, weights)
      const served = choice.logprobs.token_logprobs
      assert.strictEqual(served.length, 10)
      served.forEach((lp, i) => assert.closeTo(lp, expected[i]!, 1e-5))
      // the adapter matters: the base alone gives the same tokens other log-probs
      const baseOnly = inProcessLogprobs(ids, prompt.length, undefined)
      assert.isAbove(Math.max(...served.map((lp, i) => Math.abs(lp - baseOnly[i]!))), 1e-3)
      // prompt log-probs are the adapter's too
      const promptExpected = inProcessLogprobs(prompt, 1, weights)
      choice.prompt_logprobs!.slice(1).forEach((entry, t) => {
        assert.closeTo(entry![String(prompt[t + 1])]!.logprob, promptExpected[t]!, 1e-5)
      })
      // a name ending in -v<N> reports version N; another reports the base's
      assert.deepStrictEqual([choice.policy_version_first, choice.policy_version_last], [7, 7])
      const plainDir = yield* writeAdapter(root, "plain", weights)
      assert.strictEqual((yield* load(url, "plain", plainDir)).status, 200)
      const plain = (yield* sample(url, "plain", 2)).choices[0]!
      assert.deepStrictEqual([plain.policy_version_first, plain.policy_version_last], [0, 0])
      // chat completions take the adapter by name as well
      const chat = yield* post(`${url}/v1/chat/completions`, {
        model: "plain",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 2
      })
      assert.strictEqual(chat.status, 200, chat.text)
      assert.strictEqual((chat.json as { model: string }).model, "plain")
    }).pipe(Effect.scoped)
  )

  it.live("new base weights reach the adapters loaded over them", () =>
    Effect.gen(function* () {
      const url = yield* serve()
      const root = yield* tempDir("adapters-")
      const weights = yield* Effect.promise(() => randomAdapter(9, 0.5))
      assert.strictEqual((yield* load(url, "a", yield* writeAdapter(root, "a", weights))).status, 200)
      yield* sample(url, "a", 2) // builds the adapter engine's view on the old base
      const other = Transformer.init(config, 12, 0.3)
      const snapshot = yield* Effect.promise(() => Snapshot.fromModel(other, PolicyVersion.make(1)))
      Transformer.dispose(other)
      yield* WeightUpload.upload({ url, token }, snapshot).pipe(Effect.provide(FetchHttpClient.layer))
      const choice = (yield* sample(url, "a", 6)).choices[0]!
      const expected = inProcessLogprobs([...prompt, ...choice.token_ids], prompt.length, weights, 12)
      choice.logprobs.token_logprobs.forEach((lp, i) => assert.closeTo(lp, expected[i]!, 1e-5))
      assert.deepStrictEqual([choice.policy_version_first, choice.policy_version_last], [1, 1])
    }).pipe(Effect.scoped)
  )

  it.live("/v1/models lists adapters as vLLM does; unload removes them; refusals are vLLM's", () =>
    Effect.gen(function* () {
      const url = yield* serve({ maxLoras: 2 })
      const root = yield* tempDir("adapters-")
      const weights = yield* Effect.promise(() => randomAdapter(3, 0.5))
      const dir = yield* writeAdapter(root, "first", weights)
      const expectError = (
        answer: { readonly status: number; readonly json: unknown; readonly text: string },
        shape: { readonly status: number; readonly body: unknown },
        values: Record<string, string>
      ) => assert.deepStrictEqual({ status: answer.status, body: answer.json }, fill(shape, values), answer.text)

      assert.strictEqual((yield* load(url, "first", dir)).status, 200)
      const listed = yield* models(url)
      assert.deepStrictEqual(
        listed.data.map((m) => m.id),
        [servedName, "first"]
      )
      const card = listed.data[1]!
      assert.deepStrictEqual(
        { id: card.id, root: card.root, parent: card.parent, max_model_len: card.max_model_len },
        (({ object: _, ...rest }) => rest)(
          fill(pinned.models.adapterCard, { name: "first", path: dir, base: servedName })
        )
      )

      expectError(yield* load(url, "first", dir), pinned.errors.alreadyLoaded, { name: "first" })
      expectError(yield* post(`${url}/v1/load_lora_adapter`, { lora_name: "x" }), pinned.errors.loadMissingFields, {})
      expectError(yield* post(`${url}/v1/unload_lora_adapter`, {}), pinned.errors.unloadMissingName, {})
      expectError(yield* unload(url, "nobody"), pinned.errors.unloadNotFound, { name: "nobody" })
      const nowhere = path.join(root, "nowhere")
      expectError(yield* load(url, "lost", nowhere), pinned.errors.noAdapter, { name: "lost", path: nowhere })
      expectError(
        yield* post(`${url}/v1/completions`, { model: "nobody", prompt: [1, 2], max_tokens: 1 }),
        pinned.errors.unknownModel,
        { name: "nobody" }
      )

      // an adapter whose rank is not its config's: 400 naming the weights file
      const wrongRank = yield* writeAdapter(root, "wrong-rank", { ...weights, rank: 2 })
      const refused = yield* load(url, "wrong-rank", wrongRank)
      const unreadable = pinned.errors.unreadable
      assert.strictEqual(refused.status, unreadable.status)
      const body = refused.json as typeof unreadable.body
      assert.deepStrictEqual({ ...body.error, message: "" }, { ...unreadable.body.error, message: "" })
      assert.include(body.error.message, path.join(wrongRank, Lora.weightsFile))
      assert.include(body.error.message, "rank")
      // a missing weights file: 400 naming it
      const noWeights = yield* writeAdapter(root, "no-weights", weights)
      yield* Effect.promise(() => fs.rm(path.join(noWeights, Lora.weightsFile)))
      const missing = yield* load(url, "no-weights", noWeights)
      assert.strictEqual(missing.status, 400)
      assert.include((missing.json as typeof unreadable.body).error.message, path.join(noWeights, Lora.weightsFile))

      // --max-loras 2: a third adapter is refused until one is unloaded
      assert.strictEqual((yield* load(url, "second", dir)).status, 200)
      const third = yield* load(url, "third", dir)
      assert.strictEqual(third.status, 400)
      assert.include((third.json as typeof unreadable.body).error.message, "--max-loras")
      // load_inplace replaces an adapter under its name, past the limit
      assert.strictEqual((yield* load(url, "second", dir, { load_inplace: true })).status, 200)

      const removed = yield* unload(url, "first")
      assert.deepStrictEqual(
        { status: removed.status, text: removed.text },
        fill(pinned.unload.success, { name: "first" })
      )
      assert.deepStrictEqual(
        (yield* models(url)).data.map((m) => m.id),
        [servedName, "second"]
      )
      expectError(
        yield* post(`${url}/v1/completions`, { model: "first", prompt: [1, 2], max_tokens: 1 }),
        pinned.errors.unknownModel,
        { name: "first" }
      )
      assert.strictEqual((yield* load(url, "third", dir)).status, 200)
    }).pipe(Effect.scoped)
  )

  it.live("without --enable-lora the LoRA routes answer 404 as vLLM's do", () =>
    Effect.gen(function* () {
      const url = yield* serve({ enableLora: false })
      for (const route of [pinned.load.path, pinned.unload.path]) {
        const answer = yield* post(`${url}${route}`, { lora_name: "a", lora_path: "/tmp" })
        assert.deepStrictEqual({ status: answer.status, body: answer.json }, pinned.errors.disabled)
      }
      const unknown = yield* post(`${url}/v1/completions`, { model: "a", prompt: [1], max_tokens: 1 })
      assert.strictEqual(unknown.status, 404)
    }).pipe(Effect.scoped)
  )

  it.live("unloading an adapter lets its requests in flight finish, then frees its tensors", () =>
    Effect.gen(function* () {
      const url = yield* serve()
      const root = yield* tempDir("adapters-")
      const weights = yield* Effect.promise(() => randomAdapter(4, 0.5))
      const dir = yield* writeAdapter(root, "busy", weights)
      yield* sample(url, undefined, 2) // the base engine's own view and caches, before counting
      const before = tf.memory().numTensors
      assert.strictEqual((yield* load(url, "busy", dir)).status, 200)
      const order: Array<string> = []
      const long = yield* sample(url, "busy", 400).pipe(
        Effect.tap(() => Effect.sync(() => order.push("completion"))),
        Effect.forkChild
      )
      yield* Effect.sleep("300 millis")
      const removed = yield* unload(url, "busy")
      order.push("unload")
      assert.strictEqual(removed.status, 200)
      assert.notInclude(
        (yield* models(url)).data.map((m) => m.id),
        "busy"
      )
      const result = yield* Fiber.join(long)
      assert.deepStrictEqual(order, ["unload", "completion"]) // the unload answered while the request ran
      const choice = result.choices[0]!
      assert.strictEqual(choice.token_ids.length, 400)
      const expected = inProcessLogprobs([...prompt, ...choice.token_ids], prompt.length, weights)
      choice.logprobs.token_logprobs.forEach((lp, i) => assert.closeTo(lp, expected[i]!, 1e-4))
      assert.strictEqual(tf.memory().numTensors, before)
    }).pipe(Effect.scoped)
  )

  it.live(
    "the command opens the routes with --enable-lora or VLLM_ALLOW_RUNTIME_LORA_UPDATING, and takes --max-loras",
    () =>
      Effect.gen(function* () {
        const model = yield* checkpointDir
        const root = yield* tempDir("adapters-")
        const dir = yield* writeAdapter(root, "a", yield* Effect.promise(() => randomAdapter(2, 0.5)))
        const [flagged, fromEnv] = yield* Effect.all(
          [
            serveCommand(["--model", model, "--port", "0", "--backend", "cpu", "--enable-lora"], {}),
            serveCommand(["--model", model, "--port", "0", "--backend", "cpu", "--max-loras", "1"], {
              VLLM_ALLOW_RUNTIME_LORA_UPDATING: "True"
            })
          ],
          { concurrency: 2 }
        )
        for (const { url } of [flagged, fromEnv]) {
          assert.deepStrictEqual(
            { status: (yield* load(url, "a", dir)).status, listed: (yield* models(url)).data.map((m) => m.id) },
            { status: 200, listed: [path.basename(model), "a"] }
          )
        }
        assert.strictEqual((yield* load(flagged.url, "b", dir)).status, 200)
        const refused = yield* load(fromEnv.url, "b", dir)
        assert.strictEqual(refused.status, 400)
        assert.include(refused.text, "--max-loras")
      }).pipe(Effect.scoped)
  )
})
