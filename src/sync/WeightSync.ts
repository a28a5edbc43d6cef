/**
 * Weight sync: the trainer publishes versioned snapshots; engines apply them between decode steps (style.md §15).
 * The transports an engine reads live beside it in inference/ (WeightBoard.ts, WeightUpload.ts); sync/ depends on
 * inference/, never the reverse. Implementations:
 * - EngineWeightSync: the engine's own `updateWeights`, either `shared` (a local engine samples from the trainer's
 *   variables: publishing only moves the version, nothing is copied) or `copied` (a worker engine's board).
 * - HttpWeightSync: chunked, authenticated upload to a remote `serve` (weights/WeightUpload.ts).
 * - FileWeightSync: versioned safetensors directories written atomically, for a watching engine (`serve --watch`).
 *
 * Which one a run uses (src/layers/RunLayers.ts): `pipeline.weight_sync` must fit `generator.engine.kind`, by one rule —
 * an engine kind takes its own sync (local: `inprocess`, the default; worker: `worker`; remote: `http`) or `file`,
 * which only local and remote take (a worker engine's copy of the weights lives in its thread, where files would not
 * reach it). Anything else is a ConfigError naming both keys and the valid values (config/PipelineConfig.ts,
 * `checkWeightSync`). `inprocess` and `worker` are both EngineWeightSync (`shared`, `copied`).
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
    /**
     * The newest version already published where engines read, by this process or an earlier one (a file sync's
     * LATEST); absent where nothing outlives the process. A resumed run publishes above it: an engine that loaded it
     * (a rollout runner) takes only newer versions.
     */
    readonly published?: Effect.Effect<number | undefined>
  }
>()("rl/sync/WeightSync") {}
