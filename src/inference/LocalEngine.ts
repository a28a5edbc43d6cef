/**
 * The in-process inference engine: token ids in, tokens + behaviour log-probs + finish reason out, sampled from a
 * Transformer in this process (model/Sampling.ts rules, model/KvCache.ts cache).
 *
 * Continuous batching: one scheduler fiber owns a running batch and its KV cache. Each iteration it (1) runs one
 * decode step for every running row, (2) admits waiting requests (up to `maxBatch` rows) by prefilling them and
 * merging their cache into the running one, and (3) drops finished rows. Concurrent `generate` calls (the K
 * generation fibers of the pipeline, each a GRPO group) therefore share each forward pass: one batch of 16 rows costs
 * far less than 4 batches of 4 (per-step kernel and JS overhead is paid once). With small models a decode step's cost
 * grows with rows × cache length (attention over the cache, which skips each row's left padding); a row that finishes
 * or joins costs one copy of the cache's rows (native gather / concat).
 *
 * Weights and versions:
 * - `updateWeights(snapshot)` loads the snapshot into the engine's model in place. The scheduler yields to the event
 *   loop between decode steps, so an update always lands between two steps: requests in flight continue on the new
 *   weights from their next token (their cached keys/values stay), and each result reports the versions of its first
 *   and last token.
 * - A snapshot with no tensors only advances the version: for an engine sharing the trainer's variables in process,
 *   whose weights have already changed in place.
 * - Versions never go backwards (a defect).
 * `pause` holds the scheduler before its next decode step; `resume` releases it; updates apply while paused.
 *
 * Streaming and constraints: a request's `onToken` is called with each token as the scheduler samples it (the server
 * streams it from there), and its `constraint` (model/Sampling.ts) masks the logits of its row before each draw.
 *
 * Prefix caching: a finished request's keys/values are kept (model/PrefixCache.ts, `prefixCacheBytes`), so the next
 * turn of a multi-turn episode (previous prompt + response + tool output) prefills only its new tokens. Cached
 * prefixes are dropped when the weights change, and only rows generated entirely on the current weights are kept.
 */
import { Deferred, Effect, Latch, Layer, Semaphore } from "effect"
import { InferenceError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"
import * as KvCache from "../model/KvCache.ts"
import * as PrefixCache from "../model/PrefixCache.ts"
import * as Sampling from "../model/Sampling.ts"
import * as Snapshot from "../model/Snapshot.ts"
import type * as Transformer from "../model/Transformer.ts"
import * as WeightView from "../model/WeightView.ts"
import { type GenerateRequest, type GenerateResult, InferenceEngine } from "./InferenceEngine.ts"

export interface LocalEngineOptions {
  /** The weights to sample from. The engine does not dispose it (its owner does). */
  readonly model: Transformer.Transformer
  readonly initialVersion?: PolicyVersion.PolicyVersion
  /** Token ids → text, needed for stop strings. */
  readonly decode?: (ids: ReadonlyArray<number>) => string
  /** At most this many rows decode together (default 64); more requests wait for room. */
  readonly maxBatch?: number
  /** See model/Sampling.ts. Default "processed". */
  readonly logprobsMode?: "processed" | "raw"
  /**
   * Budget for prefix caching (model/PrefixCache.ts) in bytes of keys/values; 0 turns it off. Default 256 MiB.
   * Entries are dropped whenever the weights change.
   */
  readonly prefixCacheBytes?: number
  /** Counters for tests and metrics: tokens run through prefill, and prompt tokens served from the prefix cache. */
  readonly stats?: { prefilledTokens: number; reusedTokens: number }
}

const engineName = "local"

/** One `generate` call: its rows finish independently; the call completes when all have. */
interface Submission {
  readonly requests: ReadonlyArray<GenerateRequest>
  readonly rows: ReadonlyArray<Sampling.Row>
  readonly done: Deferred.Deferred<void, InferenceError>
  remaining: number
  cancelled: boolean
}

/** A row in the running batch. `pending` is its last sampled token, not yet in the cache. */
interface Running {
  readonly row: Sampling.Row
  readonly submission: Submission
  /** The request's `onToken`: told each token as it is sampled. */
  readonly onToken: GenerateRequest["onToken"]
  pending: number
}

/** Yield to the macrotask queue, so fibers that publish weights or pause get to run between decode steps. */
const yieldToEventLoop = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))

