import { appendFileSync, mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as RolloutRequests from "../../src/store/RolloutRequests.ts"

describe("RolloutRequests", () => {
  it("journals one line per request and reads them back by cursor, the last per cursor winning, a torn line skipped", async () => {
    const runDir = mkdtempSync(join(tmpdir(), "effect-rl-requests-"))
    try {
      assert.strictEqual((await RolloutRequests.read(runDir)).size, 0) // no file yet
      await RolloutRequests.append(runDir, { cursor: 4, key: "a1/4/v2", entityId: "a1/4/v2#17" })
      await RolloutRequests.append(runDir, { cursor: 5, key: "a1/5/v2", entityId: "a1/5/v2#3" })
      await RolloutRequests.append(runDir, { cursor: 4, key: "b2/4/v3", entityId: "b2/4/v3#0" })
      appendFileSync(RolloutRequests.file(runDir), '{"cursor":6,"key":"b2/6') // a crash mid-write
      const read = await RolloutRequests.read(runDir)
      assert.deepStrictEqual([...read.keys()].sort(), [4, 5])
      assert.deepStrictEqual(read.get(4), { cursor: 4, key: "b2/4/v3", entityId: "b2/4/v3#0" })
      assert.strictEqual(read.get(5)?.entityId, "a1/5/v2#3")
      assert.strictEqual(readFileSync(RolloutRequests.file(runDir), "utf8").split("\n").length, 4)
    } finally {
      rmSync(runDir, { recursive: true, force: true })
    }
  })
})
