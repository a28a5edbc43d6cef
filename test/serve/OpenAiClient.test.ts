/**
 * `serve` through the official `openai` npm client, as a user of vLLM would drive it: the quickstart policy served in
 * process (127.0.0.1, port 0) from a run directory whose config.yaml says `tool_prompt: none`, so the policy sees the
 * tools as in training and writes hermes tool calls. Streaming text and tool calls (SSE, `[DONE]`, the usage chunk,
 * vLLM's token ids), `tool_choice`, `top_logprobs` (recomputed here), `GET /v1/models/{id}`, OpenAI error bodies for
 * 4xx (unknown model, route, method, context overflow) and the busy-port error.
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { Effect, Exit, Scope } from "effect"
import OpenAI from "openai"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as Serve from "../../src/layers/Serve.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as Checkpointer from "../../src/store/Checkpointer.ts"

const policyDir = path.resolve(import.meta.dirname, "../../data/quickstart/policy")
const servedName = "quickstart"

const tool = (name: string, description: string): OpenAI.Chat.ChatCompletionFunctionTool => ({
  type: "function",
  function: {
    name,
    description,
    parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"] }
  }
})
const tools = [tool("add", "a + b"), tool("subtract", "a - b"), tool("multiply", "a * b")]
const question: Array<OpenAI.Chat.ChatCompletionMessageParam> = [{ role: "user", content: "Compute (5 - 4) + 2." }]

let scope: Scope.Closeable
let runDir: string
let url: string
let client: OpenAI

/** A run directory: config.yaml (`tool_prompt: none`) and the policy as its only checkpoint, `step-375`. */
const makeRun = async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "openai-client-"))
  const step = path.join(dir, "checkpoints", "step-375")
  await fs.mkdir(step, { recursive: true })
  for (const file of await fs.readdir(policyDir)) await fs.copyFile(path.join(policyDir, file), path.join(step, file))
  await fs.writeFile(path.join(dir, "config.yaml"), "environment:\n  tool_prompt: none\n  tool_call_format: hermes\n")
  return dir
}

const serve = (options: Partial<Serve.ServeOptions> = {}) =>
  Effect.gen(function* () {
    // as `serve --model RUN_DIR` resolves it
    const model = yield* Effect.promise(() => Checkpointer.resolveModelDir(runDir))
    return yield* Serve.start({
      model,
      host: "127.0.0.1",
      port: 0,
      token: undefined,
      modelName: servedName,
      ...options
    })
  }).pipe(Effect.provide(NodeServices.layer))

beforeAll(async () => {
  await Effect.runPromise(TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" }))
  runDir = await makeRun()
  scope = await Effect.runPromise(Scope.make())
  url = await Effect.runPromise(serve().pipe(Scope.provide(scope), Effect.orDie))
  client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 })
}, 120_000)

afterAll(async () => {
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await fs.rm(runDir, { recursive: true, force: true })
})

