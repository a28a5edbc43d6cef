/**
 * This process's node of the rollout cluster (Effect Cluster), from `pipeline.cluster`:
 *
 * - `sql` storage: runners register in Postgres and take shards there (SqlRunnerStorage), requests are persisted there
 *   (SqlMessageStorage) and travel over sockets (NodeClusterSocket). The trainer joins as a client only (it hosts no
 *   entity); each `runner` process listens on `host:port`. A runner that stops answering loses its shards once its
 *   shard locks expire (`failover_seconds`) and the survivors process its unfinished requests.
 * - `memory` storage: one in-process runner with in-memory storage: the trainer hosts the rollout entity itself.
 */
import { NodeClusterSocket } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Duration, Layer, Option, type Redacted } from "effect"
import {
  MessageStorage,
  RunnerAddress,
  RunnerHealth,
  RunnerStorage,
  Runners,
  Sharding,
  ShardingConfig
} from "effect/cluster"
import type { ClusterConfig } from "../config/PipelineConfig.ts"

/** Sharding settings every process of a run shares (shards, failover timings), plus this runner's address. */
export const shardingConfig = (
  c: ClusterConfig,
  address?: { readonly host: string; readonly port: number; readonly listenHost?: string }
): Partial<ShardingConfig.ShardingConfig["Service"]> => {
  const failover = Duration.seconds(c.failover_seconds)
  const refresh = Duration.millis(Math.max(1000, (c.failover_seconds * 1000) / 3))
  return {
    shardsPerGroup: c.shards,
    shardLockExpiration: failover,
    shardLockRefreshInterval: refresh,
    refreshAssignmentsInterval: refresh,
    runnerHealthCheckInterval: refresh,
    entityMessagePollInterval: refresh,
    entityReplyPollInterval: Duration.millis(100),
    entityMaxIdleTime: Duration.seconds(30),
    ...(address === undefined
      ? {}
      : {
          runnerAddress: Option.some(RunnerAddress.make(address.host, address.port)),
          ...(address.listenHost === undefined
            ? {}
            : { runnerListenAddress: Option.some(RunnerAddress.make(address.listenHost, address.port)) })
        })
  }
}

/** Postgres for the cluster's storage (the connection string is a secret: it never reaches a log). */
export const postgres = (url: Redacted.Redacted) => PgClient.layer({ url, applicationName: "effect-rl-cluster" })

/** A client-only node over SQL storage (the trainer): sends requests to the runners, hosts no entity. */
export const sqlClient = (c: ClusterConfig, url: Redacted.Redacted) =>
  NodeClusterSocket.layer({ clientOnly: true, shardingConfig: shardingConfig(c) }).pipe(Layer.provide(postgres(url)))

/** A runner over SQL storage, listening on `address`; its SqlClient is shared with what it hosts (Attempts). */
export const sqlRunner = (
  c: ClusterConfig,
  url: Redacted.Redacted,
  address: { readonly host: string; readonly port: number; readonly listenHost?: string }
) => NodeClusterSocket.layer({ shardingConfig: shardingConfig(c, address) }).pipe(Layer.provideMerge(postgres(url)))

/** One in-process runner with in-memory storage (the trainer hosts the rollout entity itself). */
export const memory = (c: ClusterConfig) =>
  Sharding.layer.pipe(
    Layer.provideMerge(Runners.layerNoop),
    Layer.provideMerge(MessageStorage.layerMemory),
    Layer.provide([RunnerStorage.layerMemory, RunnerHealth.layerNoop]),
    Layer.provide(ShardingConfig.layer(shardingConfig(c)))
  )
