/**
 * Weight sync: the trainer publishes versioned snapshots; engines apply them between decode steps (style.md §15).
 * Implementations: InProcessWeightSync (the engine samples from the trainer's own variables: publishing only moves
 * the version, nothing is copied), WorkerWeightSync (SharedArrayBuffers shared with a WorkerEngine), FileWeightSync
 * (versioned safetensors directories written atomically, for a watching engine) and HttpWeightSync (chunked,
 * authenticated upload to a remote `serve`).
 */
import { Context, type Effect, Schema } from "effect"
import type { PolicyVersion } from "../domain/PolicyVersion.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"

/** A new version; the snapshot is read only by syncs that copy weights (in-process sync never does). */
export interface Update {
  readonly version: PolicyVersion
  readonly snapshot: Effect.Effect<WeightSnapshot>
}

export class WeightSyncError extends Schema.TaggedError<WeightSyncError>()("WeightSyncError", {
  target: Schema.String,
  message: Schema.String
}) {}

export class WeightSync extends Context.Service<
  WeightSync,
  {
    readonly kind: string
    /** Make `update` the weights engines sample from; returns when they have it (or will at their next step). */
    readonly publish: (update: Update) => Effect.Effect<void, WeightSyncError>
  }
>()("rl/sync/WeightSync") {}
