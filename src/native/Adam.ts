/**
 * Adam with the update in one native pass per variable (native/adam.cc) instead of tfjs' ~12 element-wise kernels:
 * the kernel `EffectRlAdamUpdate`, registered by NativeKernels.register, and `NativeAdam`, tfjs' AdamOptimizer (same
 * state, weights and serialisation) that runs it when it is registered and tfjs' own update when not.
 */
import * as tf from "../tensor/Tf.ts"
import { sizeOf } from "./Layout.ts"
import { type OwnKernel, offsetOf } from "./WasmKernel.ts"

export const kernelName = "EffectRlAdamUpdate"

/** {value, grad, m, v} → [value', m', v']; attrs: lr, beta1, beta2, epsilon and c1 = 1 − β1ᵗ, c2 = 1 − β2ᵗ. */
export const kernel: OwnKernel = (kernels, { inputs, backend, attrs }) => {
  const { value, grad, m, v } = inputs as Record<"value" | "grad" | "m" | "v", tf.TensorInfo>
  const a = attrs as unknown as Record<"lr" | "beta1" | "beta2" | "epsilon" | "c1" | "c2", number>
  const [newValue, newM, newV] = [value, m, v].map((t) => backend.makeOutput([...t.shape], "float32")) as [
    tf.TensorInfo,
    tf.TensorInfo,
    tf.TensorInfo
  ]
  kernels.adam({
    heap: backend.wasm.HEAPU8,
    value: offsetOf(backend, value),
    grad: offsetOf(backend, grad),
    m: offsetOf(backend, m),
    v: offsetOf(backend, v),
    newValue: offsetOf(backend, newValue),
    newM: offsetOf(backend, newM),
    newV: offsetOf(backend, newV),
    n: sizeOf(value.shape),
    learningRate: a.lr,
    beta1: a.beta1,
    beta2: a.beta2,
    epsilon: a.epsilon,
    c1: a.c1,
    c2: a.c2
  })
  return [newValue, newM, newV]
}

/** The parts of tfjs' AdamOptimizer (4.22) that `NativeAdam` reuses. */
interface AdamState {
  readonly learningRate: number
  readonly beta1: number
  readonly beta2: number
  readonly epsilon: number
  readonly accBeta1: tf.Variable
  readonly accBeta2: tf.Variable
  readonly accumulatedFirstMoment: Array<{ originalName: string; variable: tf.Variable } | undefined>
  readonly accumulatedSecondMoment: Array<{ originalName: string; variable: tf.Variable } | undefined>
}

/**
 * tfjs' Adam (same state, weights and serialisation) whose update runs as one native kernel per variable instead of
 * ~12 element-wise ops; falls back to tfjs' own update where the kernel is not registered (stock kernels, other
 * backends). Use in place of `tf.train.adam`.
 */
export class NativeAdam extends tf.AdamOptimizer {
  override applyGradients(variableGradients: Parameters<tf.AdamOptimizer["applyGradients"]>[0]): void {
    if (tf.getKernel(kernelName, tf.getBackend()) === undefined) {
      super.applyGradients(variableGradients)
      return
    }
    const self = this as unknown as AdamState
    const names = Array.isArray(variableGradients)
      ? variableGradients.map((v) => v.name)
      : Object.keys(variableGradients)
    const c1 = Math.fround(1 - self.accBeta1.dataSync()[0]!) // 1 − β1ᵗ, in float32 as tfjs computes it
    const c2 = Math.fround(1 - self.accBeta2.dataSync()[0]!)
    tf.tidy(() => {
      names.forEach((name, i) => {
        const value = tf.engine().registeredVariables[name]!
        const moment = (suffix: string) => ({
          originalName: `${name}/${suffix}`,
          variable: tf.tidy(() => tf.zerosLike(value).variable(false))
        })
        self.accumulatedFirstMoment[i] ??= moment("m")
        self.accumulatedSecondMoment[i] ??= moment("v")
        const gradient = Array.isArray(variableGradients) ? variableGradients[i]!.tensor : variableGradients[name]
        if (gradient == null) return
        const m = self.accumulatedFirstMoment[i]!.variable
        const v = self.accumulatedSecondMoment[i]!.variable
        const [newValue, newM, newV] = tf
          .engine()
          .runKernel(
            kernelName,
            { value, grad: gradient, m, v },
            { lr: self.learningRate, beta1: self.beta1, beta2: self.beta2, epsilon: self.epsilon, c1, c2 }
          ) as Array<tf.Tensor>
        m.assign(newM!)
        v.assign(newV!)
        value.assign(newValue!)
      })
      self.accBeta1.assign(tf.mul(self.accBeta1, self.beta1))
      self.accBeta2.assign(tf.mul(self.accBeta2, self.beta2))
    })
    this.incrementIterations()
  }
}

/** `tf.train.adam` with the native update (see NativeAdam). */
export const adam = (learningRate = 0.001, beta1 = 0.9, beta2 = 0.999, epsilon?: number): tf.AdamOptimizer =>
  new NativeAdam(learningRate, beta1, beta2, epsilon)
