/**
 * The Trainer service: one training step over a batch of trajectory groups, and the policy version it produced.
 * `version` counts optimizer steps applied (a training step may apply several: PPO epochs × mini-batches); it only
 * grows. Implementations: PolicyTrainer (GRPO/PPO family); SftTrainer is a separate command.
 */
import { Context, type Effect } from "effect"
import type { PolicyVersion } from "../domain/PolicyVersion.ts"
import type { TrajectoryGroup } from "../domain/Trajectory.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"
import type * as ExperienceReplay from "./ExperienceReplay.ts"

export interface StepResult {
  readonly step: number // training steps done, this one included
  readonly version: PolicyVersion
  readonly metrics: Readonly<Record<string, number>> // SkyRL names: loss/policy, policy/approx_kl, ...
}

/** What a checkpoint needs to resume the trainer exactly. */
export interface TrainerState {
  readonly step: number
  readonly version: number
  readonly optimizer: {
    readonly step: number
    readonly names: ReadonlyArray<string>
    readonly m: ReadonlyArray<Float32Array>
    readonly v: ReadonlyArray<Float32Array>
  }
  readonly klCoef: number
  /** ExperienceReplay's buffer, oldest entry first; absent when replay is off */
  readonly replay?: ReadonlyArray<ExperienceReplay.Entry>
}

export class Trainer extends Context.Service<
  Trainer,
  {
    /** Train on `groups`. A non-finite loss or gradient is a defect (Effect.die with the step and the metric). */
    readonly step: (groups: ReadonlyArray<TrajectoryGroup>) => Effect.Effect<StepResult>
    readonly version: Effect.Effect<PolicyVersion>
    /** The current weights as plain data, for weight sync. */
    readonly snapshot: Effect.Effect<WeightSnapshot>
    readonly state: Effect.Effect<TrainerState>
    readonly restore: (state: TrainerState) => Effect.Effect<void>
  }
>()("rl/trainer/Trainer") {}
