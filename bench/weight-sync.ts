/**
 * Weight sync per training step on the perf model (bench/harness.ts: vocab 512, d 256, 4 layers, 4.3 M parameters,
 * 17 MB in F32), each way a trainer can publish a version, measured from `publish` to "the engine has it":
 * - `snapshot`: Snapshot.fromModel (reading the trainer's variables; every copying sync starts with it, not included
 *   in the rows below),
 * - `http`: WeightUpload.upload (what HttpWeightSync sends) → `serve`'s routes on loopback in this process
 *   (safetensors encode, 8 MiB chunks, decode, load into the serving LocalEngine's variables),
 * - `file`: FileWeightSync write (safetensors + fsync + renames), and `fileToEngine` until a watching LocalEngine
 *   (5 ms polling) reports the version,
 * - `worker`: EngineWeightSync (copied) → WorkerEngine (copy into the SharedArrayBuffer board, post the version,
 *   worker copies into its variables, ack).
 * Medians over `--iters` versions (default 10). wasm backend, stock kernels. Last stdout line: the JSON result, also
 * written to bench/out/weight-sync.json (`--out FILE`: bench/results/FILE).
 *
 * Run: npm run bench -- weight-sync [--iters N] [--out FILE]
 */
import * as fs from "node:fs/promises"
import { createServer } from "node:http"
import * as os from "node:os"
import * as path from "node:path"
import { NodeHttpServer } from "@effect/platform-node"
import { Clock, Context, Effect, Layer } from "effect"
import { FetchHttpClient, HttpServer } from "effect/http"
import * as TensorBackend from "../src/backend/TensorBackend.ts"
import * as PolicyVersion from "../src/domain/PolicyVersion.ts"
import * as WeightSnapshot from "../src/domain/WeightSnapshot.ts"
import * as LocalEngine from "../src/inference/LocalEngine.ts"
import * as OpenAiServer from "../src/serve/OpenAiServer.ts"
import * as WeightUpload from "../src/weights/WeightUpload.ts"
import * as WorkerEngine from "../src/inference/WorkerEngine.ts"
import * as Snapshot from "../src/model/Snapshot.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as EngineWeightSync from "../src/sync/EngineWeightSync.ts"
import * as FileWeightSync from "../src/sync/FileWeightSync.ts"
import * as ByteTokenizer from "../src/tokenizer/ByteTokenizer.ts"
import * as Harness from "./harness.ts"

const backend = { name: "wasm", threads: 0, kernels: "stock" } as const

const median = (xs: ReadonlyArray<number>): number => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

const seconds = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const start = yield* Clock.currentTimeMillis
    yield* effect
    return ((yield* Clock.currentTimeMillis) - start) / 1000
  })

const program = (iters: number) =>
  Effect.scoped(
    Effect.gen(function* () {
      yield* TensorBackend.initialise(backend)
      const trainer = yield* Effect.acquireRelease(Effect.sync(Harness.perfModel), (m) =>
        Effect.sync(() => Transformer.dispose(m))
      )
      const served = yield* Effect.acquireRelease(Effect.sync(Harness.perfModel), (m) =>
        Effect.sync(() => Transformer.dispose(m))
      )
      const snapshotAt = (v: number) => Effect.promise(() => Snapshot.fromModel(trainer, PolicyVersion.make(v)))
      const bytes = WeightSnapshot.byteSize(yield* snapshotAt(0))
      const versions = Array.from({ length: iters }, (_, i) => i + 1)

      const snapshot = yield* Effect.forEach(versions, (v) => seconds(snapshotAt(v)))

      // http: serve's routes over a LocalEngine, on loopback
      const servedEngine = yield* LocalEngine.make({ model: served })
      const tokenizer = ByteTokenizer.make()
      const context = yield* Layer.build(
        OpenAiServer.layer({
          engine: servedEngine,
          tokenizer,
          modelName: "perf",
          maxModelLen: 1024,
          weightToken: "bench"
        }).pipe(Layer.provideMerge(NodeHttpServer.layer(createServer, { port: 0, host: "127.0.0.1" })))
      )
      const url = HttpServer.formatAddress(Context.get(context, HttpServer.HttpServer).address)
      const timings: Array<WeightUpload.Timing> = []
      // the snapshot is read before the clock starts (the `snapshot` row times it)
      const http = yield* Effect.forEach(versions, (v) =>
        Effect.flatMap(snapshotAt(v), (s) =>
          seconds(
            WeightUpload.upload({ url, token: "bench" }, s).pipe(
              Effect.tap((t) => Effect.sync(() => timings.push(t))),
              Effect.provide(FetchHttpClient.layer)
            )
          )
        )
      )
      if ((yield* servedEngine.version) !== iters) throw new Error("http sync did not reach the engine")

      // file: write, and until a watching engine has it
      const dir = yield* Effect.acquireRelease(
        Effect.promise(() => fs.mkdtemp(path.join(os.tmpdir(), "bench-weight-sync-"))),
        (d) => Effect.promise(() => fs.rm(d, { recursive: true, force: true }))
      )
      const watcherModel = yield* Effect.acquireRelease(Effect.sync(Harness.perfModel), (m) =>
        Effect.sync(() => Transformer.dispose(m))
      )
      const watcher = yield* LocalEngine.make({ model: watcherModel })
      yield* FileWeightSync.watch(dir, watcher, { interval: "5 millis" })
      const fileSync = FileWeightSync.make({ dir })
      const file: Array<number> = []
      const fileToEngine = yield* Effect.forEach(versions, (v) =>
        seconds(
          Effect.gen(function* () {
            file.push(yield* seconds(fileSync.publish({ version: PolicyVersion.make(v), snapshot: snapshotAt(v) })))
            while ((yield* watcher.version) < v) yield* Effect.sleep("1 millis")
          })
        )
      )

      // worker: the SharedArrayBuffer board
      const worker = yield* Effect.gen(function* () {
        const sync = yield* EngineWeightSync.make({ weights: "copied" })
        return yield* Effect.forEach(versions, (v) =>
          seconds(sync.publish({ version: PolicyVersion.make(v), snapshot: snapshotAt(v) }))
        )
      }).pipe(Effect.provide(WorkerEngine.layer({ model: trainer, backend })))

      return {
        bytes,
        snapshot: median(snapshot),
        http: median(http),
        httpChunks: timings[0]!.chunks,
        file: median(file),
        fileToEngine: median(fileToEngine),
        worker: median(worker)
      }
    })
  )

export const run = async (): Promise<void> => {
  const iters = Math.max(3, Number(Harness.arg("iters", "10")))
  const r = await Effect.runPromise(program(iters))
  const ms = (s: number) => Number((s * 1000).toFixed(2))
  Harness.report({
    bench: "weight-sync",
    model: "perf (vocab 512, d 256, 4 layers)",
    bytes: r.bytes,
    msPerSync: {
      snapshot: ms(r.snapshot),
      http: ms(r.http),
      file: ms(r.file),
      fileToEngine: ms(r.fileToEngine),
      worker: ms(r.worker)
    },
    httpChunks: r.httpChunks,
    workload: { iters, backend: "wasm (stock kernels)", note: "medians; http/file/worker exclude the snapshot read" },
    ...Harness.environment()
  })
}

if (import.meta.main) await run()
