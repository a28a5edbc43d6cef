/**
 * `runner --config FILE [--host H] [--port N] [--listen-host H] [--weights DIR] [key.path=value ...]`: a rollout runner
 * of the cluster a `train` with `pipeline.rollouts: cluster` and `pipeline.cluster.storage: sql` sends its groups to.
 * It reads the same config as the trainer (model, tokenizer, generator, environment, pipeline.cluster), registers in
 * the Postgres cluster and rolls out the groups of its shards until SIGINT/SIGTERM. Once registered its last stdout
 * line is `{"event":"runner","address":"HOST:PORT","pid":…}`.
 */
import { Console, Effect, Layer, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as ClusterLayers from "../layers/ClusterLayers.ts"
import * as RunFlags from "./RunFlags.ts"

export const command = Command.make(
  "runner",
  {
    config: RunFlags.config,
    host: Flag.String("host").pipe(
      Flag.withDescription(
        "This runner's address as the trainer and other runners reach it (default pipeline.cluster.host)"
      ),
      Flag.optional
    ),
    port: Flag.Int("port").pipe(
      Flag.withDescription("The port it listens on (default pipeline.cluster.port)"),
      Flag.optional
    ),
    listenHost: Flag.String("listen-host").pipe(
      Flag.withDescription("The interface it binds (default pipeline.cluster.listen_host, else --host)"),
      Flag.optional
    ),
    weights: Flag.String("weights").pipe(
      Flag.withDescription(
        "The directory the trainer's pipeline.weight_sync file writes (default pipeline.cluster.weights_dir, else RUN_DIR/weights of logging.run_dir)"
      ),
      Flag.optional
    ),
    overrides: RunFlags.overrides
  },
  Effect.fn("cli.runner")(function* ({ config: file, host, port, listenHost, weights, overrides }) {
    const config = yield* RunFlags.load(file, overrides)
    const cluster = config.pipeline.cluster
    const address = {
      host: Option.getOrElse(host, () => cluster.host),
      port: Option.getOrElse(port, () => cluster.port)
    }
    const listen = Option.getOrUndefined(listenHost) ?? cluster.listen_host
    const weightsDir = Option.getOrUndefined(weights) ?? cluster.weights_dir ?? `${config.logging.run_dir}/weights`
    const ready = Layer.effectDiscard(
      Console.log(JSON.stringify({ event: "runner", address: `${address.host}:${address.port}`, pid: process.pid }))
    )
    yield* Effect.logInfo(`runner ${address.host}:${address.port}: weights from ${weightsDir}`)
    return yield* Layer.launch(
      ready.pipe(
        Layer.provide(
          ClusterLayers.runner(config, {
            ...address,
            ...(listen === undefined ? {} : { listenHost: listen }),
            weightsDir
          })
        )
      )
    )
  })
).pipe(
  Command.withDescription(
    "Roll out a cluster run's groups (pipeline.rollouts: cluster, storage sql): agent loop, environments and engine"
  ),
  Command.withExamples(({ commandPath }) => [
    {
      command: `DATABASE_URL=postgres://postgres@db:5432/postgres ${commandPath.join(" ")} --config configs/tiny-cluster.yaml --host 10.0.0.7 --port 34431 --weights /shared/runs/tiny-cluster/weights`,
      description:
        "a runner on this host, reachable at 10.0.0.7:34431, loading the trainer's weights from a shared directory"
    }
  ])
)
