/**
 * Async LoRA RL with `serve` as a remote engine: the trainer (a child process, `train` as users run it) syncs each
 * version's adapter to `serve` through vLLM's runtime LoRA API, and every turn it records was sampled by the adapter
 * of the version the turn names — checked by recomputing the turn's log-probs under the base with that version's
 * adapter (the run's checkpoint of that step) — with staleness at most `max_staleness_steps`.
 */
import * as fs from "node:fs/promises"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import type { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as Lora from "../../src/model/Lora.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as TensorFile from "../../src/native/TensorFile.ts"
import * as Cli from "../fixtures/Cli.ts"

const base = "data/quickstart/policy"
const temperature = 0.7 // configs/quickstart-lora.yaml's sampling temperature
const staleness = 1

/** `serve` as users run it (a child process, wasm backend), on a free port; killed with the scope. */
const serve = Effect.acquireRelease(
  Effect.promise(() => Cli.serve(["--model", base, "--port", "0", "--enable-lora", "--backend", "wasm"])),
  ({ child }) => Effect.sync(() => child.kill("SIGKILL"))
)

const train = (args: ReadonlyArray<string>) => Cli.runAsync(["train", ...args])

const readJsonl = async (file: string): Promise<Array<Record<string, unknown>>> =>
  (await fs.readFile(file, "utf8"))
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Record<string, unknown>)

describe("async LoRA RL on a remote serve", () => {
  it.live(
    "samples every turn with the adapter version it records, within the staleness bound",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          // the same backend and kernels as the server (configs/quickstart-lora.yaml): the same arithmetic
          yield* TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "native" })
          const { url } = yield* serve
          const runDir = yield* Effect.promise(() => fs.mkdtemp(path.join(tmpdir(), "effect-rl-lora-remote-")))
          const run = yield* Effect.promise(() =>
            train([
              "--config",
              "configs/quickstart-lora.yaml",
              "--run-dir",
              runDir,
              "generator.engine.kind=remote",
              `generator.engine.url=${url}`,
              "pipeline.weight_sync=http",
              `pipeline.max_staleness_steps=${staleness}`,
              "generator.n_samples_per_prompt=8",
              "generator.max_concurrent_groups=4",
              "trainer.train_batch_size=2",
              "trainer.policy_mini_batch_size=2",
              "trainer.update_epochs_per_batch=1", // at most one version per step: each is a checkpoint's
              "trainer.max_steps=6",
              "trainer.eval_before_train=false",
              "trainer.eval_interval=0",
              "checkpoint.interval=1",
              "checkpoint.keep_n=10",
              "data.max_eval_prompts=2",
              "logging.report=false"
            ])
          )
          assert.strictEqual(run.code, 0, run.stderr.slice(-3000))

          const metrics = (yield* Effect.promise(() => readJsonl(path.join(runDir, "metrics.jsonl")))).filter(
            (m) => m["event"] === "train"
          )
          assert.strictEqual(metrics.length, 6)
          for (const m of metrics) {
            assert.isAtMost(m["async/staleness_max"] as number, staleness)
            assert.isAbove(m["sync/bytes"] as number, 0, "each version's adapter crossed to the server")
          }
          // what crossed per step is the adapter (its PEFT files), not the model
          const adapterBytes = (yield* Effect.promise(() =>
            fs.stat(path.join(runDir, "checkpoints", "step-1", "adapter", "adapter_model.safetensors"))
          )).size
          const modelBytes = (yield* Effect.promise(() => fs.stat(path.join(base, "model.safetensors")))).size
          assert.isBelow(metrics[0]!["sync/bytes"] as number, modelBytes / 2)
          assert.isAtMost(metrics[0]!["sync/bytes"] as number, adapterBytes)

          // every turn against the base + its version's adapter (version 0: the base alone)
          const model = yield* Effect.acquireRelease(
            Effect.promise(() => TensorFile.load(base).then((l) => l.model)),
            (m) => Effect.sync(() => Transformer.dispose(m))
          )
          const groups = (yield* Effect.promise(() =>
            readJsonl(path.join(runDir, "episodes.jsonl"))
          )) as unknown as Array<TrajectoryGroup>
          // the adapter of each version: the checkpoint of the step that ended on it (a step whose groups were all
          // filtered out applies no update, so versions and steps differ)
          const adapterOf = new Map<number, string>()
          for (const step of yield* Effect.promise(() => fs.readdir(path.join(runDir, "checkpoints")))) {
            if (!step.startsWith("step-")) continue
            const dir = path.join(runDir, "checkpoints", step)
            const state = JSON.parse(
              yield* Effect.promise(() => fs.readFile(path.join(dir, "trainer_state.json"), "utf8"))
            )
            adapterOf.set(state.version as number, path.join(dir, "adapter"))
          }
          const checked = new Map<number, number>() // version → its turns
          let turns = 0
          let worst = 0
          for (const g of groups) {
            for (const t of g.trajectories) {
              for (const turn of t.turns) {
                if (turn.end === turn.start) continue
                assert.strictEqual(turn.policyVersionFirst, turn.policyVersionLast, "one adapter per request")
                const v = turn.policyVersionFirst
                checked.set(v, (checked.get(v) ?? 0) + 1)
                if (checked.get(v)! > 12) continue // a dozen turns per version are enough (each is a forward pass)
                const adapter = adapterOf.get(v)
                if (v === 0) Lora.detach(model)
                else if (adapter === undefined) assert.fail(`no checkpoint holds version ${v}`)
                else yield* Effect.promise(() => Lora.load(model, adapter))
                const ids = [...t.promptIds, ...t.responseIds.slice(0, turn.end)]
                const { logprobs } = LogProbs.ofSequences(model, { ids: [ids] }, { temperature })
                const row = (yield* Effect.promise(() => logprobs.array()))[0]!
                logprobs.dispose()
                for (let k = turn.start; k < turn.end; k++) {
                  worst = Math.max(worst, Math.abs(row[t.promptIds.length + k]! - t.rolloutLogprobs[k]!))
                }
                turns++
              }
            }
          }
          assert.isAbove(turns, 8)
          assert.isAbove(checked.size, 1, `turns sampled by one version only: ${[...checked.keys()]}`)
          assert.isBelow(worst, 2e-4, `largest |Δ log p| over ${turns} turns`)
        })
      ),
    600_000
  )
})
