import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import * as KeyTree from "../../src/config/KeyTree.ts"

// `sampling.filter` moved to `batch.filter`
const moved: ReadonlyArray<KeyTree.MovedKey> = [{ from: "sampling.filter", to: "batch.filter" }]
const Config = Schema.Struct({
  sampling: Schema.optionalKey(Schema.Struct({ temperature: Schema.optionalKey(Schema.Number) })),
  batch: Schema.optionalKey(Schema.Struct({ filter: Schema.optionalKey(Schema.Boolean) }))
}).pipe(Schema.annotate({ [KeyTree.movedKeysAnnotation]: moved }))

describe("KeyTree.of", () => {
  const tree = KeyTree.of(Config)

  it("accepts a moved key at its old path, as well as at its new one", () => {
    assert.deepStrictEqual(KeyTree.unknownKeys(tree, { sampling: { filter: true }, batch: { filter: false } }), [])
    assert.strictEqual(KeyTree.lookup(tree, ["sampling", "filter"])._tag, "Found")
  })

  it("never offers the old path: not among the paths, not as a suggestion", () => {
    assert.deepStrictEqual(KeyTree.paths(tree), ["sampling", "sampling.temperature", "batch", "batch.filter"])
    // `filtre` is nearest to the old sibling `filter`, which is not offered
    const sampling = KeyTree.lookup(tree, ["sampling"])
    assert.strictEqual(sampling._tag, "Found")
    if (sampling._tag === "Found") assert.isUndefined(KeyTree.suggest(sampling.tree, ["sampling"], "filtre"))
    // a `filter` in the wrong section points to the new path
    assert.deepStrictEqual(KeyTree.unknownKeys(tree, { filter: true }), [
      { path: ["filter"], suggestion: "batch.filter" }
    ])
  })
})

describe("KeyTree.moveKeys", () => {
  it("takes a value from the old path to the new one and says what it found; the input is left as it was", () => {
    const raw = { sampling: { temperature: 0.7, filter: true } }
    const { raw: out, found } = KeyTree.moveKeys(raw, moved)
    assert.deepStrictEqual(out, { sampling: { temperature: 0.7 }, batch: { filter: true } })
    assert.deepStrictEqual(found, [{ key: moved[0], ignored: false }])
    assert.deepStrictEqual(raw, { sampling: { temperature: 0.7, filter: true } })
  })

  it("drops the old value where the new path is set too (the new one wins), and finds nothing in a new config", () => {
    const both = KeyTree.moveKeys({ sampling: { filter: true }, batch: { filter: false } }, moved)
    assert.deepStrictEqual(both.raw, { sampling: {}, batch: { filter: false } })
    assert.deepStrictEqual(both.found, [{ key: moved[0], ignored: true }])
    assert.deepStrictEqual(KeyTree.moveKeys({ batch: { filter: true } }, moved).found, [])
  })
})
