/**
 * The inference engine over HTTP: one or more OpenAI-compatible `/v1/completions` servers ("replicas": our `serve`,
 * vLLM or SGLang), token ids in, token ids + behaviour log-probs out, never re-tokenised. This module composes:
 * - RemoteWire.ts: the request bodies, the readers of the answers, the POST, the failures;
 * - ReplicaPool.ts: which replica gets a call (sticky per trajectory, else the least loaded), taking out a replica
 *   that cannot answer and going on at another;
 * - ReplicaWeights.ts: a version's full weights to every replica (`dialect`), paused, sent, checked, resumed;
 * - ReplicaAdapters.ts: LoRA adapters (`lora`) loaded on every replica and named by new calls.
 * Replicas taken out are probed here (`GET /health` every `healthInterval`); one that answers is brought to the
 * current weights, adapters and version, checked, and let back in.
 *
 * Versions: our server reports `policy_version_first/last` per choice; for servers that do not (vLLM, SGLang) both are
 * the version this engine knows at the start and end of the call. A choice that comes back `finish_reason: "abort"` (a
 * server paused with mode abort while the trainer syncs weights) is resumed as SkyRL does: the request is sent
 * again with the tokens so far appended to the prompt and the remaining budget, and the parts are joined.
 * A tensor-less snapshot only advances the version (the weights went another way: HttpWeightSync, `serve --watch`).
 * `pause`/`resume` hold new calls on the client side.
 *
 * Chat (`chat`, the agent loop's `generator.engine.chat` path): one turn is one `/v1/chat/completions` call
 * (RemoteWire.ts). A chat turn cannot be continued from part of its tokens (the server renders the prompt), so an
 * aborted or failed-over turn is sampled again from its start.
 */
