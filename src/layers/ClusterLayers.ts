/**
 * The composition root of the rollout cluster (`pipeline.rollouts: cluster`):
 *
 * - `trainer(c)`: the RolloutClient the async source sends its groups through. With `cluster.storage: memory` the
 *   trainer also hosts the Rollout entity over its own Generator and engine (one process, in-memory storage); with
 *   `sql` it joins the cluster in Postgres as a client only, and `runner` processes roll the groups out.
 * - `runner(c, options)`: a rollout runner: the policy (model.path | model.init, as the trainer starts), its
 *   tokenizer and engine, the environments with their MCP servers, the Generator, and the Rollout entity on a socket
 *   runner in the Postgres cluster. A local engine loads each version the trainer writes with
 *   `pipeline.weight_sync: file` from the weights directory (RUN_DIR/weights, shared across machines); a remote engine
 *   samples from a server the trainer updates itself.
 */
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { Config, Effect, Layer, Option, type Redacted } from "effect"
import * as TensorBackend from "../backend/TensorBackend.ts"
import * as ClusterNode from "../cluster/ClusterNode.ts"
import * as RolloutClient from "../cluster/RolloutClient.ts"
import * as RunnerHost from "../cluster/RunnerHost.ts"
import type { RunConfig } from "../config/RunConfig.ts"
import { ConfigError } from "../domain/Errors.ts"
import * as Generator from "../generator/Generator.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as FileWeightSync from "../sync/FileWeightSync.ts"
import * as AutoTokenizer from "../tokenizer/AutoTokenizer.ts"
import * as PolicyModel from "../trainer/PolicyModel.ts"
import * as RunLayers from "./RunLayers.ts"

/** `pipeline.cluster.sql_url`'s value (a secret), or a ConfigError naming the key and the variable. */
const sqlUrl = (c: RunConfig) =>
  Effect.gen(function* () {
    const ref = c.pipeline.cluster.sql_url
    if (ref === undefined) {
      return yield* new ConfigError({
        path: "pipeline.cluster.sql_url",
        message:
          "pipeline.cluster.storage sql needs pipeline.cluster.sql_url: { env: NAME } naming a variable that holds " +
          "postgres://user@host:port/database (scripts/local-postgres.sh starts one on this machine)"
      })
    }
    const value = yield* Config.option(Config.Redacted(ref.env)).pipe(
      Effect.mapError((e) => new ConfigError({ path: "pipeline.cluster.sql_url", message: e.message }))
    )
    if (Option.isNone(value)) {
      return yield* new ConfigError({
        path: "pipeline.cluster.sql_url",
        message: `pipeline.cluster.sql_url names $${ref.env}, which is not set: export ${ref.env}=postgres://user@host:port/database`
      })
    }
    return value.value as Redacted.Redacted<string>
  })

/** The rules a cluster run's config must meet, each a ConfigError naming its key. */
const check = (c: RunConfig) =>
  Effect.gen(function* () {
    if (c.pipeline.mode !== "async") {
      return yield* new ConfigError({
        path: "pipeline.rollouts",
        message: "pipeline.rollouts cluster needs pipeline.mode async (the cluster is a source of the async pipeline)"
      })
    }
    const engine = c.generator.engine.kind
    if (c.pipeline.cluster.storage === "sql" && engine !== "remote" && c.pipeline.weight_sync !== "file") {
      return yield* new ConfigError({
        path: "pipeline.weight_sync",
        message:
          `runners with generator.engine.kind ${engine} read the trainer's weights from files: set pipeline.weight_sync ` +
          "file (or give runners a remote engine the trainer updates)"
      })
    }
  })

/**
 * The trainer's RolloutClient (nothing when `pipeline.rollouts` is local); with Postgres storage its requests are
 * journalled in `runDir`, so a resumed trainer takes the groups its killed process had asked for.
 */
