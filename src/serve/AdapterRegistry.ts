/**
 * The LoRA adapters `serve` holds beside its base model, by name: what vLLM's runtime LoRA endpoints
 * (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`; LoraAdmin.ts has the wire side) load and unload.
 *
 * Each adapter is sampled by a LocalEngine of its own over `Transformer.shareBase(base)`: the base's variables
 * (nothing copied) with the adapter attached. So requests for different adapters do not share a forward pass (vLLM
 * batches them together), and each adapter engine's inference view merges its adapter into fused copies of the
 * projections (the view is lean, adapters unmerged, where `WeightView.inference` says: large models and
 * bfloat16-stored bases).
 *
 * Versions: an adapter whose name ends in `-v<digits>` (RemoteEngine names them `<prefix>-v<version>`) reports that
 * number as the policy version of everything it samples; any other adapter reports the base engine's version.
 *
 * Lifetime: `use` holds an adapter for a scope (a request). Unloading removes the name at once (new requests get
 * 404) and frees the adapter's engine and tensors when the last request holding it finishes, so requests in flight
 * complete on the adapter they started with. Loading in place (`load_inplace`) swaps a new adapter in under the name
 * the same way. `refresh` (after the base weights changed) rebuilds every adapter engine's view on the new base.
 */

import * as path from "node:path"
import { Effect, Exit, Schema, Scope, Semaphore } from "effect"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import type { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as LocalEngine from "../inference/LocalEngine.ts"
import * as LogProbs from "../model/LogProbs.ts"
import * as Lora from "../model/Lora.ts"
import * as Transformer from "../model/Transformer.ts"

/**
 * Why a load or unload was refused: the name is taken (`AlreadyLoaded`), names no adapter (`NotFound`), the
 * directory holds no adapter (`NoAdapter`), its files cannot be read or do not fit the base (`Unreadable`; `detail`
 * names the file), or the server holds its most adapters already (`TooMany`).
 */
export class AdapterError extends Schema.TaggedError<AdapterError>()("AdapterError", {
  name: Schema.String,
  reason: Schema.Literals(["AlreadyLoaded", "NotFound", "NoAdapter", "Unreadable", "TooMany"]),
  detail: Schema.String
}) {}

/** What serves one model name: the engine that samples it and, optionally, prompt scoring under its weights. */
export interface ServedModel {
  readonly engine: InferenceEngine["Service"]
  /** `log p(ids[t] | ids[<t])` for t ≥ 1 under the served weights. */
  readonly promptLogprobs?: (ids: ReadonlyArray<number>) => Promise<ReadonlyArray<number>>
  /** The `k` most likely tokens at each position ≥ `from` under softmax(z / τ) (LogProbs.topK), for `top_logprobs`. */
  readonly topLogprobs?: (
    ids: ReadonlyArray<number>,
    from: number,
    k: number,
    temperature: number
  ) => Promise<ReadonlyArray<ReadonlyArray<LogProbs.Alternative>>>
}

export interface LoadedAdapter {
  readonly name: string
  readonly path: string
}

export interface AdapterRegistry {
  /** The loaded adapters, in load order. */
  readonly list: Effect.Effect<ReadonlyArray<LoadedAdapter>>
  /** The adapter named `name`, held until the scope closes (even if unloaded meanwhile); undefined: none loaded. */
  readonly use: (name: string) => Effect.Effect<ServedModel | undefined, never, Scope.Scope>
  /** Read the PEFT directory `dir` and serve it as `name`; `inplace` replaces an adapter of that name. */
  readonly load: (name: string, dir: string, inplace: boolean) => Effect.Effect<void, AdapterError>
  readonly unload: (name: string) => Effect.Effect<void, AdapterError>
  /** The base weights changed: every adapter engine samples from them from its next step. */
  readonly refresh: Effect.Effect<void>
}

export interface AdapterRegistryOptions {
  /** The base model the adapters share (its owner disposes it). */
  readonly base: Transformer.Transformer
  /** The base's engine: adapters without a version in their name report its version. */
  readonly baseEngine: InferenceEngine["Service"]
  readonly decode?: (ids: ReadonlyArray<number>) => string
  readonly maxBatch?: number
  /** Loads past this many adapters held at once are refused; default unbounded. */
  readonly maxLoras?: number
}

/** The version in a name ending in `-v<digits>`, else undefined. */
export const versionOfName = (name: string): PolicyVersion.PolicyVersion | undefined => {
  const match = /-v(\d+)$/.exec(name)
  return match === null ? undefined : PolicyVersion.make(Number(match[1]))
}

interface Entry {
  readonly name: string
  readonly path: string
  readonly view: Transformer.Transformer // shares the base's variables; owns its adapters
  readonly engine: InferenceEngine["Service"]
  readonly scope: Scope.Closeable // the engine's
  readonly fixedVersion: PolicyVersion.PolicyVersion | undefined
  users: number
  retired: boolean
}

const message = (cause: unknown) => (cause instanceof Error ? cause.message : String(cause))

export const make = Effect.fnUntraced(function* (options: AdapterRegistryOptions) {
  const { base, baseEngine } = options
  const entries = new Map<string, Entry>()
  const changing = yield* Semaphore.make(1) // one load, unload or refresh at a time

  const free = (entry: Entry) =>
    Scope.close(entry.scope, Exit.void).pipe(Effect.andThen(Effect.sync(() => Transformer.disposeAdapters(entry.view))))

  /** Take the entry out of service: freed now, or when the last request holding it finishes. */
  const retire = (entry: Entry) =>
    Effect.suspend(() => {
      if (entries.get(entry.name) === entry) entries.delete(entry.name)
      entry.retired = true
      return entry.users === 0 ? free(entry) : Effect.void
    })

  yield* Effect.addFinalizer(() => Effect.forEach([...entries.values()], free, { discard: true }))

  const versionOf = (entry: Pick<Entry, "fixedVersion">) =>
    entry.fixedVersion === undefined ? baseEngine.version : Effect.succeed(entry.fixedVersion)

  const fail = (name: string, reason: AdapterError["reason"], detail: string) =>
    Effect.fail(new AdapterError({ name, reason, detail }))

  /** The adapter of `dir` attached to a fresh view of the base; the view is freed again when it does not fit. */
  const readAdapter = (name: string, dir: string) =>
    Effect.gen(function* () {
      if (!(yield* Effect.promise(() => Lora.isAdapterDir(dir)))) {
        return yield* fail(name, "NoAdapter", `no ${Lora.configFile} in ${dir}`)
      }
      const weights = yield* Effect.tryPromise({
        try: () => Lora.readDir(dir),
        catch: (cause) => new AdapterError({ name, reason: "Unreadable", detail: message(cause) })
      })
      const view = Transformer.shareBase(base)
      yield* Effect.try({
        try: () => Lora.attachWeights(view, weights),
        catch: (cause) => {
          Transformer.disposeAdapters(view)
          return new AdapterError({
            name,
            reason: "Unreadable",
            detail: `${path.join(dir, Lora.weightsFile)}: ${message(cause)}`
          })
        }
      })
      return view
    })

  const load = (name: string, dir: string, inplace: boolean) =>
    changing.withPermit(
      Effect.gen(function* () {
        const existing = entries.get(name)
        if (existing !== undefined && !inplace) return yield* fail(name, "AlreadyLoaded", dir)
        if (existing === undefined && options.maxLoras !== undefined && entries.size >= options.maxLoras) {
          return yield* fail(name, "TooMany", `${entries.size} adapters are loaded, the most --max-loras allows`)
        }
        const view = yield* readAdapter(name, dir)
        const fixedVersion = versionOfName(name)
        const initialVersion = yield* versionOf({ fixedVersion })
        const scope = yield* Scope.make()
        const engine = yield* LocalEngine.make({
          model: view,
          initialVersion,
          ...(options.decode === undefined ? {} : { decode: options.decode }),
          ...(options.maxBatch === undefined ? {} : { maxBatch: options.maxBatch })
        }).pipe(Scope.provide(scope))
        entries.set(name, { name, path: dir, view, engine, scope, fixedVersion, users: 0, retired: false })
        if (existing !== undefined) yield* retire(existing)
      })
    )

  const unload = (name: string) =>
    changing.withPermit(
      Effect.suspend(() => {
        const entry = entries.get(name)
        return entry === undefined ? fail(name, "NotFound", name) : retire(entry)
      })
    )

  const release = (entry: Entry) =>
    Effect.suspend(() => {
      entry.users--
      return entry.retired && entry.users === 0 ? free(entry) : Effect.void
    })

  const use = (name: string) =>
    Effect.acquireRelease(
      Effect.sync(() => {
        const entry = entries.get(name)
        if (entry !== undefined) entry.users++
        return entry
      }),
      (entry) => (entry === undefined ? Effect.void : release(entry))
    ).pipe(
      Effect.map((entry): ServedModel | undefined =>
        entry === undefined
          ? undefined
          : {
              engine: entry.engine,
              promptLogprobs: (ids) => LogProbs.ofIds(entry.view, ids),
              topLogprobs: (ids, from, k, temperature) => LogProbs.topK(entry.view, ids, from, k, temperature)
            }
      )
    )

  /** A tensor-less snapshot at the entry's version: the engine drops its view (built on the old base) and cache. */
  const refresh = changing.withPermit(
    Effect.suspend(() =>
      Effect.forEach(
        [...entries.values()],
        (entry) =>
          Effect.flatMap(versionOf(entry), (version) =>
            entry.engine.updateWeights(WeightSnapshot.make({ version, names: [], shapes: [], data: [] }))
          ).pipe(Effect.orDie),
        { discard: true }
      )
    )
  )

  return {
    list: Effect.sync(() => [...entries.values()].map(({ name, path }) => ({ name, path }))),
    use,
    load,
    unload,
    refresh
  } satisfies AdapterRegistry
})