import { Duration, Effect, Layer, Semaphore } from "effect"
import { FetchHttpClient, HttpClient } from "effect/http"
import type { InferenceError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as WeightDialect from "../weights/WeightDialect.ts"
import * as WeightUpload from "../weights/WeightUpload.ts"
import {
  type ChatRequest,
  type ChatResult,
  type GenerateRequest,
  type GenerateResult,
  InferenceEngine
} from "./InferenceEngine.ts"
import * as RemoteWire from "./RemoteWire.ts"
import * as ReplicaAdapters from "./ReplicaAdapters.ts"
import * as ReplicaPool from "./ReplicaPool.ts"
import * as ReplicaWeights from "./ReplicaWeights.ts"

/** The engine's options; how full weights reach the servers (`dialect`, `weightToken`, …) are ReplicaWeights'. */
export interface RemoteEngineOptions extends ReplicaWeights.Options {
  /** Base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted). */
  readonly url?: string
  /** Several replicas' base URLs (with or instead of `url`). */
  readonly urls?: ReadonlyArray<string>
  /** The `model` sent with each request (vLLM checks it against its served model name); default: the first of
   * the server's `/v1/models`. */
  readonly model?: string
  /** Sent as `Authorization: Bearer` on completions and control routes (vLLM `--api-key`). */
  readonly apiKey?: string
  /** Retries of a retryable failure; default 3. */
  readonly maxRetries?: number
  /** Per completions call; default 10 minutes. */
  readonly timeout?: Duration.Input
  /** How often replicas taken out are probed; default 2 seconds. */
  readonly healthInterval?: Duration.Input
  readonly initialVersion?: PolicyVersion.PolicyVersion
  /** Continuations of an aborted choice before giving up (Overloaded); default 8. */
  readonly maxResumes?: number
  /** Sync LoRA adapters through the server's runtime LoRA API (ReplicaAdapters.ts). */
  readonly lora?: ReplicaAdapters.LoraOptions
  /** Called after each sync with the bytes written (or sent) and its wall time. */
  readonly onSynced?: (timing: { readonly version: number; readonly bytes: number; readonly seconds: number }) => void
}

export const make = Effect.fnUntraced(function* (options: RemoteEngineOptions) {
  const client = yield* HttpClient.HttpClient
  const urls = [...(options.url === undefined ? [] : [options.url]), ...(options.urls ?? [])].map(WeightUpload.baseUrl)
  if (urls.length === 0) return yield* RemoteWire.error("BadResponse", "RemoteEngine needs a url")
  const timeout = Duration.fromInputUnsafe(options.timeout ?? Duration.minutes(10))
  const healthInterval = Duration.fromInputUnsafe(options.healthInterval ?? Duration.seconds(2))
  const maxResumes = options.maxResumes ?? 8
  const withClient = Effect.provideService(HttpClient.HttpClient, client)
  const connection: RemoteWire.Connection = {
    client,
    apiKey: options.apiKey,
    timeout,
    maxRetries: options.maxRetries ?? 3
  }
  let version: PolicyVersion.PolicyVersion = options.initialVersion ?? PolicyVersion.initial
  const pool = yield* ReplicaPool.make({ urls, apiKey: options.apiKey, version, timeout })
  const { replicas, notPaused, onReplica } = pool
  /** One weight change at a time: a version's update, or a replica brought back to the current one. */
  const syncing = yield* Semaphore.make(1)
  const weights = ReplicaWeights.make(pool, client, options)
  const baseModel = options.model ?? (yield* RemoteWire.servedModel(client, replicas[0]!.target.base, options.apiKey))
  const adapters = ReplicaAdapters.make(pool, connection, baseModel)

  /** One request, resumed after aborts and failovers, all on the model named when it started. */
  const generateOne = (request: GenerateRequest) =>
    Effect.gen(function* () {
      const name = adapters.model()
      const adapterVersion = adapters.versionOf(name)
      const startVersion = version
      const tokens: Array<number> = []
      const logprobs: Array<number> = []
      const retries: Array<string> = []
      let first: number | undefined
      let last: number | undefined
      let aborts = 0
      for (;;) {
        const remaining = request.sampling.maxNewTokens - tokens.length
        const choice = yield* onReplica(request.trajectoryId, retries, (replica) =>
          RemoteWire.complete(connection, replica.target.base, name, {
            promptIds: request.promptIds.concat(tokens),
            sampling: { ...request.sampling, maxNewTokens: remaining }
          })
        )
        if (tokens.length === 0 || first === undefined) first = choice.versionFirst
        // a loop, not push(...): a server's answer may be long enough to overflow the stack as call arguments
        for (const t of choice.tokens) tokens.push(t)
        for (const l of choice.logprobs) logprobs.push(l)
        last = choice.versionLast ?? last
        const finished = choice.finishReason !== "abort" ? choice.finishReason : undefined
        if (finished !== undefined || tokens.length >= request.sampling.maxNewTokens) {
          return {
            tokens,
            logprobs,
            finishReason: finished ?? "length",
            policyVersionFirst: adapterVersion ?? PolicyVersion.make(first ?? startVersion),
            policyVersionLast: adapterVersion ?? PolicyVersion.make(last ?? version),
            ...(retries.length === 0 ? {} : { retries })
          } satisfies GenerateResult
        }
        if (aborts++ >= maxResumes)
          return yield* RemoteWire.error("Overloaded", `aborted ${aborts} times by the server`)
      }
    })

  /** One chat turn: sampled again from its start after an abort or a failover (see the module header). */
  const chat = Effect.fn("RemoteEngine.chat")(function* (request: ChatRequest) {
    if (request.messages.length === 0) return yield* RemoteWire.error("BadResponse", "a chat request needs messages")
    const name = adapters.model()
    const adapterVersion = adapters.versionOf(name)
    const startVersion = version
    const retries: Array<string> = []
    for (let aborts = 0; ; aborts++) {
      const choice = yield* onReplica(request.trajectoryId, retries, (replica) =>
        RemoteWire.completeChat(connection, replica.target.base, name, request)
      )
      if (choice.finishReason !== "abort") {
        return {
          promptIds: choice.promptIds,
          tokens: choice.tokens,
          logprobs: choice.logprobs,
          finishReason: choice.finishReason,
          content: choice.content,
          toolCalls: choice.toolCalls,
          policyVersionFirst: adapterVersion ?? PolicyVersion.make(choice.versionFirst ?? startVersion),
          policyVersionLast: adapterVersion ?? PolicyVersion.make(choice.versionLast ?? version),
          ...(retries.length === 0 ? {} : { retries })
        } satisfies ChatResult
      }
      if (aborts >= maxResumes)
        return yield* RemoteWire.error("Overloaded", `aborted ${aborts + 1} times by the server`)
    }
  })

  const generate = Effect.fn("RemoteEngine.generate")(function* (requests: ReadonlyArray<GenerateRequest>) {
    const empty = requests.findIndex((r) => r.promptIds.length === 0)
    if (empty >= 0) return yield* RemoteWire.error("BadResponse", `request ${empty} has an empty prompt`)
    return yield* Effect.forEach(requests, generateOne, { concurrency: "unbounded" })
  })

  const updateWeights = Effect.fn("RemoteEngine.updateWeights")(function* (snapshot: WeightSnapshot.WeightSnapshot) {
    if (snapshot.version < version) {
      return yield* Effect.die(
        new Error(`RemoteEngine.updateWeights: version ${snapshot.version} is older than ${version}`)
      )
    }
    yield* syncing.withPermit(
      Effect.gen(function* () {
        const adapter = snapshot.adapter
        if (adapter !== undefined && options.lora !== undefined) {
          const timing = yield* adapters.syncAdapter(options.lora, { ...snapshot, adapter })
          options.onSynced?.(timing)
        }
        if (snapshot.names.length > 0) {
          const timing = yield* weights.syncFull(snapshot)
          options.onSynced?.(timing)
        }
        version = snapshot.version
        for (const r of replicas) if (r.up) r.version = version
      })
    )
  })

  /** A replica taken out that answers again: brought to the current weights, adapters and version, checked, let in. */
  const rejoin = (replica: ReplicaPool.Replica) =>
    syncing
      .withPermit(
        Effect.gen(function* () {
          // a server that kept running while out may still be paused by an update it missed the end of
          yield* WeightDialect.resume(weights.dialect, replica.target).pipe(withClient, Effect.ignore)
          yield* weights.sendWeights(replica, version)
          yield* adapters.reload(replica)
          if (weights.sent()) yield* weights.checkVersion(replica, version)
          replica.version = version
          replica.up = true
          replica.reason = undefined
          yield* Effect.logInfo(`replica ${replica.target.base} back in at version ${version}`)
        })
      )
      .pipe(Effect.catch((e: InferenceError) => Effect.logWarning(`replica ${replica.target.base}: ${e.message}`)))

  if (replicas.length > 1) {
    yield* Effect.forkScoped(
      Effect.forever(
        Effect.gen(function* () {
          yield* Effect.sleep(healthInterval)
          for (const replica of replicas) {
            if (replica.up) continue
            if (yield* WeightDialect.healthy(replica.target).pipe(withClient)) yield* rejoin(replica)
          }
        })
      )
    )
  }

  return InferenceEngine.of({
    generate,
    chat,
    updateWeights,
    pause: Effect.asVoid(notPaused.close),
    resume: Effect.asVoid(notPaused.open),
    version: Effect.sync(() => version)
  })
})

/** Over Node's fetch; probes replicas taken out for as long as the layer lives. */
export const layer = (options: RemoteEngineOptions): Layer.Layer<InferenceEngine, InferenceError> =>
  Layer.effect(InferenceEngine, make(options)).pipe(Layer.provide(FetchHttpClient.layer))
