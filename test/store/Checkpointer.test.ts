import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Checkpointer from "../../src/store/Checkpointer.ts"

describe("Checkpointer.resolveModelDir", () => {
  // run/checkpoints/{step-30,step-60}/config.json, run/checkpoints/latest naming step-60
  const run = mkdtempSync(join(tmpdir(), "effect-rl-resolve-"))
  const checkpoints = join(run, "checkpoints")
  for (const step of ["step-30", "step-60"]) {
    mkdirSync(join(checkpoints, step), { recursive: true })
    writeFileSync(join(checkpoints, step, "config.json"), "{}")
  }
  writeFileSync(join(checkpoints, "latest"), "step-60\n")

  it("reads a run directory and a checkpoints/latest file as the latest checkpoint", async () => {
    assert.strictEqual(await Checkpointer.resolveModelDir(run), join(checkpoints, "step-60"))
    assert.strictEqual(await Checkpointer.resolveModelDir(join(checkpoints, "latest")), join(checkpoints, "step-60"))
  })

  it("keeps a model directory, and a path it cannot read, as given (the loader names what is wrong)", async () => {
    assert.strictEqual(await Checkpointer.resolveModelDir(join(checkpoints, "step-30")), join(checkpoints, "step-30"))
    assert.strictEqual(await Checkpointer.resolveModelDir(join(run, "nowhere")), join(run, "nowhere"))
    assert.strictEqual(await Checkpointer.resolveModelDir(checkpoints), checkpoints)
  })

  it("takes an empty latest pointer (a run that has not checkpointed yet) as no checkpoint", async () => {
    const fresh = mkdtempSync(join(tmpdir(), "effect-rl-resolve-"))
    mkdirSync(join(fresh, "checkpoints"))
    writeFileSync(join(fresh, "checkpoints", "latest"), "\n")
    assert.strictEqual(await Checkpointer.latestIn(fresh), undefined)
    assert.strictEqual(await Checkpointer.resolveModelDir(fresh), fresh)
  })
})
