/**
 * Checkpoints on a disk that fills (a tmpfs of two and a half checkpoints, mounted for the test; skipped where this
 * process may not mount one): the oldest checkpoint past keep_n goes before a new one is written, so keep_n 2 runs in
 * the room of two; a checkpoint that finds the disk full fails with one line saying so, leaves no half-written
 * directory, and `latest` still names a checkpoint that reads; once space is freed the next save succeeds; a run warns
 * when the room is below two checkpoints.
 */
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statfsSync,
  statSync,
  writeFileSync
} from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Logger } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as Checkpointer from "../../src/store/Checkpointer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as TinyPolicy from "../fixtures/TinyPolicy.ts"
import * as Tmpfs from "../fixtures/Tmpfs.ts"

const sizeOf = (dir: string): number => readdirSync(dir).reduce((n, f) => n + statSync(join(dir, f)).size, 0)

describe.skipIf(!Tmpfs.canMount)("Checkpointer on a disk that fills (tmpfs)", () => {
  it.effect(
    "prunes before it writes, fails a full-disk save in one line with latest intact, and saves once freed",
    () =>
      Effect.gen(function* () {
        yield* TensorBackend.initialise({ name: "cpu", threads: 0, kernels: "stock" })
        const model = TinyPolicy.model(3)
        // Adam moments of 100 K parameters: about 800 KB per checkpoint
        const optimizer = { step: 0, names: ["w"], m: [new Float32Array(100_000)], v: [new Float32Array(100_000)] }
        const state = (step: number) => ({ step, version: step, optimizer, klCoef: 0 })
        const tokenizer = ByteTokenizer.make()

        // the size of one checkpoint, written where there is room
        const sizing = mkdtempSync(join(tmpdir(), "effect-rl-ckpt-size-"))
        yield* Checkpointer.make({ runDir: sizing, keepN: 1, tokenizer }).save(1, model, state(1), {})
        const bytes = sizeOf(join(sizing, "checkpoints", "step-1"))
        rmSync(sizing, { recursive: true, force: true })

        const runDir = mkdtempSync(join(tmpdir(), "effect-rl-disk-full-"))
        assert.isTrue(Tmpfs.mount(runDir, Math.round(2.5 * bytes) + (64 << 10)))
        try {
          const logs: Array<string> = []
          const checkpointer = Checkpointer.make({ runDir, keepN: 2, tokenizer })
          const checkpoints = join(runDir, "checkpoints")
          const steps = () =>
            readdirSync(checkpoints)
              .filter((d) => d.startsWith("step-"))
              .sort()
          yield* checkpointer
            .checkSpace(2 * bytes)
            .pipe(Effect.provide(Logger.layer([Logger.make((o) => void logs.push(String(o.message)))])))
          assert.match(logs.join("\n"), /below two checkpoints.*lower checkpoint\.keep_n/)

          // keep_n 2 in the room of two and a half: each save drops the oldest first
          for (const step of [1, 2, 3, 4]) yield* checkpointer.save(step, model, state(step), { cursor: step })
          assert.deepStrictEqual(steps(), ["step-3", "step-4"])

          // something else fills the disk, and the room step-3 makes is too small for the next checkpoint (twice
          // the moments): the save fails with one line, gives its space back, and latest still reads
          const free = statfsSync(runDir).bavail * statfsSync(runDir).bsize
          const filler = join(runDir, "filler")
          writeFileSync(filler, Buffer.alloc(Math.max(0, free - (16 << 10))))
          const bigger = { ...optimizer, m: [new Float32Array(200_000)], v: [new Float32Array(200_000)] }
          const failed = yield* Effect.exit(
            checkpointer.save(5, model, { ...state(5), optimizer: bigger }, { cursor: 5 })
          )
          assert.isTrue(Exit.isFailure(failed))
          const message = Exit.isFailure(failed)
            ? String((failed.cause.reasons[0] as { error?: Error }).error?.message)
            : ""
          assert.match(message, /^no space left on the device writing .*free space, then train --resume latest$/)
          assert.notInclude(message, "\n")
          assert.isFalse(existsSync(join(checkpoints, "step-5.tmp")))
          assert.strictEqual(readFileSync(join(checkpoints, "latest"), "utf8"), "step-4")
          assert.deepStrictEqual(steps(), ["step-4"]) // step-3 went to make room; step-4 is what latest names
          const restored = yield* checkpointer.read(join(checkpoints, "step-4"))
          assert.deepStrictEqual(restored.data, { cursor: 4 })

          // space freed: the next save goes through
          rmSync(filler)
          yield* checkpointer.save(5, model, state(5), { cursor: 5 })
          assert.strictEqual(readFileSync(join(checkpoints, "latest"), "utf8"), "step-5")
          assert.deepStrictEqual(steps(), ["step-4", "step-5"])
        } finally {
          Tmpfs.unmount(runDir)
          rmSync(runDir, { recursive: true, force: true })
          Transformer.dispose(model)
        }
      })
  )
})
