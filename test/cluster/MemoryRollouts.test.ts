/**
 * `pipeline.rollouts: cluster` with `pipeline.cluster.storage: memory`: the trainer hosts the Rollout entity itself
 * (one process, nothing to set up). Every group goes through the cluster's entity and comes back token-exact, so
 * with max_staleness_steps 0 the run trains bit-identical weights to local async rollouts; and the config rules that
 * a cluster run must meet are named errors.
 */
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import * as ClusterLayers from "../../src/layers/ClusterLayers.ts"
import * as Cli from "../fixtures/Cli.ts"

const tmp = mkdtempSync(join(tmpdir(), "effect-rl-cluster-memory-"))
const config = "configs/tiny-async.yaml"

const train = (runDir: string, ...overrides: Array<string>) =>
  Cli.run(["train", "--config", config, "--run-dir", runDir, "logging.progress=false", ...overrides], {
    timeoutMs: 240_000
  })

/** episodes.jsonl without wall times: what was sampled, token for token. */
const sampled = (runDir: string) =>
  readFileSync(join(runDir, "episodes.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.stringify(JSON.parse(l), (k, v) => (k === "llmMs" || k === "envMs" ? 0 : v)))

describe("pipeline.rollouts cluster, storage memory", () => {
  it("trains bit-identical weights to local async rollouts (max_staleness_steps 0)", () => {
    const [local, cluster] = ["local", "cluster"].map((rollouts) => {
      const runDir = join(tmp, rollouts)
      const result = train(
        runDir,
        `pipeline.rollouts=${rollouts}`,
        "pipeline.max_staleness_steps=0",
        "data.max_prompts=4",
        "checkpoint.interval=1"
      )
      assert.strictEqual(result.code, 0, result.stderr)
      assert.strictEqual(JSON.parse(result.lastLine).steps, 2)
      return runDir
    }) as [string, string]
    const weights = (runDir: string, step: number) =>
      readFileSync(join(runDir, "checkpoints", `step-${step}`, "model.safetensors"))
    assert.isFalse(weights(local, 1).equals(weights(local, 2)), "the weights must move, or equality proves nothing")
    assert.isTrue(weights(cluster, 2).equals(weights(local, 2)), "final weights differ between cluster and local")
    assert.deepStrictEqual(sampled(cluster), sampled(local))
    assert.strictEqual(
      readFileSync(join(cluster, "consumed.jsonl"), "utf8"),
      readFileSync(join(local, "consumed.jsonl"), "utf8")
    )
  })

  it.effect("names the keys a cluster run needs", () =>
    Effect.gen(function* () {
      const failure = (...overrides: Array<string>) =>
        RunConfigLoader.load(config, ["pipeline.rollouts=cluster", ...overrides]).pipe(
          Effect.flatMap(ClusterLayers.trainer),
          Effect.flip,
          Effect.map((e) => e.message),
          Effect.provide(NodeServices.layer)
        )
      assert.include(yield* failure("pipeline.mode=sync"), "pipeline.rollouts cluster needs pipeline.mode async")
      assert.include(yield* failure("pipeline.cluster.storage=sql"), "set pipeline.weight_sync file")
      assert.include(
        yield* failure("pipeline.cluster.storage=sql", "pipeline.weight_sync=file"),
        "pipeline.cluster.storage sql needs pipeline.cluster.sql_url"
      )
      const unset = yield* failure(
        "pipeline.cluster.storage=sql",
        "pipeline.weight_sync=file",
        "pipeline.cluster.sql_url.env=EFFECT_RL_TEST_UNSET_URL"
      )
      assert.include(unset, "$EFFECT_RL_TEST_UNSET_URL, which is not set")
    })
  )
})
