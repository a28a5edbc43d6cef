/**
 * Tool-call round trip through McpToolEnv (parse model text → McpClient → toolbox → tool message) vs the bare MCP
 * SDK client calling the same toolbox server (both over stdio, each with its own server process).
 *
 *   node bench/mcp-latency.ts [--calls 4000] [--concurrent-calls 32768] [--concurrency 64] [--microtask-scheduler]
 *
 * A third column, `mcp_client`, is McpClient.call alone (the seam, without parsing text or keeping records).
 * Sequential: one caller, one call at a time. Concurrent: 64 callers (64 envs on one shared server connection vs
 * 64 concurrent `callTool`s on one SDK client). Prints one JSON line and writes bench/out/mcp-latency.json
 * (`--out FILE`: bench/results/FILE).
 * The defaults (4× those before 2026-11-25) measure the steady state an RL run's millions of calls see: with 1,024
 * concurrent calls per column and round, a round lasted about 50 ms and the p50 ratio of one run swung 0.9-1.5.
 * Goal: McpToolEnv p50 ≤ 1.2 × SDK p50.
 *
 * This bench imports the SDK client directly: it is the baseline being measured against.
 */

import { cpus, loadavg } from "node:os"
import { join, resolve } from "node:path"
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js"
import { Effect, Layer, Scheduler, Schema } from "effect"
import { McpServerConfig } from "../src/config/EnvironmentConfig.ts"
import type { PromptRow } from "../src/domain/PromptRow.ts"
import type { Env } from "../src/env/Env.ts"
import * as EnvRegistry from "../src/env/EnvRegistry.ts"
import * as McpToolEnv from "../src/env/McpToolEnv.ts"
import * as ToolIo from "../src/env/ToolIo.ts"
import * as McpClient from "../src/mcp/McpClient.ts"
import { writeResult } from "./args.ts"

const root = resolve(import.meta.dirname, "..")
const script = join(root, "src/toolbox/server.ts")
const argValue = (flag: string, fallback: number) => {
  const i = process.argv.indexOf(flag)
  return i >= 0 ? Number(process.argv[i + 1]) : fallback
}
const calls = argValue("--calls", 4000) // sequential calls per client
const concurrentCalls = argValue("--concurrent-calls", 32768) // concurrent calls per client (64 callers × 64 × 8 rounds)
const concurrency = argValue("--concurrency", 64)
const warmup = 200

const percentile = (xs: ReadonlyArray<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!
}
const summary = (ms: ReadonlyArray<number>, wallMs: number, cpuUs: number) => ({
  client_cpu_us_per_call: Math.round(cpuUs / ms.length),
  p50_ms: Number(percentile(ms, 50).toFixed(4)),
  p99_ms: Number(percentile(ms, 99).toFixed(4)),
  mean_ms: Number((ms.reduce((a, b) => a + b, 0) / ms.length).toFixed(4)),
  calls_per_s: Math.round((ms.length / wallMs) * 1000)
})
const args = (i: number) => ({ a: i, b: 7 })
const text = (i: number) => `<tool_call>\n{"name": "multiply", "arguments": {"a": ${i}, "b": 7}}\n</tool_call>`

// The clients are set up first, then measured in alternating blocks (SDK, env, client, SDK, …), so that machine noise
// (this is a shared 2-core box) and JIT warm-up fall on all alike.
const rounds = 8
/** CPU time of this (client) process, µs: robust to the machine's other load, unlike wall time. */
const cpu = () => {
  const u = process.cpuUsage()
  return u.user + u.system
}

const sdkClient = async () => {
  const client = new Client({ name: "bench", version: "0" }, { capabilities: {} })
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [script] }))
  const one = async (i: number) => {
    const t0 = performance.now()
    const r = await client.callTool({ name: "multiply", arguments: args(i) })
    const ms = performance.now() - t0
    const content = r.content as Array<{ text: string }>
    if (content[0]?.text !== String(i * 7)) throw new Error("wrong sdk result")
    return ms
  }
  return { client, one }
}

const row: PromptRow = { data_source: "bench", env_class: "mcp_tool", prompt: [{ role: "user", content: "bench" }] }

// The timing harness is made once (fnUntraced), as the SDK side's `one` is: an `Effect.gen(function* …)` written per
// call would build a new generator function every call (microseconds in V8) and bill the harness to the env.
const stepTimed = Effect.fnUntraced(function* (env: Env, i: number) {
  const t0 = performance.now()
  const out = yield* env.step(text(i))
  const ms = performance.now() - t0
  if (out.observations[0]?.content !== String(i * 7)) return yield* Effect.die(new Error("wrong env result"))
  return ms
})

