/**
 * The inference engine in a worker thread: a LocalEngine over its own tfjs backend (initialised in the worker), so
 * generation and training use different cores. The one file that imports `node:worker_threads` on the main side;
 * the worker's entry is ./worker/engine-worker.ts (resolved next to this file with this file's extension, so it
 * runs from src/ under Node's type stripping and from the compiled dist/).
 *
 * What crosses: generate requests and results (token ids, log-probs, versions) by postMessage; weights never do.
 * They live on a shared board (WeightBoard.ts: one SharedArrayBuffer per tensor, allocated once);
 * `updateWeights` copies a snapshot into it, posts the version and the changed tensor indices, and returns when the
 * worker has copied them into its variables — between two decode steps, so requests in flight continue on the new
 * weights and report both versions (policyVersionFirst/Last).
 *
 * `pause`/`resume` follow vLLM's / SkyRL's `pause_generation(mode)`, chosen at construction (`pauseMode`):
 * - `keep`: decode steps stop; requests in flight stay in the batch (with their KV cache) and continue on `resume`.
 * - `wait`: no new request starts; `pause` returns once the requests in flight have finished.
 * - `abort`: requests in flight are stopped at once and resubmitted from their prompt after `resume`. Departure:
 *   SkyRL keeps the partial tokens and continues from them; here they are dropped, so a resubmitted request is
 *   generated wholly by the weights after the pause (LocalEngine does not hand out partial rows).
 * Weight updates apply while paused in every mode.
 */
