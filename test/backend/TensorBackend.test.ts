import { assert, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import * as NativeKernels from "../../src/native/NativeKernels.ts"
import * as Cli from "../fixtures/Cli.ts"

/**
 * One forward + backward + Adam step of a graph with every op family training needs: embedding lookup (gather, whose
 * gradient is UnsortedSegmentSum — missing on stock wasm), matmul, RMS norm, softmax and log-softmax.
 */
const trainStep = (backend: "cpu" | "wasm" | "native") => {
  const vocab = 11
  const d = 6
  const init = (n: number, seed: number) => Array.from({ length: n }, (_, i) => Math.sin(seed * 7.1 + i * 1.3) * 0.5)
  // tf.variable keeps its initial tensor alive unless created inside tidy (variables survive tidy).
  const embed = tf.tidy(() => tf.variable(tf.tensor2d(init(vocab * d, 1), [vocab, d]), true, `${backend}/embed`))
  const w = tf.tidy(() => tf.variable(tf.tensor2d(init(d * vocab, 2), [d, vocab]), true, `${backend}/w`))
  const gain = tf.tidy(() => tf.variable(tf.tensor1d(init(d, 3).map((x) => 1 + x)), true, `${backend}/gain`))
  const optimizer = tf.train.adam(0.01)
  const ids = tf.tensor1d([1, 4, 4, 9, 0, 3], "int32") //                                   tokens [T]
  const targets = tf.tensor1d([4, 4, 9, 0, 3, 10], "int32") //                               next tokens [T]
  const loss = () =>
    tf.tidy(() => {
      const x = tf.gather(embed, ids) //                                                          [T, d]
      const rms = tf.sqrt(tf.add(tf.mean(tf.square(x), -1, true), 1e-6)) //                      [T, 1]
      const h = tf.mul(tf.div(x, rms), gain) //                                                   [T, d]
      const logits = tf.matMul(h, w) //                                                           [T, V]
      const logp = tf.logSoftmax(logits) //                                                       [T, V]
      const picked = tf.sum(tf.mul(logp, tf.oneHot(targets, vocab).cast("float32")), -1) //      [T]
      const entropy = tf.neg(tf.sum(tf.mul(tf.softmax(logits), logp), -1)) //                    [T]
      return tf.sub(tf.neg(tf.mean(picked)), tf.mul(0.01, tf.mean(entropy))) as tf.Scalar
    })
  const { value, grads } = tf.variableGrads(loss)
  const gradValues = Object.fromEntries(
    Object.entries(grads).map(([name, g]) => [name.split("/")[1]!, Array.from(g.dataSync())])
  )
  optimizer.applyGradients(grads as tf.NamedTensorMap as Parameters<typeof optimizer.applyGradients>[0])
  const result = {
    loss: value.dataSync()[0]!,
    grads: gradValues,
    embed: Array.from(embed.dataSync()),
    w: Array.from(w.dataSync()),
    gain: Array.from(gain.dataSync())
  }
  tf.dispose([value, ...Object.values(grads), ids, targets, embed, w, gain])
  optimizer.dispose()
  return result
}

const close = (a: ReadonlyArray<number>, b: ReadonlyArray<number>, tol: number, what: string) => {
  assert.strictEqual(a.length, b.length, what)
  for (const [i, x] of a.entries()) assert.isAtMost(Math.abs(x - b[i]!), tol, `${what}[${i}]: ${x} vs ${b[i]}`)
}

describe("TensorBackend", () => {
  it.effect("initialises wasm and registers the UnsortedSegmentSum kernel it lacks", () =>
    Effect.gen(function* () {
      const info = yield* TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })
      assert.strictEqual(info.name, "wasm")
      assert.strictEqual(tf.getBackend(), "wasm")
      assert.isDefined(tf.getKernel("UnsortedSegmentSum", "wasm"))
    })
  )

  it.effect("auto falls back past the native bindings that are not installed", () =>
    Effect.gen(function* () {
      const info = yield* TensorBackend.initialise({ name: "auto", threads: 0, kernels: "stock" })
      assert.include(["tensorflow-gpu", "tensorflow", "wasm"], info.name)
    })
  )

  it.effect("auto picks the native backend when the native kernels built", () =>
    Effect.gen(function* () {
      const info = yield* TensorBackend.initialise({ name: "auto", threads: 0, kernels: "native" })
      if (NativeKernels.status().available) {
        assert.strictEqual(info.name, "native")
        assert.strictEqual(info.kernels, "native")
      } else {
        assert.include(["tensorflow-gpu", "tensorflow", "wasm"], info.name)
      }
    })
  )

  it("auto prints nothing from a backend it skips (Dawn's adapter warnings where lavapipe is the only driver)", () => {
    const result = Cli.run([
      "model",
      "logprobs",
      "--model",
      "data/quickstart/policy",
      "--ids",
      "72,105,33",
      "--backend",
      "auto"
    ])
    assert.strictEqual(result.code, 0, result.stderr)
    const chosen = /tensor backend: ([\w-]+) \(auto\)/.exec(result.stderr)
    assert.isNotNull(chosen, result.stderr)
    if (chosen![1] !== "webgpu") {
      assert.notMatch(result.stderr, /Dawn|artificially reduced|^Warning/im)
      assert.notMatch(result.stderr, /webgpu adapter: /)
    }
  })

  it.effect("fails with a typed error naming the backend when it is not installed", () =>
    Effect.gen(function* () {
      const error = yield* TensorBackend.initialise({ name: "tensorflow", threads: 0, kernels: "stock" }).pipe(
        Effect.flip
      )
      assert.strictEqual(error._tag, "TensorBackendError")
      assert.strictEqual(error.backend, "tensorflow")
    })
  )

  it.effect("a forward + backward + Adam step matches between wasm, cpu and native (1e-5) and leaks no tensors", () =>
    Effect.gen(function* () {
      const results: Record<string, ReturnType<typeof trainStep>> = {}
      const names = NativeKernels.status().available ? (["cpu", "wasm", "native"] as const) : (["cpu", "wasm"] as const)
      for (const name of names) {
        yield* TensorBackend.initialise({ name, threads: 0, kernels: name === "native" ? "native" : "stock" })
        const before = tf.memory().numTensors
        results[name] = trainStep(name)
        assert.strictEqual(tf.memory().numTensors - before, 0, `${name} leaked tensors`)
      }
      const cpu = results["cpu"]!
      const wasm = results["wasm"]!
      assert.isTrue(Number.isFinite(cpu.loss))
      assert.isAtMost(Math.abs(cpu.loss - wasm.loss), 1e-5)
      for (const other of Object.keys(results).filter((n) => n !== "cpu")) {
        const r = results[other]!
        assert.isAtMost(Math.abs(cpu.loss - r.loss), 1e-5, `${other} loss`)
        for (const name of ["embed", "w", "gain"] as const) {
          close(cpu.grads[name]!, r.grads[name]!, 1e-5, `${other} grad ${name}`)
          close(cpu[name], r[name], 1e-5, `${other} ${name}`)
        }
      }
      // The embedding gradient is non-zero exactly on the looked-up rows (1, 4, 9, 0, 3), zero elsewhere.
      const rowNorm = (r: number) => cpu.grads["embed"]!.slice(r * 6, r * 6 + 6).reduce((a, b) => a + Math.abs(b), 0)
      for (const r of [0, 1, 3, 4, 9]) assert.isAbove(rowNorm(r), 0, `row ${r}`)
      for (const r of [2, 5, 6, 7, 8, 10]) assert.strictEqual(rowNorm(r), 0, `row ${r}`)
    })
  )
})

describe("TensorBackend.chosenLine", () => {
  it("names the backend and its kernels, and optional packages that are absent as not installed, not as errors", () => {
    const line = TensorBackend.chosenLine(
      { name: "wasm", tfjsName: "wasm", threads: 1, kernels: "stock", addedKernels: [] },
      true,
      [
        "tensorflow-gpu: Error [ERR_MODULE_NOT_FOUND]: Cannot find package '@tensorflow/tfjs-node-gpu' imported from x",
        "tensorflow: Error [ERR_MODULE_NOT_FOUND]: Cannot find package '@tensorflow/tfjs-node' imported from x",
        "webgpu: Error: only a software adapter"
      ]
    )
    assert.strictEqual(
      line,
      "tensor backend: wasm (auto), stock kernels, 1 thread(s); not installed: tensorflow-gpu, tensorflow; " +
        "skipped webgpu: Error: only a software adapter"
    )
    assert.notInclude(line, "ERR_MODULE_NOT_FOUND")
  })
})
