/**
 * `generator.agent`: an agent program written for the OpenAI chat API (test/fixtures/agents/chat-agent.mjs, the
 * official `openai` client and nothing of effect-rl) rolls out the toolbox's arithmetic tasks through the agent
 * gateway over the quickstart policy in process. Each trajectory holds the ids the gateway rendered and sampled, and
 * its behaviour log-probs are recomputed here under the same checkpoint; rewards come from the rows' reward_spec over
 * what the gateway saw. Programs that crash, hang, never call the model, call past max_turns or rewrite their history
 * end as the module header of src/generator/AgentProgram.ts says, and leave no process behind.
 */
import * as fs from "node:fs/promises"
import { createServer } from "node:http"
import * as os from "node:os"
import * as path from "node:path"
import { NodeHttpServer, NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import type { Trajectory } from "../../src/domain/Trajectory.ts"
import * as EnvRegistry from "../../src/env/EnvRegistry.ts"
import * as AgentGateway from "../../src/generator/AgentGateway.ts"
import * as Generator from "../../src/generator/Generator.ts"
import { InferenceEngine } from "../../src/inference/InferenceEngine.ts"
import * as LocalEngine from "../../src/inference/LocalEngine.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as ToolPrompts from "../../src/serve/ToolPrompts.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as Tokenizer from "../../src/tokenizer/Tokenizer.ts"
import * as Retrace from "../fixtures/Retrace.ts"

const policyDir = path.resolve(import.meta.dirname, "../../data/quickstart/policy")
const valFile = path.resolve(import.meta.dirname, "../../data/toolbox/val.jsonl")
const agentFile = path.resolve(import.meta.dirname, "../fixtures/agents/chat-agent.mjs")

const rows = (n: number) =>
  Effect.promise(async () =>
    (await fs.readFile(valFile, "utf8"))
      .split("\n")
      .filter((line) => line.includes('"family":"arith_chain"'))
      .slice(0, n)
      .map((line) => JSON.parse(line) as PromptRow)
  )

const options = (agentEnv: Record<string, string> = {}, timeoutSeconds = 60): Generator.GeneratorOptions => ({
  maxTurns: 4,
  maxGenerateLength: 96,
  maxInputLength: 640,
  temperature: 1, // behaviour log-probs are then the model's log-softmax, recomputed below
  topP: 1,
  topK: 0,
  stopStrings: [],
  seed: 3,
  samplesPerPrompt: 4,
  maxConcurrentGroups: 2,
  unordered: false,
  agent: { command: ["node", agentFile], timeoutSeconds, env: agentEnv, toolCallFormat: "hermes" }
})

/** The quickstart policy in a LocalEngine behind the agent gateway (tool_prompt none, hermes: as it was trained). */
const services = Effect.gen(function* () {
  yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
  const { model } = yield* Effect.acquireRelease(
    Effect.promise(() => Checkpoint.load(policyDir)),
    (loaded) => Effect.sync(() => Transformer.dispose(loaded.model))
  )
  const tokenizer = yield* AutoTokenizer.load(policyDir).pipe(Effect.provide(NodeServices.layer), Effect.orDie)
  const engine = yield* LocalEngine.make({ model, decode: (ids) => tokenizer.decode(ids), maxBatch: 16 })
  const base = Layer.mergeAll(
    Layer.succeed(InferenceEngine, engine),
    Tokenizer.layerImpl(tokenizer),
    EnvRegistry.layer()
  )
  const gateway = AgentGateway.layer(
    ToolPrompts.fromEnvironment("none", "hermes"),
    NodeHttpServer.layer(createServer, { port: 0, host: "127.0.0.1" })
  )
  return { base, gateway, model }
})

const groupsOf = (prompts: ReadonlyArray<PromptRow>, o: Generator.GeneratorOptions) =>
  Effect.gen(function* () {
    const { base, gateway, model } = yield* services
    // built for the test's scope: the gateway listens as long as the trajectories run
    const context = yield* Layer.build(Layer.provideMerge(gateway, base))
    const generator = yield* Generator.make(o).pipe(Effect.provideContext(context))
    const groups = yield* Effect.forEach(prompts, (row, cursor) => generator.group({ row, cursor }))
    return { groups, model }
  })

const retrace = (model: Transformer.Transformer, ts: ReadonlyArray<Trajectory>) =>
  Effect.promise(() => Retrace.worstLogprobError(model, ts))

/** Whether process `pid` runs (a zombie, killed and waiting to be reaped, does not). */
const alive = async (pid: number) => {
  try {
    const stat = await fs.readFile(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z"
  } catch {
    return false
  }
}

describe("generator.agent: an unmodified OpenAI-client agent through the gateway", () => {
  it.live(
    "records every call token-exact, one row while each prompt extends the last, with rewards from reward_spec",
    () =>
      Effect.gen(function* () {
        const { groups, model } = yield* groupsOf(yield* rows(2), options())
        const ts = groups.flatMap((g) => g.trajectories)
        assert.strictEqual(ts.length, 8)
        for (const t of ts) assert.strictEqual(t.stopReason, "stop", t.error)
        // the policy calls the tools and answers: several calls per trajectory, one row each
        const multi = ts.filter((t) => t.turns.length >= 2)
        assert.isAbove(multi.length, 3)
        for (const t of multi) {
          assert.isUndefined(t.steps, "the chat template prints the calls back as sampled: the prompt extends")
          assert.isAbove(t.turns[0]!.observationTokens, 0)
          assert.isAbove(t.turns[0]!.toolCalls.length, 0)
          assert.isFalse(t.turns[0]!.toolCalls[0]!.isError)
          assert.strictEqual(t.envMetrics["agent/model_calls"], t.turns.length)
        }
        const { worst, tokens } = yield* retrace(model, ts)
        assert.isAbove(tokens, 200)
        assert.isAtMost(worst, 1e-4, `worst |Δ log p| ${worst} over ${tokens} tokens`)
        // the reward_spec scored what the gateway saw: the calls' partial credit (tool_sequence) and the answers
        for (const t of ts) assert.isTrue(t.reward >= 0 && t.reward <= 1, String(t.reward))
        assert.isDefined(ts.find((t) => (t.envMetrics["reward/tool_sequence_match"] ?? 0) > 0))
      }).pipe(Effect.scoped),
    180_000
  )

  it.live(
    "a program that rewrites its history trains step-wise, each call its own row",
    () =>
      Effect.gen(function* () {
        const { groups, model } = yield* groupsOf(yield* rows(1), options({ AGENT_MODE: "rewrite" }))
        const ts = groups.flatMap((g) => g.trajectories).filter((t) => t.turns.length >= 2)
        assert.isAbove(ts.length, 0)
        for (const t of ts) {
          assert.strictEqual(t.steps?.length, t.turns.length)
          assert.deepStrictEqual(
            t.lossMask,
            t.responseIds.map(() => 1)
          )
        }
        const { worst } = yield* retrace(model, ts)
        assert.isAtMost(worst, 1e-4)
      }).pipe(Effect.scoped),
    120_000
  )

  it.live(
    "crashes, hangs, silence and calls past max_turns end with their reason; nothing is left running",
    () =>
      Effect.gen(function* () {
        const dir = yield* Effect.acquireRelease(
          Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "agent-program-"))),
          (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
        )
        const [row] = yield* rows(1)
        const one = (env: Record<string, string>, timeout = 60) =>
          Effect.map(
            groupsOf([row!], { ...options(env, timeout), samplesPerPrompt: 1 }),
            ({ groups }) => groups[0]!.trajectories[0]!
          )
        const crashed = yield* one({ AGENT_MODE: "crash" })
        assert.strictEqual(crashed.stopReason, "error")
        assert.match(crashed.error ?? "", /exited with code 3: agent: something went wrong/)
        assert.strictEqual(crashed.turns.length, 1) // the call it made is still recorded
        assert.strictEqual(crashed.reward, 0)

        const pidFile = path.join(dir, "pid")
        const hung = yield* one({ AGENT_MODE: "hang", AGENT_PID_FILE: pidFile }, 2)
        assert.strictEqual(hung.stopReason, "error")
        assert.match(hung.error ?? "", /timeout_seconds \(2\)/)
        const grandchild = Number(yield* Effect.promise(() => fs.readFile(pidFile, "utf8")))
        yield* Effect.sleep("200 millis")
        assert.isFalse(yield* Effect.promise(() => alive(grandchild)), "the program's process group is killed")

        // the answer the program prints is the one scored, and the rule reward is the trajectory's
        const oracle = yield* one({ AGENT_MODE: "oracle" })
        assert.strictEqual(oracle.stopReason, "stop")
        assert.strictEqual(oracle.envMetrics["reward/answer_correct"], 1)
        const { "reward/outcome": outcome, "reward/tool_sequence_match": match } = oracle.envMetrics
        assert.closeTo(oracle.reward, 0.8 * outcome! + 0.2 * match!, 1e-9)

        const silent = yield* one({ AGENT_MODE: "silent" })
        assert.strictEqual(silent.stopReason, "error")
        assert.match(silent.error ?? "", /never called the model/)

        const looping = yield* one({ AGENT_MODE: "loop" })
        assert.strictEqual(looping.stopReason, "max_turns")
        assert.strictEqual(looping.turns.length, 4)
      }).pipe(Effect.scoped),
    120_000
  )
})
