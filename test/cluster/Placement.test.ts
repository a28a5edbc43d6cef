/** RolloutClient's placement: each request's entity id salted so its shard lands on the least-loaded known runner. */
import { assert, describe, it } from "@effect/vitest"
import * as RolloutClient from "../../src/cluster/RolloutClient.ts"

// shards by salt: `<key>#n` is on shard n mod 3
const shardOf = (entityId: string) => Number(entityId.split("#")[1]) % 3

describe("RolloutClient.makePlacement", () => {
  it("spreads requests over the runners the replies named, fewest in flight first", () => {
    const placement = RolloutClient.makePlacement(shardOf)
    // nothing learned yet: the first salt
    const first = placement.place("run/0/v0")
    assert.deepStrictEqual(first, { entityId: "run/0/v0#0", runner: undefined })
    placement.done(first.entityId, first.runner, "a") // shard 0 → a
    placement.done("run/1/v0#1", undefined, "b") // shard 1 → b
    placement.done("run/2/v0#2", undefined, "b") // shard 2 → b
    const runners = Array.from({ length: 6 }, (_, i) => placement.place(`run/${i + 3}/v0`))
    const count = (r: string) => runners.filter((p) => p.runner === r).length
    assert.strictEqual(count("a"), 3)
    assert.strictEqual(count("b"), 3)
    // a reply frees its runner's slot: the next request goes there
    const onA = runners.find((p) => p.runner === "a")!
    placement.done(onA.entityId, "a", "a")
    assert.strictEqual(placement.place("run/9/v0").runner, "a")
    // a failover: shard 0 now answers from b, which the next placements learn
    placement.done("run/10/v0#3", undefined, "b")
    assert.strictEqual(placement.place("run/11/v0").runner, "b")
  })
})
