/**
 * Activation recompute (gradient checkpointing, Chen et al. 2016): run a block of the forward pass without recording
 * its intermediates on the tape, keep only its inputs, and in the backward pass run the block again (taped) and
 * differentiate that. Memory: one block's activations at a time instead of all of them; cost: one more forward.
 *
 * Built on `tf.customGrad`, whose forward already runs with the tape off and its temporaries in a tidy. What it does
 * not do, and this module does:
 * 1. Gradients flow only to the custom op's explicit inputs: a variable read inside the block would get none (its
 *    use is not on the tape), so every tensor that needs a gradient is an input (`inputs`).
 * 2. The forward's tidy frees whatever the block closes over once the forward is done (RoPE tables, the mask, the
 *    block input itself), so they are saved (`save`: a reference, not a copy) and the recompute reads the saved ones.
 * 3. tfjs' nested `tf.grads` inside a backward pass assumes it is the outermost gradient call: it replaces the
 *    engine's active tape with its own and, when done, sets it to null, after which the outer `gradients` call throws
 *    (it walks the active tape to free its saved tensors). The recompute puts the outer tape back.
 */
import * as tf from "../tensor/Tf.ts"

interface EngineTape {
  readonly state: { activeTape: unknown }
}

/** Run `f` (which calls `tf.grads`) and restore the engine's active tape afterwards (point 3). */
const keepingOuterTape = <A>(f: () => A): A => {
  const state = (tf.engine() as unknown as EngineTape).state
  const outer = state.activeTape
  try {
    return f()
  } finally {
    state.activeTape = outer
  }
}

/**
 * `f(inputs, constants)`, recomputed in the backward pass instead of kept. Gradients flow to each of `inputs`;
 * `constants` get none (their values are read again by the recompute, so `f` must not depend on anything else that
 * changes or is freed before the backward pass). `f` must be deterministic: draw random masks from a seed.
 * Pure tensor code: call inside `tf.tidy`.
 */
export const checkpointed = <T extends tf.Tensor>(
  f: (inputs: ReadonlyArray<tf.Tensor>, constants: ReadonlyArray<tf.Tensor>) => T,
  inputs: ReadonlyArray<tf.Tensor>,
  constants: ReadonlyArray<tf.Tensor>
): T => {
  const n = inputs.length
  const op = tf.customGrad((...args: Array<tf.Tensor | tf.GradSaveFunc>) => {
    const save = args[n] as tf.GradSaveFunc
    const xs = args.slice(0, n) as Array<tf.Tensor>
    save([...xs, ...constants])
    return {
      value: f(xs, constants), // taped off: its intermediates die with the custom op's tidy
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) => {
        const kept = saved.slice(n)
        return keepingOuterTape(() => tf.grads((...zs: Array<tf.Tensor>) => f(zs, kept))(saved.slice(0, n), dy))
      }
    }
  })
  return op(...inputs) as T
}
