/**
 * The tracking backends' layer (RunLayers.tracking) without a training run: the Prometheus endpoint serves what
 * Metrics records under the documented names, and its failures are ConfigErrors naming the key to change.
 */
import { mkdtempSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { LoggingConfig } from "../../src/config/StoreConfig.ts"
import * as RunLayers from "../../src/layers/RunLayers.ts"
import * as Metrics from "../../src/metrics/Metrics.ts"

const decode = Schema.decodeUnknownSync(LoggingConfig)

/** A port something listens on, for as long as the scope lasts. */
const busyPort = Effect.acquireRelease(
  Effect.promise(
    () =>
      new Promise<ReturnType<typeof createServer>>((resolve) => {
        const server = createServer()
        server.listen(0, "127.0.0.1", () => resolve(server))
      })
  ),
  (server) => Effect.promise(() => new Promise<void>((resolve) => server.close(() => resolve())))
).pipe(Effect.map((server) => (server.address() as { port: number }).port))

const freePort = Effect.scoped(busyPort)

describe("RunLayers.tracking", () => {
  it.live("serves every recorded metric at /metrics as <prefix>_<name> gauges with MetricKeys' meaning as HELP", () =>
    Effect.gen(function* () {
      const port = yield* freePort
      const logging = decode({ backends: ["jsonl", "prometheus"], prometheus: { port, prefix: "effect_rl" } })
      yield* Layer.build(RunLayers.tracking(logging))
      const metrics = yield* Metrics.make(mkdtempSync(join(tmpdir(), "effect-rl-tracking-")), {
        progress: false,
        gauges: true
      })
      yield* metrics.record("train", 3, {
        "loss/policy": 0.25,
        "eval/all/avg_score": 0.5,
        "reward/avg_raw_reward": NaN
      })
      const text = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text()))
      assert.include(text, "# TYPE effect_rl_loss_policy gauge")
      assert.include(text, "# HELP effect_rl_loss_policy policy-gradient loss (mean over mini-batches)")
      assert.match(text, /^effect_rl_loss_policy 0\.25$/m)
      assert.match(text, /^effect_rl_eval_all_avg_score 0\.5$/m)
      assert.match(text, /^effect_rl_trainer_step 3$/m)
      // a non-finite value is left out, not served as NaN
      assert.notMatch(text, /^effect_rl_reward_avg_raw_reward NaN$/m)
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped)
  )

  it.live("a busy logging.prometheus.port is a ConfigError naming the key and what to do", () =>
    Effect.gen(function* () {
      const port = yield* busyPort
      const logging = decode({ backends: ["jsonl", "prometheus"], prometheus: { port } })
      const error = yield* Effect.flip(Layer.build(RunLayers.tracking(logging)))
      assert.strictEqual(error._tag, "ConfigError")
      assert.strictEqual(error.path, "logging.prometheus.port")
      assert.include(error.message, `logging.prometheus.port ${port} on 127.0.0.1 is in use`)
    }).pipe(Effect.scoped)
  )

  it.live("an otlp header naming an unset environment variable is a ConfigError naming the header", () =>
    Effect.gen(function* () {
      const variable = "EFFECT_RL_TRACKING_TEST_UNSET"
      assert.isUndefined(process.env[variable])
      const logging = decode({ backends: ["jsonl", "otlp"], otlp: { headers: { authorization: { env: variable } } } })
      const error = yield* Effect.flip(Layer.build(RunLayers.tracking(logging)))
      assert.strictEqual(error.path, "logging.otlp.headers.authorization")
      assert.include(error.message, variable)
    }).pipe(Effect.scoped)
  )

  it("backends without jsonl is a decoding error: metrics.jsonl is the run's own record", () => {
    assert.throws(() => decode({ backends: ["prometheus"] }), /backends must include jsonl/)
    assert.deepStrictEqual(decode({}).backends, ["jsonl"])
  })
})
