/**
 * AdamW (Loshchilov & Hutter 2019) with global-norm gradient clipping and a warmup + cosine learning-rate schedule.
 * tfjs's Adam couples weight decay into the gradient; AdamW decays the weights directly:
 *
 *   g ← g · min(1, c / ‖g‖₂)                                  (clip the global norm to c = max_grad_norm)
 *   m ← β₁ m + (1 − β₁) g        v ← β₂ v + (1 − β₂) g²
 *   θ ← θ − η_t · ( m / (1 − β₁ᵗ) / (√(v / (1 − β₂ᵗ)) + ε) + λ θ )
 *
 * Weight decay skips 1-D parameters (norm gains, biases), as HF's trainer does. The optimizer owns its moment
 * tensors (style.md §17): `dispose` frees them; `state`/`restore` move them as plain arrays for checkpoints.
 */
import * as tf from "../tensor/Tf.ts"
import type { OptimizerConfig } from "../config/TrainerConfig.ts"

/** η_t: linear warmup to `lr`, then constant or cosine decay to `lr · min_lr_ratio` at `totalSteps`. */
export const learningRate = (c: OptimizerConfig, step: number, totalSteps: number): number => {
  if (c.warmup_steps > 0 && step < c.warmup_steps) return (c.lr * (step + 1)) / c.warmup_steps
  if (c.scheduler === "constant") return c.lr
  const span = Math.max(1, totalSteps - c.warmup_steps)
  const progress = Math.min(1, Math.max(0, (step - c.warmup_steps) / span))
  const floor = c.lr * c.min_lr_ratio
  return floor + 0.5 * (c.lr - floor) * (1 + Math.cos(Math.PI * progress))
}

export interface State {
  readonly step: number
  readonly names: ReadonlyArray<string>
  readonly m: ReadonlyArray<Float32Array>
  readonly v: ReadonlyArray<Float32Array>
}

export interface AdamW {
  /**
   * Apply one update; resolves to the pre-clip global gradient norm. `grads` keyed by variable name, owned by the
   * caller (kept alive until this resolves). Async: the norm is downloaded (webgpu has no synchronous read).
   */
  readonly apply: (grads: tf.NamedTensorMap, lr: number) => Promise<number>
  readonly step: () => number
  /** The moments as plain arrays (an async download). */
  readonly state: () => Promise<State>
  readonly restore: (state: State) => void
  readonly dispose: () => void
}

const withoutModelId = (name: string): string => name.replace(/^t\d+\//, "")

/** Gradient accumulation: the sum of `accumulated` and `grads`, name by name; both inputs are disposed. */
export const accumulate = (accumulated: tf.NamedTensorMap | undefined, grads: tf.NamedTensorMap): tf.NamedTensorMap => {
  if (accumulated === undefined) return grads
  const sum: tf.NamedTensorMap = {}
  for (const [name, g] of Object.entries(grads)) {
    sum[name] = tf.add(accumulated[name]!, g)
    accumulated[name]!.dispose()
    g.dispose()
  }
  return sum
}

export const globalNorm = (grads: ReadonlyArray<tf.Tensor>): tf.Scalar =>
  tf.tidy(() => tf.sqrt(tf.addN(grads.map((g) => tf.sum(tf.square(g))))) as tf.Scalar)

export const make = (variables: ReadonlyArray<tf.Variable>, c: OptimizerConfig): AdamW => {
  const byName = new Map(variables.map((v) => [v.name, v]))
  const m = new Map<string, tf.Variable>()
  const v = new Map<string, tf.Variable>()
  let t = 0
  const slot = (store: Map<string, tf.Variable>, p: tf.Variable) => {
    let s = store.get(p.name)
    if (s === undefined) {
      s = tf.tidy(() => tf.variable(tf.zerosLike(p), false))
      store.set(p.name, s)
    }
    return s
  }
  const apply = async (grads: tf.NamedTensorMap, lr: number): Promise<number> => {
    const entries = Object.entries(grads).filter(([name]) => byName.has(name))
    if (entries.length === 0) return 0
    const normTensor = globalNorm(entries.map(([, g]) => g))
    // the clip scale is computed in JS from the downloaded norm (as float32 → number), so every backend clips alike
    const norm = (await normTensor.data().finally(() => normTensor.dispose()))[0]!
    if (!Number.isFinite(norm)) throw new Error(`AdamW: non-finite gradient norm (${norm}) at step ${t}`)
    const scale = c.max_grad_norm > 0 && norm > c.max_grad_norm ? c.max_grad_norm / (norm + 1e-6) : 1
    t += 1
    const bias1 = 1 - c.beta1 ** t
    const bias2 = 1 - c.beta2 ** t
    for (const [name, g] of entries) {
      const p = byName.get(name)!
      const mp = slot(m, p)
      const vp = slot(v, p)
      tf.tidy(() => {
        const gs = scale === 1 ? g : tf.mul(g, scale)
        const m1 = tf.add(tf.mul(mp, c.beta1), tf.mul(gs, 1 - c.beta1))
        const v1 = tf.add(tf.mul(vp, c.beta2), tf.mul(tf.square(gs), 1 - c.beta2))
        mp.assign(m1)
        vp.assign(v1)
        const update = tf.div(tf.div(m1, bias1), tf.add(tf.sqrt(tf.div(v1, bias2)), c.eps))
        const decay = p.rank > 1 && c.weight_decay > 0 ? tf.add(update, tf.mul(p, c.weight_decay)) : update
        p.assign(tf.sub(p, tf.mul(decay, lr)))
      })
    }
    return norm
  }
  return {
    apply,
    step: () => t,
    state: async () => {
      // t is read and every download started before the first await: the step and the moments are of one moment
      const step = t
      const names = [...m.keys()]
      const mData = Promise.all(names.map((name) => m.get(name)!.data() as Promise<Float32Array>))
      const vData = Promise.all(names.map((name) => v.get(name)!.data() as Promise<Float32Array>))
      return { step, names, m: await mData, v: await vData }
    },
    restore: (state) => {
      t = state.step
      // variable names are `t<model id>/<weight>`; the id may differ between the process that saved and this one
      const byWeight = new Map(variables.map((v) => [withoutModelId(v.name), v]))
      state.names.forEach((name, i) => {
        const p = byName.get(name) ?? byWeight.get(withoutModelId(name))
        if (p === undefined) throw new Error(`AdamW.restore: no parameter ${name}`)
        tf.tidy(() => {
          slot(m, p).assign(tf.tensor(state.m[i]!, p.shape))
          slot(v, p).assign(tf.tensor(state.v[i]!, p.shape))
        })
      })
    },
    dispose: () => {
      for (const x of [...m.values(), ...v.values()]) x.dispose()
      m.clear()
      v.clear()
    }
  }
}
