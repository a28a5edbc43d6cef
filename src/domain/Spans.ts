/**
 * The spans a training run exports (`logging.backends: [otlp]`), named in one place like the metric names: the
 * producers (pipeline, generator, env, sync) take their names from here, and the tracking tracer exports these and
 * nothing else. Every other span (each `Effect.fn`) is kept out of the export and is transparent: a tracked span's
 * parent is its nearest tracked ancestor, so the exported tree is exactly
 *
 *   train.run ─┬ train.step ─┬ rollout.group ─ agent.turn ─ tool.call
 *              │             └ weight.sync
 *              └ train.eval ─ rollout.group ─ agent.turn ─ tool.call
 *
 * in the sync pipeline. The async pipeline generates a group before the step that trains it is known: there the group
 * is a child of `train.run`, and the step that trains it links to it (span links, one per group).
 */
import { Context } from "effect"

export const names = {
  run: "train.run", // the whole training loop, from resume to the final evaluation
  step: "train.step", // one training step: its batch's generation (sync pipeline), the update, the weight sync
  group: "rollout.group", // the n trajectories of one prompt; attributes prompt.uid, prompt.cursor
  turn: "agent.turn", // one turn of one trajectory: the engine's generation and the environment's step
  toolCall: "tool.call", // one MCP tool call; attributes tool.name, tool.is_error
  weightSync: "weight.sync", // publishing a policy version to what samples from it
  eval: "train.eval" // a held-out evaluation (before training, every eval_interval steps, after)
} as const

export const tracked: ReadonlySet<string> = new Set(Object.values(names))

/** Where a group's span is, written into `episodes.jsonl` when spans are exported. */
export interface TraceRef {
  readonly traceId: string
  readonly spanId: string
}

/** Whether groups record their span's trace id (on while an exporting tracker is installed). */
export const RecordTrace = Context.Reference<boolean>("rl/domain/Spans/RecordTrace", { defaultValue: () => false })
