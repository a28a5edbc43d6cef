import { Schema } from "effect"
import { NonNegativeInt, PositiveInt, withDefault } from "./Field.ts"

/** sync: generate a batch, train, repeat. async: K generation fibers feed the trainer through a bounded queue. */
export const PipelineConfig = Schema.Struct({
  mode: Schema.Literals(["sync", "async"]).pipe(withDefault("sync")),
  max_staleness_steps: NonNegativeInt.pipe(withDefault(1)), // a group trains at most this many versions late
  num_generation_workers: PositiveInt.pipe(withDefault(4)), // K
  weight_sync: Schema.Literals(["inprocess", "worker", "file", "http"]).pipe(withDefault("inprocess")),
  pause_mode: Schema.Literals(["abort", "keep", "wait"]).pipe(withDefault("keep"))
})
export type PipelineConfig = typeof PipelineConfig.Type