export const trainer = (
  c: RunConfig,
  runDir?: string
): Effect.Effect<Layer.Layer<RolloutClient.RolloutClient, never, Generator.Generator | InferenceEngine>, ConfigError> =>
  Effect.gen(function* () {
    // local rollouts: no client (Pipelines takes the RolloutClient only for pipeline.rollouts cluster)
    if (c.pipeline.rollouts === "local") return Layer.empty as Layer.Layer<RolloutClient.RolloutClient>
    yield* check(c)
    const cluster = c.pipeline.cluster
    if (cluster.storage === "memory") {
      const host = RunnerHost.layer({
        name: "trainer",
        capacity: c.generator.max_concurrent_groups,
        weightsFrom: "the trainer"
      }).pipe(Layer.provide(RunnerHost.attemptsMemory))
      return Layer.mergeAll(RolloutClient.layer(), host).pipe(Layer.provide(ClusterNode.memory(cluster)))
    }
    const url = yield* sqlUrl(c)
    return RolloutClient.layer(runDir).pipe(Layer.provide(ClusterNode.sqlClient(cluster, url)), Layer.orDie)
  })

export interface RunnerOptions {
  readonly host: string
  readonly port: number
  readonly listenHost?: string
  /** The directory the trainer's file sync writes (a local engine loads each version from it). */
  readonly weightsDir: string
}

/** A rollout runner: everything it hosts and its node in the Postgres cluster (runs until interrupted). */
export const runner = (c: RunConfig, options: RunnerOptions) =>
  Layer.unwrap(
    Effect.gen(function* () {
      if (c.pipeline.cluster.storage !== "sql") {
        return yield* new ConfigError({
          path: "pipeline.cluster.storage",
          message:
            "a runner joins a cluster in Postgres: set pipeline.cluster.storage sql and pipeline.cluster.sql_url (with storage memory the trainer rolls out its groups itself)"
        })
      }
      yield* check(c)
      const url = yield* sqlUrl(c)
      const backend = yield* TensorBackend.initialise(c.backend)
      const weightsDir = path.resolve(options.weightsDir)
      const policy = PolicyModel.layer(c.model)
      const tokenizer = AutoTokenizer.layer(c.tokenizer, c.model.path).pipe(Layer.provide(NodeServices.layer))
      const engine = RunLayers.inference(c, weightsDir)
      // a local engine follows the versions the trainer writes; a remote engine's server is updated by the trainer
      const follow =
        c.generator.engine.kind === "remote"
          ? Layer.empty
          : Layer.effectDiscard(
              Effect.gen(function* () {
                yield* FileWeightSync.watch(weightsDir, yield* InferenceEngine)
              })
            )
      const node = ClusterNode.sqlRunner(c.pipeline.cluster, url, {
        host: options.host,
        port: options.port,
        ...(options.listenHost === undefined ? {} : { listenHost: options.listenHost })
      })
      const host = RunnerHost.layer({
        name: `${options.host}:${options.port}`,
        capacity: c.generator.max_concurrent_groups,
        weightsFrom: c.generator.engine.kind === "remote" ? "the remote engine" : weightsDir
      }).pipe(Layer.provide(RunnerHost.attemptsSql))
      const rollouts = Layer.mergeAll(Generator.layer(RunLayers.generatorOptions(c)), follow).pipe(
        Layer.provideMerge(engine),
        Layer.provideMerge(RunLayers.environments(c))
      )
      return host.pipe(
        Layer.provide(rollouts),
        Layer.provide(Layer.orDie(node)),
        Layer.provide(tokenizer),
        Layer.provide(policy),
        Layer.provide(Layer.succeed(TensorBackend.TensorBackend, backend))
      )
    })
  )

/** Everything a training run needs (RunLayers.training), with the RolloutClient when `pipeline.rollouts` is cluster. */
export const training = (c: RunConfig, options: RunLayers.RunOptions) =>
  Layer.unwrap(
    Effect.map(trainer(c, options.runDir), (rollouts) => Layer.provideMerge(rollouts, RunLayers.training(c, options)))
  )
