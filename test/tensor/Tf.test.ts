import { execFileSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"

const tfModule = fileURLToPath(new URL("../../src/tensor/Tf.ts", import.meta.url))

// a gradient tfjs-core registers (MatMul, Exp, Sum) taken through a chained op (`reshape`), in a fresh process
const script = `
import * as tf from ${JSON.stringify(tfModule)}
const x = tf.tensor1d([0.1, 0.2, 0.3, 0.4])
const g = tf.grad((v) => tf.sum(tf.exp(tf.matMul(v.reshape([2, 2]), v.reshape([2, 2])))))(x)
process.stdout.write(JSON.stringify(Array.from(g.dataSync())))
`

const run = (unbundled: boolean): { stdout: string; gradient: Array<number> } => {
  const stdout = execFileSync(process.execPath, ["--input-type=module", "-e", script], {
    encoding: "utf8",
    env: { ...process.env, EFFECT_RL_TFJS_UNBUNDLED: unbundled ? "1" : "0" }
  })
  return { stdout, gradient: JSON.parse(stdout) as Array<number> }
}

describe("Tf", () => {
  it("registers tfjs-core's gradients and chained ops, bundled by npm ci or loaded as published, printing nothing", () => {
    const bundled = run(false)
    const unbundled = run(true)
    // d/dX Σ exp(X·X) for X = [[0.1, 0.2], [0.3, 0.4]]: E = exp(X·X), ∇ = E·Xᵀ + Xᵀ·E
    const x = [
      [0.1, 0.2],
      [0.3, 0.4]
    ]
    const xx = [0, 1].map((i) => [0, 1].map((j) => x[i]![0]! * x[0]![j]! + x[i]![1]! * x[1]![j]!))
    const e = xx.map((row) => row.map(Math.exp))
    const expected = [0, 1].flatMap((i) =>
      [0, 1].map((j) => [0, 1].reduce((s, k) => s + e[i]![k]! * x[j]![k]! + x[k]![i]! * e[k]![j]!, 0))
    )
    for (const { gradient } of [bundled, unbundled]) {
      assert.strictEqual(gradient.length, 4)
      gradient.forEach((g, i) => assert.approximately(g, expected[i]!, 1e-5))
    }
    // stdout is only what the script wrote: no tfjs banner
    assert.match(bundled.stdout, /^\[[^\n]*\]$/)
    assert.match(unbundled.stdout, /^\[[^\n]*\]$/)
  })
})
