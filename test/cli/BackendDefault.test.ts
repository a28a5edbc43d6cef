/**
 * Commands that build a model take the backend configs default to (`backend.name: auto`) unless told otherwise, so a
 * checkpoint too big for wasm's 4 GB heap loads on the first try (`train`, `eval` and `sft` read it from the config;
 * `serve`'s default is checked in Serve.test.ts).
 */
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"

describe("the backend of the model commands", () => {
  it("model logprobs without --backend picks one as auto does", () => {
    const result = Cli.run(["model", "logprobs", "--model", "data/quickstart/policy", "--ids", "72,105,33"])
    assert.strictEqual(result.code, 0, result.stderr)
    assert.match(result.stderr, /tensor backend: [\w-]+ \(auto\)/)
    assert.lengthOf((JSON.parse(result.lastLine) as { logprobs: Array<number> }).logprobs, 2)
  })
})
