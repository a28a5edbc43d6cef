/**
 * Rollout throughput over 1, 2 and 3 `serve` replicas on this machine: trajectories per minute through one
 * RemoteEngine (`urls`, trajectory-sticky routing, new trajectories to the least loaded replica). Each replica is
 * `node src/main.ts serve --model data/quickstart/policy` (wasm backend, stock kernels: one thread each, `--max-batch`
 * 8). A trajectory is `--turns` turns (default 3) of `--tokens` new tokens each (default 32, `ignore_eos`), each turn's
 * prompt the previous context + its answer + a fixed 8-token "observation", as an agent loop's would be; `--trajectories`
 * (default 48) run `--concurrency` (default 12) at a time, after one warm-up trajectory per replica. Temperature 1,
 * seeded per trajectory and turn, so every replica count does the same work.
 * With N replicas on C cores, N > C cannot help: the result records the machine's cores and load.
 *
 * Run: npm run bench -- replicas [--trajectories N] [--concurrency N] [--turns N] [--tokens N] [--out FILE]
 * Last stdout line: the JSON result, also written to bench/out/replicas.json (`--out FILE`: bench/results/FILE).
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as os from "node:os"
import { Effect } from "effect"
import { FetchHttpClient } from "effect/http"
import { type GenerateRequest, InferenceEngine } from "../src/inference/InferenceEngine.ts"
import * as RemoteEngine from "../src/inference/RemoteEngine.ts"
import * as Sampling from "../src/model/Sampling.ts"
import { writeResult } from "./args.ts"
import * as Harness from "./harness.ts"

const trajectories = Number(Harness.arg("trajectories", "48"))
const concurrency = Number(Harness.arg("concurrency", "12"))
const turns = Number(Harness.arg("turns", "3"))
const tokens = Number(Harness.arg("tokens", "32"))
const model = "data/quickstart/policy"

/** One `serve` on a free port; resolves with its URL once it listens. */
const startServe = () =>
  new Promise<{ readonly url: string; readonly child: ChildProcess }>((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ["src/main.ts", "serve", "--model", model, "--port", "0", "--backend", "wasm", "--max-batch", "8"],
      { stdio: ["ignore", "pipe", "ignore"], env: { ...process.env, NO_COLOR: "1" } }
    )
    let out = ""
    child.stdout!.on("data", (chunk: Buffer) => {
      out += chunk.toString()
      const line = out.split("\n").find((l) => l.includes('"event":"listening"'))
      if (line !== undefined) resolve({ url: (JSON.parse(line) as { url: string }).url, child })
    })
    child.on("exit", (code) => reject(new Error(`serve exited ${code}`)))
  })

const observation = [10, 62, 32, 111, 107, 10, 60, 32] // "\n> ok\n< " as bytes

/** One trajectory: `turns` calls, each on the context so far. */
const trajectory = (index: number) =>
  Effect.gen(function* () {
    const engine = yield* InferenceEngine
    let context = [...Buffer.from(`Task ${index}: add ${index} and ${index * 7}.\n`)]
    for (let turn = 0; turn < turns; turn++) {
      const request: GenerateRequest = {
        promptIds: context,
        sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: tokens, seed: index * 100 + turn },
        trajectoryId: `t${index}`
      }
      const [result] = yield* engine.generate([request])
      context = [...context, ...result!.tokens, ...observation]
    }
  })

const measure = (urls: ReadonlyArray<string>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const engine = yield* RemoteEngine.make({ urls })
      const run = (from: number, count: number, parallel: number) =>
        Effect.forEach(
          Array.from({ length: count }, (_, i) => from + i),
          (i) => trajectory(i),
          { concurrency: parallel, discard: true }
        ).pipe(Effect.provideService(InferenceEngine, engine))
      yield* run(100_000, urls.length, urls.length) // warm-up: one per replica
      const start = performance.now()
      yield* run(0, trajectories, concurrency)
      const seconds = (performance.now() - start) / 1000
      return { replicas: urls.length, seconds, trajectoriesPerMinute: (trajectories / seconds) * 60 }
    }).pipe(Effect.provide(FetchHttpClient.layer))
  )

export const run = async (): Promise<void> => {
  const servers: Array<{ readonly url: string; readonly child: ChildProcess }> = []
  const rows: Array<{ replicas: number; seconds: number; trajectoriesPerMinute: number }> = []
  try {
    for (let n = 1; n <= 3; n++) {
      servers.push(await startServe())
      const row = await Effect.runPromise(measure(servers.map((s) => s.url)))
      console.error(
        `${n} replica(s): ${row.trajectoriesPerMinute.toFixed(1)} trajectories/min (${row.seconds.toFixed(1)} s)`
      )
      rows.push(row)
    }
  } finally {
    for (const s of servers) s.child.kill("SIGTERM")
  }
  const result = {
    bench: "replicas",
    date: new Date().toISOString(),
    machine: { cpus: os.cpus().length, cpuModel: os.cpus()[0]?.model, loadAverage1m: os.loadavg()[0] },
    model,
    serve: { backend: "wasm", kernels: "stock", threadsPerReplica: 1, maxBatch: 8 },
    workload: { trajectories, concurrency, turns, tokensPerTurn: tokens, temperature: 1 },
    rows
  }
  writeResult("replicas.json", result)
  console.log(JSON.stringify(result))
}
