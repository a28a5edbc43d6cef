/**
 * How a version's full weights reach every replica of a RemoteEngine (`dialect`, weights/WeightDialect.ts has the
 * wire): all replicas in are paused, the weights reach each before any resumes, and each replica's served version is
 * then read back and checked (a replica that disagrees is taken out):
 * - `effect-rl` with a `weightToken`: uploaded to each replica's `/v1/weights` (weights/WeightUpload.ts; the newest
 *   snapshot is kept in memory to bring a returning replica up to date);
 * - `vllm` / `sglang`: written once as a HF directory `<weightsDir>/v<version>` (weights/HfWeightDir.ts; the servers
 *   must read the same path), then each replica is paused (`pauseMode`), told to reload from it, its cache reset,
 *   resumed.
 * A snapshot with tensors and no way to send them fails (it used to advance the version only, leaving the server on
 * the step-0 weights forever).
 */
import { Clock, Effect } from "effect"
import { HttpClient } from "effect/http"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as HfWeightDir from "../weights/HfWeightDir.ts"
import * as WeightDialect from "../weights/WeightDialect.ts"
import * as WeightUpload from "../weights/WeightUpload.ts"
import * as RemoteWire from "./RemoteWire.ts"
import type * as ReplicaPool from "./ReplicaPool.ts"

export interface Options {
  /** How full weights reach the servers (see the module header); default effect-rl. */
  readonly dialect?: WeightDialect.Dialect
  /** effect-rl: the servers' weight token; `updateWeights` uploads snapshots to `/v1/weights`. */
  readonly weightToken?: string
  readonly chunkBytes?: number
  /** vllm / sglang: where each version's HF directory is written (a path the servers read as it is). */
  readonly weightsDir?: string
  /** vllm / sglang: the model's HF config.json, written beside the weights. */
  readonly hfConfig?: Readonly<Record<string, unknown>>
  /** vllm / sglang: how the servers hold generation while weights change (pipeline.pause_mode); default keep. */
  readonly pauseMode?: WeightDialect.PauseMode
}

export const make = (pool: ReplicaPool.ReplicaPool, client: HttpClient.HttpClient, options: Options) => {
  const dialect = options.dialect ?? "effect-rl"
  const withClient = Effect.provideService(HttpClient.HttpClient, client)
  const { replicas, notPaused, onEveryReplica } = pool
  /** The newest full weights sent, to bring a returning replica up to date: a HF directory, or (effect-rl) tensors. */
  let currentWeights: { readonly dir: string } | { readonly snapshot: WeightSnapshot.WeightSnapshot } | undefined

  /** Send the newest full weights to one paused-or-idle replica and label them `target`. */
  const sendWeights = (replica: ReplicaPool.Replica, target: number) =>
    Effect.gen(function* () {
      const weights = currentWeights
      if (weights === undefined) return
      if ("dir" in weights) {
        yield* WeightDialect.loadFromDisk(dialect as "vllm" | "sglang", replica.target, weights.dir, target)
        return
      }
      yield* WeightUpload.upload(
        {
          url: replica.target.base,
          token: options.weightToken!,
          ...(options.chunkBytes === undefined ? {} : { chunkBytes: options.chunkBytes })
        },
        weights.snapshot
      ).pipe(Effect.mapError((e) => RemoteWire.error("BadResponse", e.message)))
    }).pipe(withClient)

  /** The replica's served version against `expected`: a disagreement fails (undefined: the server cannot say). */
  const checkVersion = (replica: ReplicaPool.Replica, expected: number) =>
    Effect.gen(function* () {
      const served = yield* WeightDialect.servedVersion(dialect, replica.target).pipe(withClient)
      if (served !== undefined && served !== expected) {
        return yield* RemoteWire.error("BadResponse", `serves version ${served}, expected ${expected}`)
      }
      replica.version = expected
    })

  /** Wait until no call of this engine is in flight to the replica (pause mode wait). */
  const drained = (replica: ReplicaPool.Replica) =>
    Effect.gen(function* () {
      while (replica.inFlight > 0) yield* Effect.sleep("20 millis")
    })

  /** Full weights to every replica in: all paused, all loaded and checked, then all resumed; bytes and wall time. */
  const syncFull = (snapshot: WeightSnapshot.WeightSnapshot) =>
    Effect.gen(function* () {
      const startedAt = yield* Clock.currentTimeMillis
      let bytes = WeightSnapshot.byteSize(snapshot)
      if (dialect === "effect-rl") {
        if (options.weightToken === undefined) {
          return yield* RemoteWire.error(
            "Internal",
            `weights v${snapshot.version} cannot reach the server: dialect effect-rl needs a weight token ` +
              `(generator.engine.weight_token), or choose dialect vllm or sglang`
          )
        }
        currentWeights = { snapshot }
      } else {
        if (options.weightsDir === undefined) {
          return yield* RemoteWire.error(
            "Internal",
            `weights v${snapshot.version}: dialect ${dialect} needs a weights directory`
          )
        }
        const written = yield* Effect.tryPromise({
          try: () =>
            HfWeightDir.write(options.weightsDir!, snapshot, {
              ...(options.hfConfig === undefined ? {} : { config: options.hfConfig })
            }),
          catch: (cause) =>
            RemoteWire.error("Internal", `cannot write weights v${snapshot.version}: ${(cause as Error).message}`)
        })
        currentWeights = { dir: written.dir }
        bytes = written.bytes
      }
      const mode = options.pauseMode ?? "keep"
      yield* Effect.acquireUseRelease(
        notPaused.close,
        () =>
          Effect.gen(function* () {
            yield* onEveryReplica((replica) =>
              Effect.gen(function* () {
                if (mode === "wait") yield* drained(replica)
                yield* WeightDialect.pause(dialect, replica.target, mode).pipe(withClient)
              })
            )
            yield* onEveryReplica((replica) =>
              Effect.andThen(sendWeights(replica, snapshot.version), checkVersion(replica, snapshot.version))
            )
          }),
        // every replica is resumed, also after a failure (one taken out is resumed when it returns)
        () =>
          Effect.andThen(
            Effect.forEach(
              replicas.filter((r) => r.up),
              (replica) => WeightDialect.resume(dialect, replica.target).pipe(withClient, Effect.ignore),
              { concurrency: "unbounded", discard: true }
            ),
            notPaused.open
          )
      )
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      return { version: snapshot.version, bytes, seconds }
    })

  return {
    dialect,
    /** Whether any full weights were sent (a returning replica's version can then be checked). */
    sent: () => currentWeights !== undefined,
    sendWeights,
    checkVersion,
    syncFull
  }
}
