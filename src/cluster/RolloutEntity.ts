/**
 * The rollout entity of the cluster: one message, "roll out the group of prompt P (cursor c) with sampling seed s on
 * weights of version ≥ v", answered with the token-exact TrajectoryGroup and the runner that rolled it out. Entities
 * are addressed by the request's key (`<run>/<cursor>/v<version>`) and a placement salt (`#n`, RolloutClient), so
 * the cluster spreads a run's groups over its runners' shards.
 *
 * Messages are persisted (MessageStorage): a runner that dies mid-group leaves its message unprocessed in storage, and
 * the runner that takes over the shard rolls the group out again; the caller waits on the reply wherever it comes
 * from. The request key is the message's primary key, so a trainer that sends the same request again (a resumed run)
 * gets the stored reply, or joins the attempt in flight, instead of a second rollout.
 */
import { Schema } from "effect"
import { ClusterSchema, Entity } from "effect/cluster"
import { Rpc } from "effect/rpc"
import { PromptRow } from "../domain/PromptRow.ts"
import { TrajectoryGroup } from "../domain/Trajectory.ts"

export const RollOut = Rpc.make("RollOut", {
  payload: {
    key: Schema.String, // `<run>/<cursor>/v<minVersion>`: the entity id and the message's primary key
    cursor: Schema.Int,
    row: PromptRow,
    extras: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown)), // the row's env extras
    seed: Schema.Int, // the group's sampling seed (PromptOrder.sampleSeed)
    minVersion: Schema.Int // the runner samples on weights of this version or newer
  },
  // the group, and the runner that rolled it out (the client learns where its entity ids land from it)
  success: Schema.Struct({ group: TrajectoryGroup, runner: Schema.String }),
  primaryKey: (p) => p.key
}).annotate(ClusterSchema.Persisted, true)

export const Rollout = Entity.make("Rollout", [RollOut])

/** The key of a run's request for `cursor` at `minVersion` (the entity id and the message's primary key). */
export const requestKey = (run: string, cursor: number, minVersion: number): string => `${run}/${cursor}/v${minVersion}`
