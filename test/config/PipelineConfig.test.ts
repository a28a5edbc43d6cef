import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import * as PipelineConfig from "../../src/config/PipelineConfig.ts"

const syncs = ["inprocess", "worker", "file", "http"] as const
const kinds = ["local", "worker", "remote"] as const

describe("PipelineConfig.checkWeightSync", () => {
  it.effect("accepts exactly each engine kind's own sync, plus file for local and remote", () =>
    Effect.gen(function* () {
      const accepted: Array<string> = []
      for (const kind of kinds) {
        for (const sync of syncs) {
          const exit = yield* Effect.exit(PipelineConfig.checkWeightSync(sync, kind))
          if (Exit.isSuccess(exit)) accepted.push(`${kind}+${sync}`)
        }
      }
      assert.deepStrictEqual(accepted, ["local+inprocess", "local+file", "worker+worker", "remote+file", "remote+http"])
    })
  )

  it.effect("refuses a misfit with a ConfigError naming both keys and the valid values", () =>
    Effect.gen(function* () {
      // the default weight_sync (inprocess) with a worker engine
      const error = yield* Effect.flip(PipelineConfig.checkWeightSync("inprocess", "worker"))
      assert.strictEqual(error._tag, "ConfigError")
      assert.strictEqual(error.path, "pipeline.weight_sync")
      assert.match(
        error.message,
        /^pipeline\.weight_sync inprocess does not fit generator\.engine\.kind worker: use worker /
      )
      const remote = yield* Effect.flip(PipelineConfig.checkWeightSync("worker", "remote"))
      assert.include(remote.message, "use http or file")
    })
  )
})
