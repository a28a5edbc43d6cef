import { Effect, Schema } from "effect"
import { ConfigError } from "../domain/Errors.ts"
import { NonNegativeInt, PositiveInt, SecretRef, withDefault } from "./Field.ts"
import type { EngineConfig } from "./GeneratorConfig.ts"

/**
 * Where `pipeline.rollouts: cluster` sends its groups: the Effect Cluster the trainer and its runners
 * (`runner --config FILE`) join. Every process of one run reads the same section.
 */
export const ClusterConfig = Schema.Struct({
  // memory: the trainer hosts the rollout entity itself (one machine, no runner processes, nothing to set up);
  // sql: runners in other processes or on other machines, sharded through Postgres (`sql_url`)
  storage: Schema.Literals(["memory", "sql"]).pipe(withDefault("memory")),
  sql_url: Schema.optionalKey(SecretRef), // { env: DATABASE_URL }: postgres://user@host:port/db, never inline
  host: Schema.NonEmptyString.pipe(withDefault("localhost")), // a runner's address as the other processes reach it
  port: PositiveInt.pipe(withDefault(34431)), // a runner's port (runner --port overrides it)
  listen_host: Schema.optionalKey(Schema.NonEmptyString), // the interface a runner binds (default: host)
  shards: PositiveInt.pipe(withDefault(60)), // shards the rollout entities spread over; the same in every process
  // how soon a dead runner's shards move to the survivors (its shard locks expire and the others take them)
  failover_seconds: PositiveInt.pipe(withDefault(5)),
  // a runner's copy of the trainer's file-synced weights (pipeline.weight_sync: file): default RUN_DIR/weights of
  // logging.run_dir, a shared directory across machines (runner --weights overrides it)
  weights_dir: Schema.optionalKey(Schema.NonEmptyString)
})
export type ClusterConfig = typeof ClusterConfig.Type

/** sync: generate a batch, train, repeat. async: K generation fibers feed the trainer through a bounded queue. */
export const PipelineConfig = Schema.Struct({
  mode: Schema.Literals(["sync", "async"]).pipe(withDefault("sync")), // sync or async, as above
  max_staleness_steps: NonNegativeInt.pipe(withDefault(1)), // a group trains at most this many versions late
  num_generation_workers: PositiveInt.pipe(withDefault(4)), // K
  // How each version's weights reach the engine. The rule: an engine kind takes its own sync (local: inprocess, the
  // default; worker: worker; remote: http) or `file`, which only local and remote take (see `weightSyncsFor`).
  weight_sync: Schema.Literals(["inprocess", "worker", "file", "http"]).pipe(withDefault("inprocess")),
  // how a worker or vllm/sglang engine holds generation while weights change: keep (requests in flight wait and
  // continue on the new weights), wait (the update waits for them to finish), abort (they stop and are sampled again
  // from their start)
  pause_mode: Schema.Literals(["abort", "keep", "wait"]).pipe(withDefault("keep")),
  // async: where each group is rolled out: by this process's Generator (local) or by a rollout runner of the cluster
  rollouts: Schema.Literals(["local", "cluster"]).pipe(withDefault("local")),
  cluster: ClusterConfig.pipe(withDefault({}))
})
export type PipelineConfig = typeof PipelineConfig.Type

type WeightSyncName = PipelineConfig["weight_sync"]
type EngineKind = EngineConfig["kind"]

/**
 * The sync each engine kind takes weights by itself: `inprocess` (a local engine samples from the trainer's own
 * variables: only the version moves), `worker` (a worker engine's SharedArrayBuffer board), `http` (upload to a
 * remote `serve`'s /v1/weights with generator.engine.weight_token); llamacpp re-exports the shared variables as GGUF at
 * each version (or, with `worker`, the copied snapshot's tensors).
 */
export const ownWeightSync = {
  local: "inprocess",
  worker: "worker",
  remote: "http",
  llamacpp: "inprocess"
} as const satisfies Record<EngineKind, WeightSyncName>

/**
 * The weight syncs an engine kind takes: its own, and `file` (each version written under RUN_DIR/weights, the engine
 * told only the version) unless it keeps a copy of the weights that files would not reach: a worker engine's copy
 * lives in its thread, so only local (the trainer's variables) and remote (a `serve --watch` loads the files) take it.
 */
export const weightSyncsFor = (kind: EngineKind): ReadonlyArray<WeightSyncName> =>
  kind === "worker"
    ? [ownWeightSync[kind]]
    : kind === "llamacpp"
      ? ["inprocess", "worker"]
      : [ownWeightSync[kind], "file"]

/** Fails with a ConfigError naming both keys and the valid values when `pipeline.weight_sync` does not fit the engine. */
export const checkWeightSync = (sync: WeightSyncName, kind: EngineKind): Effect.Effect<void, ConfigError> => {
  const valid = weightSyncsFor(kind)
  if (valid.includes(sync)) return Effect.void
  const rule = Object.entries(ownWeightSync)
    .map(([k, own]) => `${k}: ${own}`)
    .join(", ")
  return Effect.fail(
    new ConfigError({
      path: "pipeline.weight_sync",
      message:
        `pipeline.weight_sync ${sync} does not fit generator.engine.kind ${kind}: use ${valid.join(" or ")} ` +
        `(each engine kind takes its own sync, ${rule}; or file, for local and remote)`
    })
  )
}
