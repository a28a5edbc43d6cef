/**
 * A trainer fault before any update of its step (here injected around the real PolicyTrainer: the second step dies,
 * as the wasm heap does when it runs out of memory): the loop fails with a TrainerFault, checkpoints the step before
 * with the failed step's groups in flight, and `train --resume latest` trains exactly those groups — they are not
 * generated again.
 */
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import * as RunLayers from "../../src/layers/RunLayers.ts"
import { readRows } from "../../src/cli/TrainCommand.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import * as Pipelines from "../../src/pipeline/Pipelines.ts"
import * as Rollouts from "../../src/pipeline/Rollouts.ts"
import { TrainerFault } from "../../src/pipeline/TrainingLoop.ts"
import { Trainer } from "../../src/trainer/Trainer.ts"
import * as Cli from "../fixtures/Cli.ts"

const overrides = ["pipeline.mode=sync", "data.max_prompts=8", "checkpoint.interval=0", "logging.progress=false"]

/** The real trainer, except that its second step dies before doing anything. */
const failingSecondStep = Layer.effect(
  Trainer,
  Effect.gen(function* () {
    const real = yield* Trainer
    let steps = 0
    return Trainer.of({
      ...real,
      step: (groups) =>
        ++steps === 2 ? Effect.die(new Error("memory access out of bounds (injected)")) : real.step(groups)
    })
  })
)

describe("trainer fault", () => {
  it.live(
    "keeps the failed step's groups in a checkpoint, and a resume trains them without generating again",
    () =>
      Effect.gen(function* () {
        const runDir = join(mkdtempSync(join(tmpdir(), "effect-rl-fault-")), "run")
        const config = yield* RunConfigLoader.load("configs/tiny-async.yaml", overrides)
        const train = yield* readRows(config.data.train, config.data.max_prompts)
        const exit = yield* Pipelines.train({ config, runDir, train, val: [] }).pipe(
          Effect.provide(
            failingSecondStep.pipe(Layer.provideMerge(RunLayers.training(config, { runDir, trainRows: train.length })))
          ),
          Effect.exit
        )
        assert.isTrue(Exit.isFailure(exit))
        const error = Exit.isFailure(exit) ? exit.cause.reasons.find((r) => r._tag === "Fail") : undefined
        const fault = (error as { error?: unknown } | undefined)?.error
        assert.instanceOf(fault, TrainerFault)
        const f = fault as TrainerFault
        assert.strictEqual(f.step, 2)
        assert.include(f.message, "memory access out of bounds (injected)")
        assert.strictEqual(f.kept, join(runDir, "checkpoints", "step-1"))

        const inflight = readFileSync(join(runDir, "checkpoints", "step-1", Rollouts.inflightFile), "utf8")
          .split("\n")
          .filter((l) => l !== "")
          .map((l) => (JSON.parse(l) as { cursor: number }).cursor)
        assert.deepStrictEqual(inflight, [2, 3])

        const resumed = Cli.run(
          ["train", "--config", "configs/tiny-async.yaml", "--run-dir", runDir, ...overrides, "--resume", "latest"],
          { timeoutMs: 240_000 }
        )
        assert.strictEqual(resumed.code, 0, resumed.stderr.slice(-3000))
        assert.include(resumed.stderr, "2 in-flight groups restored")
        assert.strictEqual(JSON.parse(resumed.lastLine).steps, 4)
        const attempts = readFileSync(join(runDir, "episodes.jsonl"), "utf8")
          .split("\n")
          .filter((l) => l !== "")
          .map((l) => (JSON.parse(l) as { cursor: number }).cursor)
        assert.deepStrictEqual(
          attempts.filter((c) => c === 2 || c === 3),
          [2, 3],
          "the failed step's groups were trained as kept, not generated again"
        )
      }).pipe(Effect.provide(NodeServices.layer)),
    300_000
  )
})
