/**
 * The agent loop's chat path (`generator.engine.chat`) against our real `serve` (in process, 127.0.0.1 port 0) over
 * the quickstart policy, with the bundled toolbox MCP server as the env: the server renders each turn's `messages` +
 * `tools`, samples, reads the tool calls (hermes), and the env runs them; the trajectory keeps the server's prompt ids
 * and the sampled ids and log-probs, which are recomputed here under the same checkpoint.
 */
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import type { Trajectory } from "../../src/domain/Trajectory.ts"
import * as EnvRegistry from "../../src/env/EnvRegistry.ts"
import * as McpToolEnv from "../../src/env/McpToolEnv.ts"
import * as ToolIo from "../../src/env/ToolIo.ts"
import * as AgentLoop from "../../src/generator/AgentLoop.ts"
import * as RemoteEngine from "../../src/inference/RemoteEngine.ts"
import * as Serve from "../../src/layers/Serve.ts"
import * as McpClient from "../../src/mcp/McpClient.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ChatTemplate from "../../src/tokenizer/ChatTemplate.ts"
import * as Tokenizer from "../../src/tokenizer/Tokenizer.ts"
import * as Servers from "../env/McpServers.ts"
import * as Retrace from "../fixtures/Retrace.ts"

const policyDir = path.resolve(import.meta.dirname, "../../data/quickstart/policy")
const valFile = path.resolve(import.meta.dirname, "../../data/toolbox/val.jsonl")

/**
 * ChatML that renders no tool list: the quickstart policy was fine-tuned on the toolbox's tools with none shown
 * (`tool_prompt: none`), so the tools go to the server only for its tool parser. Tool calls print back as
 * `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`, the form the policy writes.
 */
const noToolList = ChatTemplate.chatMl.replace(
  /^\{%- if tools %\}[\s\S]*?\{%- elif messages\[0\]\.role == 'system' %\}/,
  "{%- if messages[0].role == 'system' %}"
)
/** The same, but an earlier turn's tool call prints without the newlines the policy wrote: it rewrites the history. */
const rewriting = noToolList.replace('\'<tool_call>\\n{"name": "\'', '\'<tool_call>{"name": "\'')

/** The first `n` arithmetic rows of the toolbox's held-out tasks (add / subtract / multiply calls). */
const rows = (n: number) =>
  Effect.promise(async () =>
    (await fs.readFile(valFile, "utf8"))
      .split("\n")
      .filter((line) => line.includes('"family":"arith_chain"'))
      .slice(0, n)
      .map((line) => JSON.parse(line) as PromptRow)
  )

const options: AgentLoop.Options = {
  maxTurns: 4,
  maxGenerateLength: 96,
  maxInputLength: 640,
  temperature: 1, // behaviour log-probs are then the model's log-softmax, recomputed below
  topP: 1,
  topK: 0,
  stopStrings: [],
  seed: 3,
  chat: true
}

/** The quickstart policy with `template` as its chat template, served for the scope; the tokenizer beside it. */
const served = (template: string) =>
  Effect.gen(function* () {
    yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
    const dir = yield* Effect.acquireRelease(
      Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "chat-loop-"))),
      (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
    )
    yield* Effect.promise(async () => {
      for (const file of ["config.json", "model.safetensors", "tokenizer.json"]) {
        await fs.copyFile(path.join(policyDir, file), path.join(dir, file))
      }
      const config = JSON.parse(await fs.readFile(path.join(policyDir, "tokenizer_config.json"), "utf8"))
      await fs.writeFile(
        path.join(dir, "tokenizer_config.json"),
        JSON.stringify({ ...config, chat_template: template })
      )
    })
    const url = yield* Serve.start({ model: dir, host: "127.0.0.1", port: 0, token: undefined, modelName: "qs" }).pipe(
      Effect.provide(NodeServices.layer),
      Effect.orDie
    )
    const tokenizer = yield* AutoTokenizer.load(dir).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
    return { url, dir, tokenizer }
  })

const services = (url: string, tokenizer: Tokenizer.TokenizerImpl) =>
  Layer.mergeAll(
    RemoteEngine.layer({ url }),
    Tokenizer.layerImpl(tokenizer),
    McpToolEnv.layer({ toolCallFormat: "hermes", maxTurns: 4, toolPrompt: "template" }).pipe(
      Layer.provideMerge(
        Layer.mergeAll(
          EnvRegistry.layer(),
          ToolIo.layerLive.pipe(Layer.provideMerge(McpClient.layer({ servers: [Servers.toolbox()] })))
        )
      )
    )
  )

/** Largest |behaviour − recomputed| log-prob over every trained token of `ts`, recomputed under `dir`'s weights. */
const maxLogprobError = (dir: string, ts: ReadonlyArray<Trajectory>) =>
  Effect.promise(async () => {
    const { model } = await Checkpoint.load(dir)
    try {
      return await Retrace.worstLogprobError(model, ts)
    } finally {
      Transformer.dispose(model)
    }
  })

const executedCalls = (ts: ReadonlyArray<Trajectory>) =>
  ts.flatMap((t) => t.turns.flatMap((turn) => turn.toolCalls)).filter((c) => !c.isError)

