/**
 * The in-process inference engine: token ids in, tokens + behaviour log-probs + finish reason out, sampled from a
 * Transformer in this process with the KV-cache sampler (model/Sampling.ts).
 *
 * Weights and versions:
 * - `updateWeights(snapshot)` loads the snapshot into the engine's model in place. Decode steps are synchronous
 *   blocks between awaits, so an update always lands between two decode steps: requests in flight continue on the
 *   new weights from their next token (their cached keys/values stay), and each result reports the versions of its
 *   first and last token.
 * - A snapshot with no tensors only advances the version: for an engine sharing the trainer's variables in process,
 *   where the weights have already changed in place.
 * - Versions never go backwards (a defect).
 * `pause` holds every request before its next decode step; `resume` releases them; updates apply while paused.
 *
 * Concurrent `generate` calls run interleaved (one decode step at a time each) and share one fused inference view of
 * the current weights, rebuilt once per version.
 */
import { Effect, Layer } from "effect"
import { InferenceError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"
import * as Sampling from "../model/Sampling.ts"
import * as Snapshot from "../model/Snapshot.ts"
import * as Transformer from "../model/Transformer.ts"
import { type GenerateRequest, type GenerateResult, InferenceEngine } from "./InferenceEngine.ts"

export interface LocalEngineOptions {
  /** The weights to sample from. The engine does not dispose it (its owner does). */
  readonly model: Transformer.Transformer
  readonly initialVersion?: PolicyVersion.PolicyVersion
  /** Token ids → text, needed for stop strings. */
  readonly decode?: (ids: ReadonlyArray<number>) => string
  /** At most this many requests per batched forward (default 32); larger calls run in consecutive batches. */
  readonly maxBatch?: number
  /** See model/Sampling.ts. Default "processed". */
  readonly logprobsMode?: "processed" | "raw"
}

const engineName = "local"

/** Yield to the macrotask queue, so fibers that publish weights or pause get to run between decode steps. */
const yieldToEventLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve))

export const make = Effect.fnUntraced(function* (options: LocalEngineOptions) {
  const { model } = options
  const maxBatch = options.maxBatch ?? 32
  let version: PolicyVersion.PolicyVersion = options.initialVersion ?? PolicyVersion.initial
  let view: { readonly version: number; readonly view: Transformer.WeightView } | undefined
  let paused = false
  let waiters: Array<() => void> = []

  const currentView = (v: number): Transformer.WeightView => {
    if (view === undefined || view.version !== v) {
      if (view !== undefined) Transformer.disposeView(view.view)
      view = { version: v, view: Transformer.inferenceView(model) }
    }
    return view.view
  }
  yield* Effect.addFinalizer(() =>
    Effect.sync(() => {
      if (view !== undefined) Transformer.disposeView(view.view)
      view = undefined
    })
  )

  const beforeStep = (signal: AbortSignal) => async (): Promise<number> => {
    await yieldToEventLoop()
    while (paused) await new Promise<void>((resolve) => waiters.push(resolve))
    if (signal.aborted) throw new Error("generation interrupted")
    return version
  }

  const runBatch = (requests: ReadonlyArray<GenerateRequest>) =>
    Effect.tryPromise({
      try: (signal) =>
        Sampling.generate(model, requests, {
          beforeStep: beforeStep(signal),
          view: currentView,
          ...(options.decode !== undefined ? { decode: options.decode } : {}),
          ...(options.logprobsMode !== undefined ? { logprobsMode: options.logprobsMode } : {})
        }),
      catch: (cause) =>
        new InferenceError({
          engine: engineName,
          reason: "Internal",
          message: cause instanceof Error ? cause.message : String(cause)
        })
    })

  const generate = Effect.fn("LocalEngine.generate")(function* (requests: ReadonlyArray<GenerateRequest>) {
    const empty = requests.findIndex((r) => r.promptIds.length === 0)
    if (empty >= 0) {
      return yield* new InferenceError({
        engine: engineName,
        reason: "BadResponse",
        message: `request ${empty} has an empty prompt`
      })
    }
    const results: Array<GenerateResult> = []
    for (let start = 0; start < requests.length; start += maxBatch) {
      const completions = yield* runBatch(requests.slice(start, start + maxBatch))
      for (const c of completions) {
        const first = c.versions[0] ?? version
        const last = c.versions[c.versions.length - 1] ?? version
        results.push({
          tokens: c.tokens,
          logprobs: c.logprobs,
          finishReason: c.finishReason,
          policyVersionFirst: PolicyVersion.make(first),
          policyVersionLast: PolicyVersion.make(last)
        })
      }
    }
    return results
  })

  const updateWeights = (snapshot: WeightSnapshot) =>
    Effect.suspend(() => {
      if (snapshot.version < version) {
        return Effect.die(new Error(`LocalEngine.updateWeights: version ${snapshot.version} is older than ${version}`))
      }
      return Effect.try({
        try: () => {
          if (snapshot.names.length > 0) Snapshot.load(model, snapshot)
          // a new version, or new weights at the same version: either way the fused view is stale
          if (view !== undefined) Transformer.disposeView(view.view)
          view = undefined
          version = snapshot.version
        },
        catch: (cause) =>
          new InferenceError({
            engine: engineName,
            reason: "BadResponse",
            message: `cannot load weights v${snapshot.version}: ${cause instanceof Error ? cause.message : String(cause)}`
          })
      })
    })

  const pause = Effect.sync(() => {
    paused = true
  })
  const resume = Effect.sync(() => {
    paused = false
    const release = waiters
    waiters = []
    for (const w of release) w()
  })

  return InferenceEngine.of({
    generate,
    updateWeights,
    pause,
    resume,
    version: Effect.sync(() => version)
  })
})

export const layer = (options: LocalEngineOptions): Layer.Layer<InferenceEngine> =>
  Layer.effect(InferenceEngine, make(options))
