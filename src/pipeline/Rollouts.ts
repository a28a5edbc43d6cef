/**
 * What the two rollout sources (SyncSource, AsyncSource) share: the run's prompt order and step count, the groups a
 * checkpoint holds in flight (`inflight.jsonl`: generated, not yet trained), and the source's part of a checkpoint.
 *
 * A resumed run trains a checkpoint's in-flight groups first and generates only the cursors missing beyond the
 * checkpoint. Groups generated after the last checkpoint and lost in a crash are generated again, so `episodes.jsonl`
 * may hold two attempts of a prompt; only the later one is trained on, and `consumed.jsonl` says which steps trained
 * which cursors, so replay (ReplaySource.recorded) trains exactly the run's batches.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect, Schema } from "effect"
import type { RunConfig } from "../config/RunConfig.ts"
import { ConfigError } from "../domain/Errors.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import { TrajectoryGroup } from "../domain/Trajectory.ts"
import * as PromptOrder from "./PromptOrder.ts"
import * as TrainingLoop from "./TrainingLoop.ts"

export const inflightFile = "inflight.jsonl"

/** What a rollout checkpoint adds to the trainer state (`trainer_state.json` → `data`). */
export interface CheckpointData {
  readonly cursor: number // prompts [0, cursor) of the run's order have been trained on
  readonly consumed?: ReadonlyArray<string> // their uids, in cursor order
  readonly stepVersions?: ReadonlyArray<number> // [s] = policy version published after step s (0: the start)
  readonly inflight?: number // groups in inflight.jsonl
}

/** The rollout sources' slice of the run config (`settingsOf`). */
export interface Settings {
  readonly steps: TrainingLoop.StepCount // trainer.{epochs, train_batch_size, max_steps}
  readonly orderSeed: number // trainer.seed: the prompt order
  readonly shuffle: boolean // data.shuffle
  readonly samplingSeed: number // generator.seed: the base of every group's sampling seed
  readonly maxConcurrentGroups: number // generator.max_concurrent_groups (sync)
  readonly recordEpisodes: boolean // logging.record_episodes
  readonly maxStaleness: number // pipeline.max_staleness_steps (async)
  readonly workers: number // pipeline.num_generation_workers (async)
  readonly engineSharesWeights: boolean // generator.engine.kind local: it samples from the trainer's variables
}

export const settingsOf = (c: RunConfig): Settings => ({
  steps: c.trainer,
  orderSeed: c.trainer.seed,
  shuffle: c.data.shuffle,
  samplingSeed: c.generator.seed,
  maxConcurrentGroups: c.generator.max_concurrent_groups,
  recordEpisodes: c.logging.record_episodes,
  maxStaleness: c.pipeline.max_staleness_steps,
  workers: c.pipeline.num_generation_workers,
  engineSharesWeights: c.generator.engine.kind === "local"
})

/** The inputs both rollout sources take. */
export interface Inputs {
  readonly settings: Settings
  readonly train: ReadonlyArray<PromptRow>
}

const encodeGroup = Schema.encodeSync(Schema.fromJsonString(TrajectoryGroup))
const decodeGroup = Schema.decodeUnknownSync(Schema.fromJsonString(TrajectoryGroup))

const readInflight = (dir: string) =>
  Effect.tryPromise(async () => {
    const text = await fs.readFile(path.join(dir, inflightFile), "utf8").catch(() => "")
    return text
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map((l) => decodeGroup(l))
  }).pipe(Effect.orDie)

/** The run's prompt order, its steps, and the in-flight groups restored from the checkpoint it starts from. */
export const prepare = Effect.fn("Rollouts.prepare")(function* (inputs: Inputs, start: TrainingLoop.Start) {
  const { settings, train } = inputs
  const B = settings.steps.train_batch_size
  const steps = TrainingLoop.totalSteps(settings.steps, train.length)
  if (steps < 1) {
    return yield* new ConfigError({
      path: "trainer.train_batch_size",
      message: `${train.length} training prompts × ${settings.steps.epochs} epochs cannot fill one batch of ${B}`
    }).pipe(Effect.orDie)
  }
  const order = PromptOrder.make(train, settings.steps.epochs, settings.orderSeed, settings.shuffle)
  const limit = steps * B // cursors [0, limit) are trained on; a partial last batch is not
  const pending = new Map<number, TrajectoryGroup>() // generated, not trained
  if (start.checkpoint !== undefined) {
    for (const g of yield* readInflight(start.checkpoint.dir)) {
      if (g.cursor >= (start.firstStep - 1) * B && g.cursor < limit) pending.set(g.cursor, g)
    }
    if (pending.size > 0)
      yield* Effect.logInfo(`${pending.size} in-flight groups restored from ${start.checkpoint.dir}`)
  }
  return { B, steps, order, limit, pending }
})

/** A rollout source's part of a checkpoint at `step`: the cursor, the trained uids and the in-flight groups. */
export const checkpointPart = (
  step: number,
  B: number,
  order: PromptOrder.PromptOrder,
  inflight: ReadonlyArray<TrajectoryGroup>,
  extra: Partial<CheckpointData> = {}
): TrainingLoop.CheckpointPart => {
  const sorted = [...inflight].sort((a, b) => a.cursor - b.cursor)
  const data: CheckpointData = {
    cursor: step * B,
    consumed: order.slice(0, step * B).map((p) => p.row.uid ?? `cursor-${p.cursor}`),
    inflight: sorted.length,
    ...extra
  }
  return {
    data: data as unknown as Record<string, unknown>,
    files: { [inflightFile]: sorted.map((g) => `${encodeGroup(g)}\n`).join("") },
    inflight: sorted.length
  }
}