describe("AgentLoop.run with generator.engine.chat against serve", () => {
  it.live(
    "runs the server's tool calls and keeps one exact row per trajectory while the template extends the history",
    () =>
      Effect.gen(function* () {
        const { url, dir, tokenizer } = yield* served(noToolList)
        const tasks = yield* rows(4)
        const ts = yield* Effect.forEach(tasks, (row) => AgentLoop.run(row, 0, options), { concurrency: 4 }).pipe(
          Effect.provide(services(url, tokenizer))
        )
        for (const t of ts) assert.notStrictEqual(t.stopReason, "error", t.error)
        // tool calls were read by the server's parser and run on the toolbox server (`add(5, 4)` → "9")
        const calls = executedCalls(ts)
        assert.isAbove(calls.length, 0)
        for (const c of calls) assert.include(["add", "subtract", "multiply", "divide"], c.tool)
        // multi-turn trajectories held in one row: the server's turn-k prompt extended the row, the ids past it
        // (tool results as its template rendered them) are appended untrained and counted on the turn before
        const oneRow = ts.filter((t) => t.steps === undefined && t.turns.length >= 2)
        assert.isAbove(oneRow.length, 0)
        for (const t of oneRow) {
          assert.strictEqual(t.lossMask.length, t.responseIds.length)
          assert.strictEqual(t.rolloutLogprobs.length, t.responseIds.length)
          const first = t.turns[0]!
          assert.isAbove(first.observationTokens, 0)
          const observation = tokenizer.decode(t.responseIds.slice(first.end, first.end + first.observationTokens))
          assert.include(observation, "<tool_response>")
          assert.isTrue(t.lossMask.slice(first.end, first.end + first.observationTokens).every((m) => m === 0))
        }
        // every trained token's behaviour log-prob is the checkpoint's, recomputed here from the recorded ids
        const { worst, tokens } = yield* maxLogprobError(dir, ts)
        assert.isAbove(tokens, 20)
        assert.isBelow(worst, 1e-5)
      }).pipe(Effect.scoped),
    180_000
  )

  it.live(
    "keeps a trajectory step-wise, each turn's row on the server's own prompt ids, when the template rewrites an earlier turn",
    () =>
      Effect.gen(function* () {
        const { url, dir, tokenizer } = yield* served(rewriting)
        const tasks = yield* rows(4)
        const ts = yield* Effect.forEach(tasks, (row) => AgentLoop.run(row, 0, options), { concurrency: 4 }).pipe(
          Effect.provide(services(url, tokenizer))
        )
        for (const t of ts) assert.notStrictEqual(t.stopReason, "error", t.error)
        assert.isAbove(executedCalls(ts).length, 0)
        // a second turn follows a tool call, which the template printed back in its own form: the row broke
        const multi = ts.filter((t) => t.turns.length >= 2 && t.turns[0]!.toolCalls.length > 0)
        assert.isAbove(multi.length, 0)
        for (const t of multi) {
          const steps = t.steps!
          assert.strictEqual(steps.length, t.turns.length)
          // the trajectory's ids are the generated tokens alone, each turn a span of them
          assert.deepStrictEqual(
            t.responseIds,
            steps.flatMap((s) => s.responseIds)
          )
          assert.isTrue(t.lossMask.every((m) => m === 1))
          assert.deepStrictEqual(t.promptIds, steps[0]!.promptIds)
          for (const [i, turn] of t.turns.entries()) {
            assert.deepStrictEqual(t.responseIds.slice(turn.start, turn.end), steps[i]!.responseIds)
          }
          // turn 2's prompt is the rewritten history, not what turn 1 sampled
          const second = tokenizer.decode(steps[1]!.promptIds)
          assert.include(second, '<tool_call>{"name": "')
          assert.include(tokenizer.decode(steps[0]!.responseIds), '<tool_call>\n{"name": "')
        }
        const { worst, tokens } = yield* maxLogprobError(dir, ts)
        assert.isAbove(tokens, 20)
        assert.isBelow(worst, 1e-5)
      }).pipe(Effect.scoped),
    180_000
  )
})

describe("generator.engine.chat in a run config", () => {
  const base = { model: { init: { hidden_size: 32 } }, tokenizer: { kind: "byte" } }

  it.effect("is refused for an engine other than remote, naming the key", () =>
    Effect.gen(function* () {
      const error = yield* RunConfigLoader.fromObject(base, ["generator.engine.chat=true"]).pipe(Effect.flip)
      assert.strictEqual(error._tag, "ConfigError")
      assert.strictEqual(error.path, "generator.engine.chat")
      assert.include(error.message, "needs engine.kind remote")
      const worker = yield* RunConfigLoader.fromObject(base, [
        "generator.engine.chat=true",
        "generator.engine.kind=worker"
      ]).pipe(Effect.flip)
      assert.strictEqual(worker.path, "generator.engine.chat")
    })
  )

  it.effect("is accepted with a remote engine and is off by default", () =>
    Effect.gen(function* () {
      const on = yield* RunConfigLoader.fromObject(base, [
        "generator.engine.chat=true",
        "generator.engine.kind=remote",
        "generator.engine.url=http://127.0.0.1:8000"
      ])
      assert.isTrue(on.generator.engine.chat)
      assert.isFalse((yield* RunConfigLoader.fromObject(base)).generator.engine.chat)
    })
  )
})
