/**
 * docs/config.md is generated from the config schemas (scripts/config-doc.ts): these tests fail when it is stale, and
 * pin that the generator lists every key the schema accepts, with a type, a default and a meaning.
 */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as ConfigDoc from "../../scripts/config-doc.ts"
import * as KeyTree from "../../src/config/KeyTree.ts"
import { RunConfig } from "../../src/config/RunConfig.ts"

const root = join(import.meta.dirname, "..", "..")
const rendered = ConfigDoc.render()

/** The rows of every key table: `| \`key\` | type | default | meaning |`. */
const rows = rendered.split("\n").flatMap((line) => {
  const match = /^\| `([^`]+)` \| (.+?) \| (.+?) \| (.*) \|$/.exec(line)
  return match === null ? [] : [{ key: match[1]!, type: match[2]!, default: match[3]!, meaning: match[4]! }]
})
const row = (key: string) => rows.find((r) => r.key === key)

describe("scripts/config-doc.ts", () => {
  it("renders what docs/config.md holds (else: run `node scripts/config-doc.ts`)", () => {
    const committed = readFileSync(join(root, ConfigDoc.path), "utf8")
    if (committed !== rendered) {
      const file = committed.split("\n")
      const fresh = rendered.split("\n")
      const differing = fresh.flatMap((line, i) => (line === file[i] ? [] : [i])).slice(0, 3)
      const shown = differing.map((i) => `line ${i + 1}:\n  file:    ${file[i]}\n  schemas: ${fresh[i]}`).join("\n")
      assert.fail(`${ConfigDoc.path} is stale.\n${shown}\nrun \`node scripts/config-doc.ts\``)
    }
  })

  it("lists every key the schema accepts, by its dotted path, once", () => {
    // a secret's `{ env: NAME }` is its type, not a key of its own
    const isSecretName = (p: string) => p.endsWith(".env") && row(p.slice(0, -4))?.type.startsWith("secret") === true
    const keys = KeyTree.paths(KeyTree.of(RunConfig)).filter((p) => p.includes(".") && !isSecretName(p))
    assert.deepStrictEqual(
      rows.map((r) => r.key),
      keys
    )
  })

  it("gives every key a meaning from the comments beside it in src/config/", () => {
    assert.deepStrictEqual(
      rows.filter((r) => r.meaning.trim() === "").map((r) => r.key),
      []
    )
    assert.strictEqual(row("generator.sampling.temperature")?.meaning, "0 = greedy.")
    // a trailing comment, and the comment lines above a field
    assert.strictEqual(row("trainer.optimizer.max_grad_norm")?.meaning, "0 = no clipping.")
    assert.include(row("trainer.max_train_seconds")?.meaning ?? "", "a wall-clock budget")
  })

  it("shows the default an absent key decodes to, inside a section's own default where it sets one", () => {
    assert.strictEqual(row("generator.max_input_length")?.default, "`2048`")
    assert.strictEqual(row("trainer.optimizer.lr")?.default, "`1e-5`")
    // critic_optimizer defaults to { lr: 5e-6 }, sft.optimizer to { lr: 2e-5, scheduler: cosine }
    assert.strictEqual(row("trainer.critic_optimizer.lr")?.default, "`5e-6`")
    assert.strictEqual(row("sft.optimizer.scheduler")?.default, "`cosine`")
    assert.strictEqual(row("generator.eval_sampling.temperature")?.default, "`0`")
    assert.strictEqual(row("environment.judge.url")?.default, "required")
    assert.strictEqual(row("trainer.max_steps")?.default, "unset")
  })

  it("states each type with its choices and bounds", () => {
    assert.strictEqual(row("pipeline.mode")?.type, "one of `sync`, `async`")
    assert.strictEqual(row("trainer.train_batch_size")?.type, "integer > 0")
    assert.strictEqual(row("logging.prometheus.port")?.type, "integer in [0, 65535]")
    assert.strictEqual(row("generator.engine.api_key")?.type, "secret `{env: NAME}`")
  })

  it("lists the keys that moved, old path beside new", () => {
    assert.include(rendered, "| `generator.zero_variance_filter` | `trainer.algorithm.zero_variance_filter` |")
  })
})