/** McpClient.call alone: the seam without the env (no text parsing, no records). */
const callTimed = Effect.fnUntraced(function* (client: McpClient.McpClient["Service"], i: number) {
  const t0 = performance.now()
  const out = yield* client.call("multiply", args(i))
  const ms = performance.now() - t0
  if (out.text !== String(i * 7)) return yield* Effect.die(new Error("wrong client result"))
  return ms
})

const measure = Effect.gen(function* () {
  const registry = yield* EnvRegistry.EnvRegistry
  const client = yield* McpClient.McpClient
  const makeEnv = Effect.gen(function* () {
    const env = yield* registry.make("mcp_tool", row)
    yield* env.init(row.prompt)
    return env
  })
  const sdk = yield* Effect.promise(() => sdkClient())
  const env = yield* makeEnv
  const envs = yield* Effect.forEach(Array.from({ length: concurrency }), () => makeEnv)
  const perWorker = Math.max(1, Math.ceil(concurrentCalls / rounds / concurrency))
  const samples = {
    sdk: { seq: [] as Array<number>, conc: [] as Array<number>, seqWall: 0, concWall: 0, seqCpu: 0, concCpu: 0 },
    env: { seq: [] as Array<number>, conc: [] as Array<number>, seqWall: 0, concWall: 0, seqCpu: 0, concCpu: 0 },
    client: { seq: [] as Array<number>, conc: [] as Array<number>, seqWall: 0, concWall: 0, seqCpu: 0, concCpu: 0 }
  }
  // warm-up (not measured): the JIT compiles each path's sequential and concurrent code before the clock runs
  for (let i = 0; i < warmup; i++) {
    yield* Effect.promise(() => sdk.one(i))
    yield* stepTimed(env, i)
    yield* callTimed(client, i)
  }
  for (let r = 0; r < 4; r++) {
    yield* Effect.promise(() =>
      Promise.all(
        Array.from({ length: concurrency }, async (_, w) => {
          for (let i = 0; i < perWorker; i++) await sdk.one(w * 1000 + i)
        })
      )
    )
    yield* Effect.forEach(
      envs,
      (e, w) =>
        Effect.gen(function* () {
          for (let i = 0; i < perWorker; i++) {
            yield* stepTimed(e, w * 1000 + i)
            yield* callTimed(client, w * 1000 + i)
          }
        }),
      { concurrency: "unbounded" }
    )
  }
  const block = Math.ceil(calls / rounds)
  type Column = keyof typeof samples
  /** One measured block: its samples, wall time and this process's CPU time go to `column`. */
  const timed = (column: Column, mode: "seq" | "conc", run: Effect.Effect<unknown, unknown>) =>
    Effect.gen(function* () {
      const t0 = performance.now()
      const c0 = cpu()
      yield* run
      const x = samples[column]
      if (mode === "seq") {
        x.seqWall += performance.now() - t0
        x.seqCpu += cpu() - c0
      } else {
        x.concWall += performance.now() - t0
        x.concCpu += cpu() - c0
      }
    })
  const sequential = (into: Array<number>, one: (i: number) => Effect.Effect<number, unknown>) =>
    Effect.gen(function* () {
      for (let i = 0; i < block; i++) into.push(yield* one(i))
    })
  const concurrent = (into: Array<number>, one: (e: Env, i: number) => Effect.Effect<number, unknown>) =>
    Effect.forEach(
      envs,
      (e, w) =>
        Effect.gen(function* () {
          for (let i = 0; i < perWorker; i++) into.push(yield* one(e, w * 1000 + i))
        }),
      { concurrency: "unbounded", discard: true }
    )
  // Each column runs its sequential block and then its concurrent one, so a concurrent block always starts on a
  // server its own client has just used; which column goes first rotates every round, so none always runs after
  // another's burst (the first design ran env's concurrent block right after the SDK's, on a server idle since the
  // env's sequential block, and the env's p50 ratio swung 0.7-1.8 with the order alone).
  const columns: ReadonlyArray<Effect.Effect<void, unknown>> = [
    Effect.andThen(
      timed(
        "sdk",
        "seq",
        sequential(samples.sdk.seq, (i) => Effect.promise(() => sdk.one(i)))
      ),
      timed(
        "sdk",
        "conc",
        Effect.promise(() =>
          Promise.all(
            Array.from({ length: concurrency }, async (_, w) => {
              for (let i = 0; i < perWorker; i++) samples.sdk.conc.push(await sdk.one(w * 1000 + i))
            })
          )
        )
      )
    ),
    Effect.andThen(
      timed(
        "env",
        "seq",
        sequential(samples.env.seq, (i) => stepTimed(env, i))
      ),
      timed("env", "conc", concurrent(samples.env.conc, stepTimed))
    ),
    Effect.andThen(
      timed(
        "client",
        "seq",
        sequential(samples.client.seq, (i) => callTimed(client, i))
      ),
      timed(
        "client",
        "conc",
        concurrent(samples.client.conc, (_, i) => callTimed(client, i))
      )
    )
  ]
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < columns.length; k++) yield* columns[(r + k) % columns.length]!
  }
  yield* Effect.promise(() => sdk.client.close())
  const pack = (x: typeof samples.sdk) => ({
    sequential: summary(x.seq, x.seqWall, x.seqCpu),
    concurrent: summary(x.conc, x.concWall, x.concCpu)
  })
  return { sdk: pack(samples.sdk), env: pack(samples.env), client: pack(samples.client) }
}).pipe(Effect.scoped)

