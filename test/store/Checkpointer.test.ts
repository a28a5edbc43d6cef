import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Logger } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as Checkpointer from "../../src/store/Checkpointer.ts"
import * as RunDirectory from "../../src/store/RunDirectory.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as TinyPolicy from "../fixtures/TinyPolicy.ts"

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

describe("train --resume latest (RunDirectory.resolveResume)", () => {
  /** A run directory with real checkpoints of steps 1 and 2 (Checkpointer.save), `latest` naming step-2. */
  const savedRun = Effect.gen(function* () {
    yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
    const runDir = mkdtempSync(join(tmpdir(), "effect-rl-resume-"))
    const checkpointer = Checkpointer.make({ runDir, keepN: 3, tokenizer: ByteTokenizer.make() })
    const model = TinyPolicy.model(3)
    const optimizer = { step: 0, names: ["w"], m: [new Float32Array(2)], v: [new Float32Array(2)] }
    for (const step of [1, 2]) {
      yield* checkpointer.save(step, model, { step, version: step, optimizer, klCoef: 0 }, { cursor: step })
    }
    Transformer.dispose(model)
    return { runDir, checkpoints: join(runDir, "checkpoints") }
  })
  const withLogs = <A, E>(body: (logs: Array<string>) => Effect.Effect<A, E>) => {
    const logs: Array<string> = []
    return body(logs).pipe(Effect.provide(Logger.layer([Logger.make((o) => void logs.push(String(o.message)))])))
  }

  it.effect("an empty latest resumes from the newest complete step (not a fresh run), with a warning", () =>
    withLogs((logs) =>
      Effect.gen(function* () {
        const { runDir, checkpoints } = yield* savedRun
        assert.strictEqual(readFileSync(join(checkpoints, "latest"), "utf8"), "step-2")
        assert.isFalse(existsSync(join(checkpoints, "latest.tmp")))
        // a power loss after the unsynced rename: `latest` is there but empty; a save of step 3 never finished
        writeFileSync(join(checkpoints, "latest"), "")
        mkdirSync(join(checkpoints, "step-3.tmp"))
        const resumeFrom = yield* RunDirectory.resolveResume(runDir, "latest")
        assert.strictEqual(resumeFrom, join(checkpoints, "step-2"))
        assert.isTrue(logs.some((l) => l.includes("is empty or unreadable: resuming from the newest complete")))
        // and that checkpoint reads back: the run goes on at step 2
        const restored = yield* Checkpointer.make({ runDir, keepN: 3, tokenizer: ByteTokenizer.make() }).read(
          resumeFrom!
        )
        assert.strictEqual(restored.trainer.step, 2)
      })
    )
  )

  it.effect("a missing latest beside step directories resumes too; a run with no checkpoint starts fresh", () =>
    Effect.gen(function* () {
      const { runDir, checkpoints } = yield* savedRun
      rmSync(join(checkpoints, "latest"))
      assert.strictEqual(yield* RunDirectory.resolveResume(runDir, "latest"), join(checkpoints, "step-2"))
      const fresh = mkdtempSync(join(tmpdir(), "effect-rl-resume-"))
      assert.isUndefined(yield* RunDirectory.resolveResume(fresh, "latest"))
    })
  )

  it.effect("an empty latest with no complete step directory is a CheckpointError that says what to do", () =>
    Effect.gen(function* () {
      const { runDir, checkpoints } = yield* savedRun
      writeFileSync(join(checkpoints, "latest"), "")
      for (const step of readdirSync(checkpoints).filter((d) => d.startsWith("step-"))) {
        rmSync(join(checkpoints, step, "trainer_state.json"))
      }
      const exit = yield* Effect.exit(RunDirectory.resolveResume(runDir, "latest"))
      assert.isTrue(Exit.isFailure(exit))
      const error = Exit.isFailure(exit) ? String(exit.cause) : ""
      assert.include(error, "CheckpointError")
      assert.include(error, "--resume PATH")
    })
  )
})
