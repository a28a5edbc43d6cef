/**
 * The LoRA adapters a RemoteEngine loads on its replicas (`lora`), and the model its new calls name.
 *
 * A snapshot carrying an adapter is written as a PEFT directory `<lora.dir>/v<version, 6 digits>` (which the servers
 * must be able to read), loaded on every replica with vLLM's runtime LoRA API (`POST /v1/load_lora_adapter
 * {lora_name: "<prefix>-v<version>", lora_path}`; our `serve --enable-lora` or vLLM with `--enable-lora` and
 * `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), and calls from then on name it as their `model`; calls in flight keep the
 * adapter they started with. Then every adapter but the newest `lora.keep` is unloaded (`/v1/unload_lora_adapter`)
 * and its directory deleted. A call's policy versions are its adapter's version: exact, since that adapter sampled
 * every token of it. Re-publishing a version loads it again in place (`load_inplace`).
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Clock, Effect } from "effect"
import { HttpClientRequest } from "effect/http"
import type * as PolicyVersion from "../domain/PolicyVersion.ts"
import type * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as Lora from "../model/Lora.ts"
import * as RemoteWire from "./RemoteWire.ts"
import type * as ReplicaPool from "./ReplicaPool.ts"

/** Sync LoRA adapters through the server's runtime LoRA API (see the module header). */
export interface LoraOptions {
  /** Where adapter versions are written; the server reads them from the same path. */
  readonly dir: string
  /** Adapters kept loaded (≥ 1): the newest `keep` versions. */
  readonly keep: number
  /** Adapters are named `<prefix>-v<version>`; default "policy". */
  readonly prefix?: string
}

export const make = (pool: ReplicaPool.ReplicaPool, connection: RemoteWire.Connection, baseModel: string) => {
  const { client, apiKey } = connection
  const retry = RemoteWire.retry(connection)
  const { onEveryReplica } = pool
  /** The model new calls name: the base, or the newest adapter loaded. */
  let model = baseModel
  /** The adapters loaded by this engine, oldest first. */
  const adapters: Array<{
    readonly name: string
    readonly version: PolicyVersion.PolicyVersion
    readonly dir: string
  }> = []

  /** POST a JSON body to one of a replica's LoRA routes; the status and the body's text. */
  const postLora = (replica: ReplicaPool.Replica, route: string, body: unknown) =>
    retry(
      Effect.gen(function* () {
        const base = replica.target.base
        const http = HttpClientRequest.post(`${base}${route}`).pipe(
          apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(apiKey),
          HttpClientRequest.bodyJsonUnsafe(body)
        )
        const response = yield* client.execute(http)
        const text = yield* response.text
        if (response.status === 429 || response.status >= 500)
          return yield* RemoteWire.statusError(response.status, text)
        return { status: response.status, text }
      }).pipe(
        Effect.catchTag("HttpClientError", (e) =>
          Effect.fail(RemoteWire.error("Unreachable", `${replica.target.base}${route}: ${e.message}`))
        )
      )
    )

  /** Load adapter `name` from `dir` on one replica (in place when `republished`, or when it kept the name). */
  const loadAdapter = (replica: ReplicaPool.Replica, name: string, dir: string, republished: boolean) =>
    Effect.gen(function* () {
      const load = (inplace: boolean) =>
        postLora(replica, "/v1/load_lora_adapter", {
          lora_name: name,
          lora_path: dir,
          ...(inplace ? { load_inplace: true } : {})
        })
      let loaded = yield* load(republished)
      // a server that kept this name from an earlier run (or from before it was taken out): replace it
      if (loaded.status === 400 && !republished && loaded.text.includes("has already been loaded"))
        loaded = yield* load(true)
      if (loaded.status !== 200) {
        return yield* RemoteWire.error(
          "BadResponse",
          `loading adapter ${name}: ${RemoteWire.statusError(loaded.status, loaded.text).message}`
        )
      }
    })

  /**
   * Load the snapshot's adapter as `<prefix>-v<version>` everywhere, name it in new calls, keep the newest `keep`;
   * the bytes written and the wall time.
   */
  const syncAdapter = (
    lora: LoraOptions,
    snapshot: WeightSnapshot.WeightSnapshot & {
      readonly adapter: NonNullable<WeightSnapshot.WeightSnapshot["adapter"]>
    }
  ) =>
    Effect.gen(function* () {
      const startedAt = yield* Clock.currentTimeMillis
      const name = `${lora.prefix ?? "policy"}-v${snapshot.version}`
      const dir = path.resolve(lora.dir, `v${String(snapshot.version).padStart(6, "0")}`)
      const bytes = yield* Effect.tryPromise({
        try: () => Lora.writeDir(dir, snapshot.adapter),
        catch: (cause) =>
          RemoteWire.error(
            "Internal",
            `cannot write adapter v${snapshot.version} to ${dir}: ${(cause as Error).message}`
          )
      })
      const republished = adapters.some((a) => a.name === name)
      yield* onEveryReplica((replica) => loadAdapter(replica, name, dir, republished))
      model = name
      if (!republished) adapters.push({ name, version: snapshot.version, dir })
      while (adapters.length > Math.max(1, lora.keep)) {
        const old = adapters.shift()!
        yield* onEveryReplica((replica) =>
          Effect.gen(function* () {
            const unloaded = yield* postLora(replica, "/v1/unload_lora_adapter", { lora_name: old.name })
            // 404: the server no longer has it (restarted), which is what unloading wants
            if (unloaded.status !== 200 && unloaded.status !== 404) {
              return yield* RemoteWire.error(
                "BadResponse",
                `unloading adapter ${old.name}: ${RemoteWire.statusError(unloaded.status, unloaded.text).message}`
              )
            }
          })
        )
        yield* Effect.promise(() => fs.rm(old.dir, { recursive: true, force: true }))
      }
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      return { version: snapshot.version, bytes, seconds }
    })

  return {
    /** The model new calls name: the base, or the newest adapter loaded. */
    model: () => model,
    /** The version of adapter `name`, if it is one this engine loaded. */
    versionOf: (name: string) => adapters.find((a) => a.name === name)?.version,
    syncAdapter,
    /** Load every adapter this engine has loaded on `replica` (one coming back). */
    reload: (replica: ReplicaPool.Replica) =>
      Effect.gen(function* () {
        for (const a of adapters) yield* loadAdapter(replica, a.name, a.dir, false)
      })
  }
}