const internal = (cause: unknown) =>
  new InferenceError({
    engine: engineName,
    reason: "Internal",
    message: cause instanceof Error ? cause.message : String(cause)
  })

// biome-ignore lint/complexity/noExcessiveLinesPerFunction: a make closure is its service's class (400 lines at most)
export const make = Effect.fnUntraced(function* (options: LocalEngineOptions) {
  const { model } = options
  const maxBatch = options.maxBatch ?? 64
  const maxContext = model.config.maxPositionEmbeddings
  const sampleOptions = {
    ...(options.decode !== undefined ? { decode: options.decode } : {}),
    ...(options.logprobsMode !== undefined ? { logprobsMode: options.logprobsMode } : {})
  }
  let version: PolicyVersion.PolicyVersion = options.initialVersion ?? PolicyVersion.initial
  let view: { readonly version: number; readonly view: WeightView.WeightView } | undefined
  let running: Array<Running> = []
  let cache: KvCache.KvCache | undefined
  let waiting: Array<Submission> = []
  const prefixBytes = options.prefixCacheBytes ?? 256 * 2 ** 20
  const prefixCache = prefixBytes > 0 ? PrefixCache.make(prefixBytes) : undefined
  const stats = options.stats ?? { prefilledTokens: 0, reusedTokens: 0 }
  const work = yield* Latch.make(false) // open while there is something to do
  const notPaused = yield* Latch.make(true)
  const stepping = yield* Semaphore.make(1) // one scheduler iteration or one weight update at a time

  const currentView = (): WeightView.WeightView => {
    if (view === undefined || view.version !== version) {
      if (view !== undefined) WeightView.dispose(view.view)
      view = { version, view: WeightView.inference(model) }
    }
    return view.view
  }
  const dropView = () => {
    if (view !== undefined) WeightView.dispose(view.view)
    view = undefined
  }

  /** Keep the running rows at these indices (and their cache rows). */
  const keepRows = (keep: ReadonlyArray<number>) => {
    if (keep.length === running.length) return
    running = keep.map((i) => running[i]!)
    if (cache !== undefined) {
      if (keep.length === 0) {
        KvCache.dispose(cache)
        cache = undefined
      } else {
        cache = KvCache.trim(KvCache.select(cache, keep))
      }
    }
  }

  /** Record a sampled token; returns the submissions this completed. */
  const settle = (entry: Running, token: number | undefined, finished: Array<Submission>): boolean => {
    if (token !== undefined) {
      entry.pending = token
      return true
    }
    entry.submission.remaining--
    if (entry.submission.remaining === 0) finished.push(entry.submission)
    return false
  }

  /** Keep a finished row's keys/values (all its tokens but the last, which never entered the cache) for reuse. */
  const remember = (entry: Running, from: KvCache.KvCache, index: number) => {
    if (prefixCache === undefined || !entry.row.versions.every((w) => w === version)) return
    const tokens = [...entry.row.request.promptIds, ...entry.row.tokens.slice(0, -1)]
    const row = KvCache.copyRows(from, [index])
    prefixCache.store(tokens, KvCache.prefixOf(row, tokens.length)) // exactly its tokens: no padding, no spare slots
    KvCache.dispose(row)
  }

  /** Sample each stepped row's token; returns the indices of rows that continue. */
  const sampleRows = (
    entries: ReadonlyArray<Running>,
    stepped: KvCache.Stepped,
    v: number,
    finished: Array<Submission>
  ) => {
    const V = stepped.logits.length / entries.length
    const keep: Array<number> = []
    entries.forEach((entry, i) => {
      const { row } = entry
      const sampled = row.tokens.length
      const token = Sampling.advance(row, stepped.logits.subarray(i * V, (i + 1) * V), v, maxContext, sampleOptions)
      if (entry.onToken !== undefined && row.tokens.length > sampled) {
        entry.onToken({
          token: row.tokens[sampled]!,
          logprob: row.logprobs[sampled]!,
          version: v,
          ...(row.finishReason === undefined ? {} : { finishReason: row.finishReason })
        })
      }
      if (settle(entry, token, finished)) keep.push(i)
      else remember(entry, stepped.cache, i)
    })
    return keep
  }

  /** Prefill admitted rows: from scratch, or continuing a cached prefix. Returns their cache, rows in `order`. */
  const prefillAdmitted = async (admitted: ReadonlyArray<Running>) => {
    const hits = admitted.map((a) => prefixCache?.lookup(a.row.request.promptIds))
    const fresh = admitted.flatMap((a, i) => (hits[i] === undefined ? [a] : []))
    const reused = admitted.flatMap((a, i) => (hits[i] === undefined ? [] : [{ entry: a, hit: hits[i]! }]))
    const parts: Array<{ readonly entries: ReadonlyArray<Running>; readonly stepped: KvCache.Stepped }> = []
    if (fresh.length > 0) {
      parts.push({
        entries: fresh,
        stepped: await KvCache.prefill(
          model,
          currentView(),
          fresh.map((a) => a.row.request.promptIds)
        )
      })
      stats.prefilledTokens += fresh.reduce((n, a) => n + a.row.request.promptIds.length, 0)
    }
    if (reused.length > 0) {
      const past = reused.map((r) => r.hit.cache).reduce((a, b) => KvCache.merge(a, b))
      const suffixes = reused.map((r) => r.entry.row.request.promptIds.slice(r.hit.length))
      parts.push({
        entries: reused.map((r) => r.entry),
        stepped: await KvCache.append(model, currentView(), past, suffixes)
      })
      stats.prefilledTokens += suffixes.reduce((n, s) => n + s.length, 0)
      stats.reusedTokens += reused.reduce((n, r) => n + r.hit.length, 0)
    }
    return parts
  }

  /**
   * One scheduler iteration. Returns the submissions that completed. Its tensor reads are async (webgpu has no
   * synchronous read), so it runs under `stepping`, which weight updates take too: a step never sees new weights
   * halfway through.
   */
  const iterate = async (): Promise<Array<Submission>> => {
    const finished: Array<Submission> = []
    const v = version
    // drop rows whose caller went away
    keepRows(running.flatMap((r, i) => (r.submission.cancelled ? [] : [i])))
    waiting = waiting.filter((s) => !s.cancelled)
    // (1) one decode step for the running batch
    if (running.length > 0 && cache !== undefined) {
      const stepped = await KvCache.extend(
        model,
        currentView(),
        cache,
        running.map((r) => r.pending)
      )
      cache = stepped.cache
      keepRows(sampleRows(running, stepped, v, finished))
    }
    // (2) admit waiting requests while there is room
    const admitted: Array<Running> = []
    while (waiting.length > 0) {
      // a call larger than maxBatch is admitted alone, into an empty batch
      const size = running.length + admitted.length
      if (size > 0 && size + waiting[0]!.remaining > maxBatch) break
      const submission = waiting.shift()!
      submission.rows.forEach((row, i) => {
        if (row.finishReason === undefined) {
          admitted.push({ row, submission, onToken: submission.requests[i]!.onToken, pending: -1 })
        }
      })
    }
    for (const { entries, stepped } of await prefillAdmitted(admitted)) {
      const keep = sampleRows(entries, stepped, v, finished)
      if (keep.length === 0) {
        KvCache.dispose(stepped.cache)
        continue
      }
      const joined = keep.length === entries.length ? stepped.cache : KvCache.select(stepped.cache, keep)
      cache = cache === undefined ? joined : KvCache.merge(cache, joined)
      running = [...running, ...keep.map((i) => entries[i]!)]
    }
    return finished
  }

  /** Fail everything in flight (a forward threw): the batch state cannot be trusted. */
  const failAll = (error: InferenceError) =>
    Effect.gen(function* () {
      const submissions = new Set([...running.map((r) => r.submission), ...waiting])
      running = []
      waiting = []
      if (cache !== undefined) KvCache.dispose(cache)
      cache = undefined
      for (const s of submissions) yield* Deferred.fail(s.done, error)
    })

  const scheduler = Effect.gen(function* () {
    while (true) {
      if (running.length === 0 && waiting.length === 0) {
        yield* work.close
        yield* work.await
      }
      yield* notPaused.await
      yield* yieldToEventLoop
      const result = yield* stepping
        .withPermit(Effect.tryPromise({ try: iterate, catch: internal }))
        .pipe(Effect.result)
      if (result._tag === "Failure") {
        yield* Effect.logError(`LocalEngine: decode step failed: ${result.failure.message}`)
        yield* failAll(result.failure)
        continue
      }
      for (const s of result.success) yield* Deferred.succeed(s.done, undefined)
    }
  })
  yield* Effect.forkScoped(scheduler)
  yield* Effect.addFinalizer(() =>
    Effect.sync(() => {
      if (cache !== undefined) KvCache.dispose(cache)
      cache = undefined
      dropView()
      prefixCache?.clear()
    })
  )

  const generate = Effect.fn("LocalEngine.generate")(function* (requests: ReadonlyArray<GenerateRequest>) {
    const empty = requests.findIndex((r) => r.promptIds.length === 0)
    if (empty >= 0) {
      return yield* new InferenceError({
        engine: engineName,
        reason: "BadResponse",
        message: `request ${empty} has an empty prompt`
      })
    }
    const tooBig = requests.findIndex((r) =>
      r.promptIds.some((id) => !Number.isInteger(id) || id < 0 || id >= model.config.vocabSize)
    )
    if (tooBig >= 0) {
      return yield* new InferenceError({
        engine: engineName,
        reason: "BadResponse",
        message: `request ${tooBig} has a token id outside the vocabulary`
      })
    }
    const rows = requests.map((request) => Sampling.startRow(request, maxContext))
    const remaining = rows.filter((r) => r.finishReason === undefined).length
    if (remaining > 0) {
      const submission: Submission = {
        requests,
        rows,
        done: yield* Deferred.make<void, InferenceError>(),
        remaining,
        cancelled: false
      }
      waiting.push(submission)
      yield* work.open
      yield* Deferred.await(submission.done).pipe(
        Effect.onInterrupt(() =>
          Effect.sync(() => {
            submission.cancelled = true
          })
        )
      )
    }
    return rows.map((row): GenerateResult => {
      const c = Sampling.toCompletion(row)
      return {
        tokens: c.tokens,
        logprobs: c.logprobs,
        finishReason: c.finishReason,
        policyVersionFirst: PolicyVersion.make(c.versions[0] ?? version),
        policyVersionLast: PolicyVersion.make(c.versions[c.versions.length - 1] ?? version)
      }
    })
  })

  const updateWeights = (snapshot: WeightSnapshot) =>
    stepping.withPermit(
      Effect.suspend(() => {
        if (snapshot.version < version) {
          return Effect.die(
            new Error(`LocalEngine.updateWeights: version ${snapshot.version} is older than ${version}`)
          )
        }
        return Effect.try({
          try: () => {
            if (snapshot.names.length > 0 || snapshot.adapter !== undefined) Snapshot.load(model, snapshot)
            dropView() // new weights (even at the same version): the fused view and cached prefixes are stale
            prefixCache?.clear()
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
    )

  return InferenceEngine.of({
    generate,
    updateWeights,
    pause: Effect.asVoid(notPaused.close),
    resume: Effect.asVoid(notPaused.open),
    version: Effect.sync(() => version)
  })
})

export const layer = (options: LocalEngineOptions): Layer.Layer<InferenceEngine> =>
  Layer.effect(InferenceEngine, make(options))
