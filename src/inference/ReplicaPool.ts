/**
 * The replicas behind one RemoteEngine, and which one gets each call.
 *
 * Replicas (`urls`): a request naming a trajectory (`trajectoryId`) goes to the replica that trajectory's earlier
 * turns went to (sticky, so the server's prefix cache holds its context); a new trajectory goes to the replica with
 * the fewest calls in flight. A replica whose call fails for good (no connection, no answer in `timeout`, 429/503 after
 * `maxRetries` retries) is taken out, and the call — with the tokens it has so far — goes on at another replica: the
 * result lists each move in `retries` (the replica and the reason), which the agent loop records on the turn. Replicas
 * taken out are probed by the engine (`GET /health` every `healthInterval`); one that answers is brought to the
 * current weights and version, checked, and let back in. With no replica in, calls wait for one (up to `timeout`).
 * `pause`/`resume` (and a weight update) hold new calls here, on the client side.
 */
import { Clock, Duration, Effect, Latch } from "effect"
import type { InferenceError } from "../domain/Errors.ts"
import type * as WeightDialect from "../weights/WeightDialect.ts"
import * as RemoteWire from "./RemoteWire.ts"

/** One server of the engine, and what the engine knows of it. */
export interface Replica {
  readonly index: number
  readonly target: WeightDialect.Target
  /** Taken in: calls are routed to it. */
  up: boolean
  /** Why it was taken out, while out. */
  reason: string | undefined
  /** Calls in flight to it. */
  inFlight: number
  /** The newest version sent to it (full weights or adapter). */
  version: number
}

/** Sticky routes kept: trajectories finish and are never named again; the oldest entries go first. */
const maxStickyRoutes = 16_384

export interface ReplicaPool {
  readonly replicas: ReadonlyArray<Replica>
  /** Open unless new calls are held (`pause`, or a weight update between its pause and its resume). */
  readonly notPaused: Latch.Latch
  readonly onReplica: <A>(
    trajectoryId: string | undefined,
    retries: Array<string>,
    f: (replica: Replica) => Effect.Effect<A, InferenceError>
  ) => Effect.Effect<A, InferenceError>
  readonly onEveryReplica: (
    f: (replica: Replica) => Effect.Effect<void, InferenceError>
  ) => Effect.Effect<void, InferenceError>
}

export const make = Effect.fnUntraced(function* (options: {
  /** Base URLs, duplicates allowed (each server is one replica). */
  readonly urls: ReadonlyArray<string>
  readonly apiKey: string | undefined
  /** The version every replica starts at. */
  readonly version: number
  /** How long a call waits for a replica while none is in. */
  readonly timeout: Duration.Duration
}) {
  const timeout = options.timeout
  const replicas: Array<Replica> = [...new Set(options.urls)].map((base, index) => ({
    index,
    target: { base, apiKey: options.apiKey },
    up: true,
    reason: undefined,
    inFlight: 0,
    version: options.version
  }))
  const notPaused = yield* Latch.make(true)
  const sticky = new Map<string, Replica>()

  const takeOut = (replica: Replica, reason: string) =>
    Effect.suspend(() => {
      if (!replica.up) return Effect.void
      replica.up = false
      replica.reason = reason
      return Effect.logWarning(`replica ${replica.target.base} taken out: ${reason}`)
    })

  /** The replica for a call: the trajectory's own while it is in, else the least loaded in; waits while none is. */
  const route = (trajectoryId: string | undefined) =>
    Effect.gen(function* () {
      const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(timeout)
      for (;;) {
        const own = trajectoryId === undefined ? undefined : sticky.get(trajectoryId)
        if (own?.up === true) return { replica: own, moved: undefined }
        const candidates = replicas.filter((r) => r.up)
        if (candidates.length > 0) {
          const replica = candidates.reduce((best, r) => (r.inFlight < best.inFlight ? r : best))
          if (trajectoryId !== undefined) {
            sticky.delete(trajectoryId)
            sticky.set(trajectoryId, replica)
            if (sticky.size > maxStickyRoutes) sticky.delete(sticky.keys().next().value!)
          }
          const moved = own === undefined ? undefined : `replica ${own.target.base} out: ${own.reason ?? "down"}`
          return { replica, moved }
        }
        if ((yield* Clock.currentTimeMillis) > deadline) {
          return yield* RemoteWire.error(
            "Unreachable",
            `no replica in for ${Duration.format(timeout)}: ${outReasons()}`
          )
        }
        yield* Effect.sleep("100 millis")
      }
    })

  const outReasons = () =>
    replicas
      .filter((r) => !r.up)
      .map((r) => `${r.target.base} (${r.reason ?? "down"})`)
      .join(", ")

  /**
   * `f` on the replica of `trajectoryId`; a replica that cannot answer is taken out and `f` runs again at another,
   * each move pushed onto `retries`. Other failures are the call's.
   */
  const onReplica = <A>(
    trajectoryId: string | undefined,
    retries: Array<string>,
    f: (replica: Replica) => Effect.Effect<A, InferenceError>
  ) =>
    Effect.gen(function* () {
      for (;;) {
        yield* notPaused.await
        const { replica, moved } = yield* route(trajectoryId)
        if (moved !== undefined) retries.push(moved)
        replica.inFlight++
        const outcome = yield* f(replica).pipe(
          Effect.ensuring(Effect.sync(() => replica.inFlight--)),
          Effect.map((value) => ({ ok: true as const, value })),
          // a replica that cannot answer is taken out and the call goes on elsewhere; other failures are the call's
          Effect.catchIf(
            (e) => e.isRetryable && replicas.length > 1,
            (e) => Effect.succeed({ ok: false as const, failed: e.message })
          )
        )
        if (outcome.ok) return outcome.value
        yield* takeOut(replica, outcome.failed)
        retries.push(`replica ${replica.target.base} failed: ${outcome.failed}`)
        if (trajectoryId !== undefined) sticky.delete(trajectoryId) // the move is recorded here
        if (retries.length > 4 * replicas.length) {
          return yield* RemoteWire.error("Unreachable", `moved ${retries.length} times: ${retries.join("; ")}`)
        }
      }
    })

  /**
   * Run `f` on every replica in, in parallel. With one replica its failure is the caller's; with several, a replica
   * that fails for good is taken out (it is brought up to date when it returns) unless none is left.
   */
  const onEveryReplica = (f: (replica: Replica) => Effect.Effect<void, InferenceError>) =>
    Effect.gen(function* () {
      const inNow = replicas.filter((r) => r.up)
      if (replicas.length === 1) return yield* f(replicas[0]!)
      const failures = yield* Effect.forEach(
        inNow,
        (replica) =>
          f(replica).pipe(
            Effect.as(undefined),
            Effect.catch((e: InferenceError) => Effect.succeed({ replica, e }))
          ),
        { concurrency: "unbounded" }
      )
      for (const failure of failures) if (failure !== undefined) yield* takeOut(failure.replica, failure.e.message)
      if (inNow.length > 0 && replicas.every((r) => !r.up)) {
        return yield* RemoteWire.error("Unreachable", `no replica took the update: ${outReasons()}`)
      }
    })

  return { replicas, notPaused, onReplica, onEveryReplica } satisfies ReplicaPool
})