/** The API error a call fails with (the client throws `OpenAI.APIError`). */
const apiError = async (call: () => Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> => {
  try {
    await call()
  } catch (e) {
    if (e instanceof OpenAI.APIError) return e
    throw e
  }
  throw new Error("the call succeeded")
}

/** A fetch answer's status and JSON body. */
const raw = async (method: string, route: string) => {
  const res = await fetch(`${url}${route}`, { method, ...(method === "POST" ? { body: "{}" } : {}) })
  return { status: res.status, body: (await res.json()) as { error: Record<string, unknown> } }
}

describe("serve through the openai client", () => {
  it("lists the served model and answers GET /v1/models/{id}; unknown ids are 404s with OpenAI's error body", async () => {
    const list = await client.models.list()
    assert.deepStrictEqual(
      list.data.map((m) => m.id),
      [servedName]
    )
    const card = await client.models.retrieve(servedName)
    assert.strictEqual(card.id, servedName)
    const missing = await apiError(() => client.models.retrieve("nope"))
    assert.strictEqual(missing.status, 404)
    assert.strictEqual((missing.error as { message: string }).message, "The model `nope` does not exist.")
  })

  it("streams a completion token by token: text, log-probs, token ids, [DONE] and a usage chunk", async () => {
    const body = {
      model: servedName,
      prompt: "Compute 2 + 2.",
      max_tokens: 12,
      temperature: 0,
      logprobs: 0,
      return_token_ids: true
    }
    const whole = await client.completions.create({
      ...body,
      stream: false
    } as OpenAI.CompletionCreateParamsNonStreaming)
    const stream = await client.completions.create({
      ...body,
      stream: true,
      stream_options: { include_usage: true }
    } as OpenAI.CompletionCreateParamsStreaming)
    let text = ""
    const ids: Array<number> = []
    const logprobs: Array<number> = []
    let usage: OpenAI.CompletionUsage | undefined | null
    let finish: string | null = null
    let chunks = 0
    for await (const chunk of stream) {
      chunks++
      if (chunk.usage) usage = chunk.usage
      for (const c of chunk.choices) {
        text += c.text
        ids.push(...((c as unknown as { token_ids: Array<number> }).token_ids ?? []))
        logprobs.push(...(c.logprobs?.token_logprobs ?? []))
        finish = c.finish_reason ?? finish
      }
    }
    const choice = whole.choices[0]!
    assert.strictEqual(text, choice.text)
    assert.deepStrictEqual(ids, (choice as unknown as { token_ids: Array<number> }).token_ids)
    assert.deepStrictEqual(logprobs, choice.logprobs!.token_logprobs)
    assert.strictEqual(finish, choice.finish_reason)
    assert.strictEqual(chunks, ids.length + 1) // one per token, then the usage chunk
    assert.deepStrictEqual(usage, whole.usage)
    // on the wire: Server-Sent Events ending in [DONE]
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...body, stream: true })
    })
    assert.strictEqual(res.headers.get("content-type"), "text/event-stream")
    const events = (await res.text()).split("\n\n").filter((e) => e !== "")
    assert.isTrue(events.every((e) => e.startsWith("data: ")))
    assert.strictEqual(events.at(-1), "data: [DONE]")
    assert.strictEqual(events.length, ids.length + 1)
  })

  it("streams a chat turn with tool calls in OpenAI's delta shape; the deltas rebuild the whole answer", async () => {
    const body = { model: servedName, messages: question, tools, temperature: 0, max_tokens: 48, logprobs: true }
    const whole = await client.chat.completions.create(body)
    const message = whole.choices[0]!.message
    assert.strictEqual(whole.choices[0]!.finish_reason, "tool_calls")
    assert.isAbove(message.tool_calls!.length, 0)
    const stream = await client.chat.completions.create({
      ...body,
      stream: true,
      stream_options: { include_usage: true }
    })
    const calls: Array<{ id?: string; name: string; arguments: string }> = []
    const ids: Array<number> = []
    const logprobs: Array<number> = []
    let finish: string | null = null
    let usage: OpenAI.CompletionUsage | undefined | null
    let role: string | undefined
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage
      for (const c of chunk.choices) {
        role ??= c.delta.role
        ids.push(...((c as unknown as { token_ids?: Array<number> }).token_ids ?? []))
        logprobs.push(...(c.logprobs?.content ?? []).map((e) => e.logprob))
        for (const d of c.delta.tool_calls ?? []) {
          calls[d.index] ??= { name: "", arguments: "" }
          const call = calls[d.index]!
          if (d.id !== undefined) call.id = d.id
          call.name += d.function?.name ?? ""
          call.arguments += d.function?.arguments ?? ""
        }
        finish = c.finish_reason ?? finish
      }
    }
    assert.strictEqual(role, "assistant")
    assert.strictEqual(finish, "tool_calls")
    // call ids are unique per response: the streamed answer's are its own
    for (const [j, call] of calls.entries()) {
      assert.match(call.id ?? "", /^call_\w+$/)
      assert.notStrictEqual(call.id, message.tool_calls![j]!.id)
    }
    assert.deepStrictEqual(
      calls.map(({ id: _, ...call }) => call),
      message.tool_calls!.map((c) => ({
        name: (c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function.name,
        arguments: (c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function.arguments
      }))
    )
    assert.deepStrictEqual(ids, (whole.choices[0] as unknown as { token_ids: Array<number> }).token_ids)
    assert.deepStrictEqual(
      logprobs,
      whole.choices[0]!.logprobs!.content!.map((e) => e.logprob)
    )
    assert.deepStrictEqual(usage, whole.usage)
  })

  it("streams a plain chat reply as content deltas (tool_choice none: no calls read)", async () => {
    const body = {
      model: servedName,
      messages: question,
      tools,
      tool_choice: "none" as const,
      temperature: 0,
      max_tokens: 24
    }
    const whole = await client.chat.completions.create(body)
    assert.isUndefined(whole.choices[0]!.message.tool_calls)
    assert.notStrictEqual(whole.choices[0]!.finish_reason, "tool_calls")
    const stream = await client.chat.completions.create({ ...body, stream: true })
    let content = ""
    for await (const chunk of stream) for (const c of chunk.choices) content += c.delta.content ?? ""
    assert.strictEqual(content, whole.choices[0]!.message.content)
  })

  it("tool_choice: required and a named function constrain the reply to the calls asked for", async () => {
    const base = { model: servedName, messages: question, tools, temperature: 0, max_tokens: 48 }
    const auto = await client.chat.completions.create({ ...base, tool_choice: "auto" })
    // the run's `tool_prompt: none`: the tools reach the tool parser, not the prompt
    const bare = await client.chat.completions.create({ model: servedName, messages: question, max_tokens: 1 })
    const promptOf = (c: unknown) => (c as { prompt_token_ids: Array<number> }).prompt_token_ids
    assert.deepStrictEqual(promptOf(auto), promptOf(bare))
    const first = auto.choices[0]!.message.tool_calls![0] as OpenAI.Chat.ChatCompletionMessageFunctionToolCall
    const required = await client.chat.completions.create({ ...base, tool_choice: "required" })
    assert.strictEqual(required.choices[0]!.finish_reason, "tool_calls")
    const named = await client.chat.completions.create({
      ...base,
      tool_choice: { type: "function", function: { name: first.function.name } }
    })
    assert.isTrue(
      named.choices[0]!.message.tool_calls!.every(
        (c) => (c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function.name === first.function.name
      )
    )
    // a function the policy would not call here: decoding is constrained to it, arguments as its schema says
    const other = tools.map((t) => t.function.name).find((n) => n !== first.function.name && n !== "add")!
    const forced = await client.chat.completions.create({
      ...base,
      max_tokens: 64,
      tool_choice: { type: "function", function: { name: other } },
      parallel_tool_calls: false
    })
    assert.strictEqual(forced.choices[0]!.finish_reason, "tool_calls")
    const call = forced.choices[0]!.message.tool_calls!
    assert.lengthOf(call, 1)
    assert.strictEqual((call[0] as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function.name, other)
    const args = JSON.parse((call[0] as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function.arguments)
    assert.deepStrictEqual(Object.keys(args), ["a", "b"])
    assert.isTrue(Object.values(args).every((v) => typeof v === "number"))
    // too short for any whole call: a length stop, the unfinished call as content
    const short = await client.chat.completions.create({
      ...base,
      max_tokens: 4,
      tool_choice: { type: "function", function: { name: other } }
    })
    assert.strictEqual(short.choices[0]!.finish_reason, "length")
    assert.isUndefined(short.choices[0]!.message.tool_calls)
    // a name not in `tools`, and tool_choice without tools: vLLM's 400s
    const unknown = await apiError(() =>
      client.chat.completions.create({ ...base, tool_choice: { type: "function", function: { name: "divide" } } })
    )
    assert.strictEqual(unknown.status, 400)
    assert.strictEqual((unknown.error as { message: string }).message, "Tool 'divide' has not been passed in `tools`.")
    const noTools = await apiError(() =>
      client.chat.completions.create({ model: servedName, messages: question, tool_choice: "required" })
    )
    assert.strictEqual(noTools.status, 400)
  })

  it("top_logprobs: the k most likely tokens at each position, recomputed under the checkpoint", async () => {
    const k = 3
    const chat = await client.chat.completions.create({
      model: servedName,
      messages: question,
      temperature: 0,
      max_tokens: 6,
      logprobs: true,
      top_logprobs: k
    })
    const completion = await client.completions.create({
      model: servedName,
      prompt: [...(chat as unknown as { prompt_token_ids: Array<number> }).prompt_token_ids],
      temperature: 0,
      max_tokens: 6,
      logprobs: k
    })
    const promptIds = (chat as unknown as { prompt_token_ids: Array<number> }).prompt_token_ids
    const tokens = (chat.choices[0] as unknown as { token_ids: Array<number> }).token_ids
    const { model } = await Checkpoint.load(path.join(runDir, "checkpoints", "step-375"))
    const expected = await LogProbs.topK(model, [...promptIds, ...tokens], promptIds.length, k, 1)
    Transformer.dispose(model)
    const content = chat.choices[0]!.logprobs!.content!
    assert.strictEqual(content.length, tokens.length)
    content.forEach((entry, t) => {
      assert.strictEqual(entry.top_logprobs.length, k)
      entry.top_logprobs.forEach((alt, j) => assert.closeTo(alt.logprob, expected[t]![j]!.logprob, 1e-5))
      // greedy: the sampled token is the most likely one
      assert.closeTo(entry.logprob, entry.top_logprobs[0]!.logprob, 1e-5)
    })
    const legacy = completion.choices[0]!.logprobs!
    assert.deepStrictEqual(
      legacy.tokens,
      content.map((e) => e.token)
    )
    legacy.top_logprobs!.forEach((top, t) => {
      const values = Object.values(top).sort((a, b) => b - a)
      assert.isAtLeast(values.length, Math.min(k, new Set(expected[t]!.map((a) => a.id)).size) - 1)
      assert.closeTo(values[0]!, expected[t]![0]!.logprob, 1e-5)
    })
  })

  it("answers a prompt past the context with vLLM's 400, and unknown models, routes and methods with error bodies", async () => {
    const overflow = await apiError(() =>
      client.completions.create({ model: servedName, prompt: Array.from({ length: 1100 }, () => 65), max_tokens: 4 })
    )
    assert.strictEqual(overflow.status, 400)
    assert.match(
      (overflow.error as { message: string }).message,
      /^This model's maximum context length is 1024 tokens\. However, you requested 1104 tokens/
    )
    const chatOverflow = await apiError(() =>
      client.chat.completions.create({ model: servedName, messages: [{ role: "user", content: "x".repeat(1100) }] })
    )
    assert.strictEqual(chatOverflow.status, 400)
    assert.match((chatOverflow.error as { message: string }).message, /maximum context length is 1024 tokens/)

    const unknownModel = await apiError(() =>
      client.chat.completions.create({ model: "gpt-4o", messages: question, max_tokens: 2 })
    )
    assert.strictEqual(unknownModel.status, 404)
    assert.strictEqual(unknownModel.param, "model")

    const route = await raw("GET", "/v1/nothing")
    assert.strictEqual(route.status, 404)
    assert.deepStrictEqual(Object.keys(route.body.error).sort(), ["code", "message", "param", "type"])
    const method = await raw("GET", "/v1/chat/completions")
    assert.strictEqual(method.status, 405)
    assert.strictEqual(method.body.error["message"], "Invalid method for URL (GET /v1/chat/completions)")
    const viaClient = await apiError(() => client.get("/nothing"))
    assert.strictEqual(viaClient.status, 404)
  })

  it("the CLI: serve --model RUN_DIR --served-model-name; a busy port is one line naming it, no stack", async () => {
    /** `serve` as a child: its listening URL (then killed), or its exit code and stderr. */
    const cli = (args: ReadonlyArray<string>) =>
      new Promise<{ url?: string; code?: number | null; stderr: string }>((resolve) => {
        const child = spawn(process.execPath, ["src/main.ts", "serve", "--backend", "cpu", ...args], {
          cwd: path.resolve(import.meta.dirname, "../.."),
          stdio: ["ignore", "pipe", "pipe"]
        })
        let out = ""
        let stderr = ""
        child.stdout.on("data", (d: Buffer) => {
          out += d.toString()
          const line = out.split("\n").find((l) => l.startsWith('{"event":"listening"'))
          if (line !== undefined) {
            child.kill("SIGTERM")
            resolve({ url: (JSON.parse(line) as { url: string }).url, stderr })
          }
        })
        child.stderr.on("data", (d: Buffer) => {
          stderr += d.toString()
        })
        child.on("exit", (code) => resolve({ code, stderr }))
      })
    const started = await new Promise<{ url?: string; models?: Array<string> }>((resolve) => {
      const child = spawn(
        process.execPath,
        [
          "src/main.ts",
          "serve",
          "--backend",
          "cpu",
          "--model",
          runDir,
          "--served-model-name",
          "org/policy",
          "--port",
          "0"
        ],
        { cwd: path.resolve(import.meta.dirname, "../.."), stdio: ["ignore", "pipe", "pipe"] }
      )
      let out = ""
      child.stdout.on("data", async (d: Buffer) => {
        out += d.toString()
        const line = out.split("\n").find((l) => l.startsWith('{"event":"listening"'))
        if (line === undefined) return
        out = ""
        const at = (JSON.parse(line) as { url: string }).url
        const viaClient = new OpenAI({ baseURL: `${at}/v1`, apiKey: "unused", maxRetries: 0 })
        const models = (await viaClient.models.list()).data.map((m) => m.id)
        const card = await viaClient.models.retrieve("org/policy")
        child.kill("SIGTERM")
        resolve({ url: at, models: [...models, card.id] })
      })
      child.on("exit", () => resolve({}))
    })
    assert.deepStrictEqual(started.models, ["org/policy", "org/policy"])
    const port = new URL(url).port
    const busy = await cli(["--model", runDir, "--port", port])
    assert.isUndefined(busy.url)
    assert.notStrictEqual(busy.code, 0)
    assert.include(busy.stderr, `port ${port} on 127.0.0.1 is in use`)
    assert.notMatch(busy.stderr, /^\s+at /m) // no stack trace
  }, 60_000)

  it("a busy port is a named error", async () => {
    const port = Number(new URL(url).port)
    const exit = await Effect.runPromiseExit(Effect.scoped(serve({ port })))
    assert.isTrue(Exit.isFailure(exit))
    const failure = JSON.stringify(exit)
    assert.include(failure, `port ${port} on 127.0.0.1 is in use`)
  })
})
