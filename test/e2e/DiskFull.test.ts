/**
 * A run whose disk fills during training, as a user meets it: the run directory is on a tmpfs (mounted for the test;
 * skipped where this process may not mount one), and once the run has checkpointed step 2 another file takes every
 * free byte. Then, for the sync and the fully-async pipeline:
 * - the run stops with a non-zero exit and one line naming the file and "no space left", no stack and no "bug";
 * - `latest` names a complete checkpoint, and no half-written `.tmp` is left anywhere in the run directory;
 * - after the space is freed, `--resume latest` finishes the run and every prompt is trained exactly once
 *   (consumed.jsonl holds each cursor once, in order).
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"
import * as Tmpfs from "../fixtures/Tmpfs.ts"

const train = (config: string, runDir: string, resume: boolean) =>
  Cli.start([
    "train",
    "--config",
    config,
    "--run-dir",
    runDir,
    "logging.progress=false",
    "checkpoint.interval=1",
    "checkpoint.keep_n=2",
    "trainer.eval_before_train=false",
    "trainer.max_steps=8",
    ...(resume ? ["--resume", "latest"] : [])
  ])

const latestOf = (runDir: string): string | undefined => {
  try {
    return readFileSync(join(runDir, "checkpoints", "latest"), "utf8").trim()
  } catch {
    return undefined
  }
}

const filesUnder = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? filesUnder(join(dir, e.name)) : [join(dir, e.name)]
  )

const consumedCursors = (runDir: string): Array<number> =>
  readFileSync(join(runDir, "consumed.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => (JSON.parse(l) as { cursor: number }).cursor)

describe.skipIf(!Tmpfs.canMount)("a disk that fills during training (tmpfs)", () => {
  for (const config of ["configs/tiny.yaml", "configs/tiny-async.yaml"]) {
    it(`${config}: stops in one line with latest intact, and resumes exactly once when space is freed`, async () => {
      const mountPoint = mkdtempSync(join(tmpdir(), "effect-rl-disk-full-run-"))
      assert.isTrue(Tmpfs.mount(mountPoint, 32 << 20))
      try {
        const runDir = join(mountPoint, "run")
        const filler = join(mountPoint, "filler")
        const first = train(config, runDir, false)
        let ended = false
        void first.exited.then(() => {
          ended = true
        })
        while (!ended && latestOf(runDir) !== "step-2") await new Promise((r) => setTimeout(r, 20))
        assert.isFalse(ended, `the run ended before step 2:\n${first.stderr().slice(-3000)}`)
        Tmpfs.fill(filler)
        const code = await first.exited
        const stderr = first.stderr()
        assert.notStrictEqual(code, 0, stderr.slice(-3000))
        const errorLines = stderr.split("\n").filter((l) => /no space left/.test(l))
        assert.strictEqual(errorLines.length, 1, stderr.slice(-3000))
        assert.match(errorLines[0]!, new RegExp(`no space left on the device writing ${runDir}/\\S+`))
        assert.notMatch(stderr, /^\s+at /m, "no stack")
        assert.notInclude(stderr, "a bug")

        // latest names a complete checkpoint; nothing half-written is left
        const latest = join(runDir, "checkpoints", latestOf(runDir)!)
        for (const file of ["model.safetensors", "config.json", "trainer_state.json"])
          assert.isTrue(existsSync(join(latest, file)), file)
        assert.deepStrictEqual(
          filesUnder(runDir).filter((f) => /\.tmp($|\/)|\.tmp-/.test(f)),
          [],
          "no .tmp left"
        )

        rmSync(filler)
        const resumed = train(config, runDir, true)
        const resumedCode = await resumed.exited
        assert.strictEqual(resumedCode, 0, resumed.stderr().slice(-3000))
        assert.deepStrictEqual(
          consumedCursors(runDir),
          Array.from({ length: 16 }, (_, i) => i)
        )
      } finally {
        Tmpfs.unmount(mountPoint)
        rmSync(mountPoint, { recursive: true, force: true })
      }
    }, 300_000)
  }
})