const server = Schema.decodeUnknownSync(McpServerConfig)({ name: "toolbox", command: "node", args: [script] })
const layer = McpToolEnv.layer({ toolCallFormat: "hermes", maxTurns: 1_000_000 }).pipe(
  Layer.provideMerge(
    Layer.mergeAll(
      EnvRegistry.layer(),
      ToolIo.layerLive.pipe(Layer.provideMerge(McpClient.layer({ servers: [server] })))
    )
  )
)

// --microtask-scheduler: resume fibers on microtasks instead of setImmediate (Effect's "sync" execution mode), to
// show how much of the gap is the runtime's hop per async resume rather than work done per call.
const microtask = process.argv.includes("--microtask-scheduler")
const { sdk, env, client } = await Effect.runPromise(
  microtask
    ? measure.pipe(
        Effect.provide(layer),
        Effect.provideService(Scheduler.Scheduler, new Scheduler.MixedScheduler("sync"))
      )
    : measure.pipe(Effect.provide(layer))
)
const ratio = (a: number, b: number) => Number((a / b).toFixed(3))
/** A column's modes with their ratios to the SDK's (p50 latency, client CPU per call). */
const versusSdk = (x: typeof env) => {
  const mode = (m: "sequential" | "concurrent") => ({
    ...x[m],
    ratio_p50_vs_sdk: ratio(x[m].p50_ms, sdk[m].p50_ms),
    ratio_client_cpu_vs_sdk: ratio(x[m].client_cpu_us_per_call, sdk[m].client_cpu_us_per_call)
  })
  return { sequential: mode("sequential"), concurrent: mode("concurrent") }
}
const result = {
  bench: "mcp-latency",
  calls,
  concurrent_calls: concurrentCalls,
  concurrency,
  cpus: cpus().length,
  node: process.version,
  sdk,
  env: versusSdk(env),
  mcp_client: versusSdk(client),
  ratio_p50_sequential: ratio(env.sequential.p50_ms, sdk.sequential.p50_ms),
  ratio_p99_sequential: ratio(env.sequential.p99_ms, sdk.sequential.p99_ms),
  ratio_p50_concurrent: ratio(env.concurrent.p50_ms, sdk.concurrent.p50_ms),
  ratio_p99_concurrent: ratio(env.concurrent.p99_ms, sdk.concurrent.p99_ms),
  ratio_mcp_client_p50_sequential: ratio(client.sequential.p50_ms, sdk.sequential.p50_ms),
  ratio_mcp_client_p50_concurrent: ratio(client.concurrent.p50_ms, sdk.concurrent.p50_ms),
  ratio_client_cpu_sequential: ratio(env.sequential.client_cpu_us_per_call, sdk.sequential.client_cpu_us_per_call),
  ratio_client_cpu_concurrent: ratio(env.concurrent.client_cpu_us_per_call, sdk.concurrent.client_cpu_us_per_call),
  scheduler: microtask ? "microtask" : "default (setImmediate)",
  load_average_1m: Number(loadavg()[0]?.toFixed(2)),
  goal: "env p50 <= 1.2 x sdk p50"
}
writeResult(`mcp-latency${microtask ? "-microtask" : ""}.json`, result)
console.log(JSON.stringify(result))
