/**
 * Fatal errors as a user sees them: one line on stderr naming the file (and line) or what failed, no stack trace,
 * nothing on stdout (whose last line is a command's JSON result).
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"

const noStack = (text: string, what: string) =>
  assert.notMatch(text, /^\s+at .+:\d+:\d+\)?$/m, `${what} holds a stack trace:\n${text.slice(-1500)}`)

describe("fatal errors", () => {
  it("replay of an episode log torn in the middle names the file and line on stderr, without a stack", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "effect-rl-errors-"))
    try {
      const file = path.join(dir, "episodes.jsonl")
      fs.writeFileSync(file, '{"uid": "a", "trajec\n{"uid": "b"}\n') // line 1 torn, a later line follows
      const result = Cli.run(["replay", "--episodes", file, "--config", "configs/tiny.yaml", "--run-dir", dir], {
        timeoutMs: 120_000
      })
      assert.notStrictEqual(result.code, 0)
      assert.include(result.stderr, `${file}:1: not a valid trajectory group`)
      assert.strictEqual(result.stdout.trim(), "")
      noStack(result.stderr, "stderr")
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  it("a typed failure without a message of its own is one line with its fields, on stderr", () => {
    const result = Cli.run(["model", "logprobs", "--backend", "tensorflow", "--model", "nowhere", "--ids", "1,2"])
    assert.notStrictEqual(result.code, 0)
    assert.match(result.stderr, /ERROR\n {2}TensorBackendError: .*\(backend: tensorflow\)/)
    assert.strictEqual(result.stdout.trim(), "")
    noStack(result.stderr, "stderr")
  })
})
