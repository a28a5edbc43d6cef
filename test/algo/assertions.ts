// Shared assertions for the algo tests: closeness of nested number arrays, and tensor leak checks.
import { assert } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"

type Nested = number | ReadonlyArray<Nested>

/** |actual − expected| ≤ atol + rtol·|expected| elementwise, with the path of the first mismatch. */
export const assertClose = (actual: Nested, expected: Nested, atol = 1e-5, rtol = 1e-5, path = "value"): void => {
  if (typeof expected === "number") {
    assert.isNumber(actual, path)
    const a = actual as number
    if (Number.isNaN(expected)) {
      assert.isNaN(a, path)
      return
    }
    const ok = a === expected || Math.abs(a - expected) <= atol + rtol * Math.abs(expected)
    assert.isTrue(ok, `${path}: expected ${expected}, got ${a}`)
    return
  }
  assert.isArray(actual, path)
  const list = actual as ReadonlyArray<Nested>
  assert.strictEqual(list.length, expected.length, `${path}: length`)
  expected.forEach((e, i) => {
    assertClose(list[i]!, e, atol, rtol, `${path}[${i}]`)
  })
}

/** Reads a tensor, disposes it, and compares. */
export const assertTensorClose = (actual: tf.Tensor, expected: Nested, atol = 1e-5, rtol = 1e-5): void => {
  const values = actual.arraySync() as Nested
  actual.dispose()
  assertClose(values, expected, atol, rtol)
}

/** Runs `f` (which may return tensors) and checks the live tensor count is back where it started. */
export const assertNoLeak = (f: () => tf.TensorContainer): void => {
  const before = tf.memory().numTensors
  const out = f()
  tf.dispose(out)
  assert.strictEqual(tf.memory().numTensors, before, "tensors leaked")
}

export const t2 = (rows: Array<Array<number>>): tf.Tensor2D => tf.tensor2d(rows, undefined, "float32")