import { Worker } from "node:worker_threads"
import { Deferred, Effect, Latch, Layer, Semaphore } from "effect"
import type { BackendConfig } from "../config/BackendConfig.ts"
import { InferenceError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { AdapterWeights, WeightSnapshot } from "../domain/WeightSnapshot.ts"
import type { TransformerConfig } from "../model/ModelConfig.ts"
import * as Snapshot from "../model/Snapshot.ts"
import type * as Transformer from "../model/Transformer.ts"
import type { HfFiles, TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import * as WeightBoard from "../weights/WeightBoard.ts"
import { type GenerateRequest, type GenerateResult, InferenceEngine } from "./InferenceEngine.ts"

export type PauseMode = "abort" | "keep" | "wait"

export interface WorkerEngineOptions {
  /**
   * The starting weights (read once); the worker builds its own copy: the base and, when LoRA adapters are attached,
   * the adapter beside it (later versions then send adapters only, posted with the update: megabytes).
   */
  readonly model: Transformer.Transformer
  readonly initialVersion?: PolicyVersion.PolicyVersion
  /** The worker's tfjs backend. */
  readonly backend: BackendConfig
  /** Rows decoded together in the worker (default 64). */
  readonly maxBatch?: number
  /** For stop strings: its HF files cross to the worker once. */
  readonly tokenizer?: TokenizerImpl
  readonly logprobsMode?: "processed" | "raw"
  /** Default `keep`. */
  readonly pauseMode?: PauseMode
}

// ---------------------------------------------------------------------------------------------------------------
// The protocol (engine-worker.ts is the other side)

export interface WorkerInit {
  readonly config: TransformerConfig
  readonly board: WeightBoard.Board
  readonly adapter: AdapterWeights | undefined
  readonly initialVersion: number
  readonly backend: BackendConfig
  readonly maxBatch: number
  readonly tokenizer: HfFiles | undefined
  readonly logprobsMode: "processed" | "raw" | undefined
}

export type ToWorker =
  | { readonly type: "generate"; readonly id: number; readonly requests: ReadonlyArray<GenerateRequest> }
  | { readonly type: "cancel"; readonly id: number }
  | { readonly type: "abort"; readonly id: number }
  | {
      readonly type: "weights"
      readonly id: number
      readonly version: number
      readonly tensors: ReadonlyArray<number> // board indices written
      readonly adapter?: AdapterWeights // a LoRA version's adapter (structured-cloned: small)
    }
  | { readonly type: "pause"; readonly id: number }
  | { readonly type: "resume"; readonly id: number }

export interface WireError {
  readonly reason: InferenceError["reason"]
  readonly message: string
}

export type FromWorker =
  | { readonly type: "ready" }
  | { readonly type: "failed"; readonly message: string }
  | { readonly type: "result"; readonly id: number; readonly results: ReadonlyArray<GenerateResult> }
  | { readonly type: "result"; readonly id: number; readonly error: WireError }
  | { readonly type: "result"; readonly id: number; readonly aborted: true }
  | { readonly type: "ack"; readonly id: number; readonly error?: WireError }

type Reply = Exclude<FromWorker, { readonly type: "ready" } | { readonly type: "failed" }>

const engineName = "worker"

const toInferenceError = (e: WireError) =>
  new InferenceError({ engine: engineName, reason: e.reason, message: e.message })

/** The worker entry beside this file, with this file's extension (.ts in src/, .js in dist/). */
export const workerUrl = (): URL => {
  const here = new URL(import.meta.url)
  const ext = here.pathname.endsWith(".ts") ? ".ts" : ".js"
  return new URL(`./worker/engine-worker${ext}`, here)
}

export const make = Effect.fnUntraced(function* (options: WorkerEngineOptions) {
  const pauseMode = options.pauseMode ?? "keep"
  let version: PolicyVersion.PolicyVersion = options.initialVersion ?? PolicyVersion.initial
  const initial = yield* Effect.promise(() => Snapshot.withAdapter(options.model, version))
  const board = WeightBoard.allocate(initial)
  const init: WorkerInit = {
    config: options.model.config,
    board,
    adapter: initial.adapter,
    initialVersion: version,
    backend: options.backend,
    maxBatch: options.maxBatch ?? 64,
    tokenizer: options.tokenizer?.hfFiles(),
    logprobsMode: options.logprobsMode
  }

  const pending = new Map<number, Deferred.Deferred<Reply, InferenceError>>()
  let nextId = 0
  let broken: InferenceError | undefined
  const ready = yield* Deferred.make<void, InferenceError>()
  const failAll = (error: InferenceError) => {
    broken ??= error
    Deferred.doneUnsafe(ready, Effect.fail(error))
    for (const d of pending.values()) Deferred.doneUnsafe(d, Effect.fail(error))
    pending.clear()
  }

  const worker = yield* Effect.acquireRelease(
    Effect.sync(() => {
      const w = new Worker(workerUrl(), { workerData: init })
      w.on("message", (message: FromWorker) => {
        switch (message.type) {
          case "ready":
            Deferred.doneUnsafe(ready, Effect.void)
            return
          case "failed":
            failAll(new InferenceError({ engine: engineName, reason: "Internal", message: message.message }))
            return
          default: {
            const d = pending.get(message.id)
            pending.delete(message.id)
            if (d !== undefined) Deferred.doneUnsafe(d, Effect.succeed(message))
          }
        }
      })
      w.on("error", (e) =>
        failAll(new InferenceError({ engine: engineName, reason: "Internal", message: `worker failed: ${e.message}` }))
      )
      w.on("exit", (code) =>
        failAll(new InferenceError({ engine: engineName, reason: "Unreachable", message: `worker exited (${code})` }))
      )
      return w
    }),
    (w) =>
      Effect.promise(async () => {
        w.removeAllListeners("exit")
        await w.terminate()
      })
  )
  yield* Deferred.await(ready)

  /** Post a message and wait for its reply; an interrupted generate call cancels its worker fiber. */
  const call = (build: (id: number) => ToWorker) =>
    Effect.suspend(() => {
      if (broken !== undefined) return Effect.fail(broken)
      const id = nextId++
      const reply = Deferred.makeUnsafe<Reply, InferenceError>()
      pending.set(id, reply)
      const message = build(id)
      worker.postMessage(message)
      return Deferred.await(reply).pipe(
        Effect.onInterrupt(() =>
          Effect.sync(() => {
            pending.delete(id)
            if (message.type === "generate" && broken === undefined) worker.postMessage({ type: "cancel", id })
          })
        )
      )
    })

  const control = (build: (id: number) => ToWorker) =>
    Effect.flatMap(call(build), (reply) =>
      reply.type === "ack" && reply.error !== undefined ? Effect.fail(toInferenceError(reply.error)) : Effect.void
    )

  // `wait`/`abort` pauses hold new calls at `admit`; `idle` is open while no call is in flight
  const admit = yield* Latch.make(true)
  const idle = yield* Latch.make(true)
  let inFlight = 0
  const enter = Effect.sync(() => {
    inFlight++
    Latch.closeUnsafe(idle)
  })
  const leave = Effect.sync(() => {
    inFlight--
    if (inFlight === 0) Latch.openUnsafe(idle)
  })

  const generate = Effect.fn("WorkerEngine.generate")(function* (requests: ReadonlyArray<GenerateRequest>) {
    while (true) {
      yield* admit.await
      const reply = yield* Effect.acquireUseRelease(
        enter,
        () => call((id) => ({ type: "generate", id, requests })),
        () => leave
      )
      if (reply.type !== "result") return yield* Effect.die(new Error(`WorkerEngine: unexpected reply ${reply.type}`))
      if ("aborted" in reply) continue // paused with mode abort: resubmit once resumed
      if ("error" in reply) return yield* toInferenceError(reply.error)
      return reply.results.map(
        (r): GenerateResult => ({
          ...r,
          policyVersionFirst: PolicyVersion.make(r.policyVersionFirst),
          policyVersionLast: PolicyVersion.make(r.policyVersionLast)
        })
      )
    }
  })

  const updating = yield* Semaphore.make(1)
  const updateWeights = (snapshot: WeightSnapshot) =>
    updating.withPermit(
      Effect.gen(function* () {
        if (snapshot.version < version) {
          return yield* Effect.die(
            new Error(`WorkerEngine.updateWeights: version ${snapshot.version} is older than ${version}`)
          )
        }
        const tensors = yield* Effect.try({
          try: () => WeightBoard.write(board, snapshot),
          catch: (cause) =>
            new InferenceError({
              engine: engineName,
              reason: "BadResponse",
              message: `cannot load weights v${snapshot.version}: ${cause instanceof Error ? cause.message : String(cause)}`
            })
        })
        yield* control((id) => ({
          type: "weights",
          id,
          version: snapshot.version,
          tensors,
          ...(snapshot.adapter === undefined ? {} : { adapter: snapshot.adapter })
        }))
        version = snapshot.version
      })
    )

  const pause = Effect.gen(function* () {
    if (pauseMode !== "keep") yield* admit.close
    if (pauseMode === "wait") yield* idle.await
    if (pauseMode === "abort") yield* control((id) => ({ type: "abort", id }))
    yield* control((id) => ({ type: "pause", id }))
  }).pipe(Effect.orDie)

  const resume = Effect.gen(function* () {
    yield* control((id) => ({ type: "resume", id }))
    yield* admit.open
  }).pipe(Effect.orDie)

  return InferenceEngine.of({
    generate,
    updateWeights,
    pause,
    resume,
    version: Effect.sync(() => version)
  })
})

export const layer = (options: WorkerEngineOptions): Layer.Layer<InferenceEngine, InferenceError> =>
  Layer.effect(InferenceEngine, make(options))
