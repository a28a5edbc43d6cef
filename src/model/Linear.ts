/**
 * The linear layers of the differentiable forward (Decoder.ts), each one op with a custom gradient: a projection
 * `x @ W`, a LoRA projection, and the residual stream's add.
 *
 * Departure from the HF code, on purpose (it does not change the maths): linear gradients go through `matMul` (a custom
 * gradient) that transposes explicitly on stock kernels, so the backward matmuls are untransposed too (native matmuls
 * take the transposes as flags instead). Weights are held `[in, out]` (Transformer.ts), so the forward is `x @ W`.
 */
import * as tf from "../tensor/Tf.ts"
import * as Fused from "./Fused.ts"

/** `x @ W` for 2-D x with untransposed matmuls in both directions (see the module header). */
export const matMul: (x: tf.Tensor2D, w: tf.Tensor2D) => tf.Tensor2D = tf.customGrad(
  // biome-ignore lint/suspicious/noExplicitAny: tfjs' CustomGradientFunc types its inputs as Tensor[] spread
  ((x: tf.Tensor2D, w: tf.Tensor2D, save: any) => {
    save([x, w])
    return {
      value: tf.matMul(x, w), // [N, out]
      gradFunc: (dy: tf.Tensor2D, saved: Array<tf.Tensor2D>) => {
        const [xs, ws] = saved as [tf.Tensor2D, tf.Tensor2D]
        // Native matmuls take the transposes as flags (no copies); stock wasm runs transposed matmuls ~10× slower.
        if (Fused.nativeAvailable()) return [tf.matMul(dy, ws, false, true), tf.matMul(xs, dy, true, false)]
        return [tf.matMul(dy, tf.transpose(ws)), tf.matMul(tf.transpose(xs), dy)] // dx [N, in], dW [in, out]
      }
    }
    // biome-ignore lint/suspicious/noExplicitAny: see above
  }) as any
) as unknown as (x: tf.Tensor2D, w: tf.Tensor2D) => tf.Tensor2D

/**
 * A LoRA projection in one op: `x @ W + s · (xLora @ A) @ B` for a frozen W (xLora is x, or x with the adapter's
 * dropout). Composed from tfjs ops, each keeps its inputs for the backward pass (the sum both of its [N, out]
 * operands, the scaling its [N, out] product): three [N, out] tensors per projection, most of a LoRA step's memory
 * at real sizes. This keeps xLora and s · xLora @ A [N, r]:
 * dx = dy Wᵀ + s (dy Bᵀ) Aᵀ, dA = s xLoraᵀ (dy Bᵀ), dB = (s xLora A)ᵀ dy.
 */
export const lora = (
  x: tf.Tensor2D,
  xLora: tf.Tensor2D,
  w: tf.Tensor2D,
  a: tf.Tensor2D,
  b: tf.Tensor2D,
  scale: number
): tf.Tensor2D => {
  const native = Fused.nativeAvailable()
  const mmT = (p: tf.Tensor2D, q: tf.Tensor2D) =>
    native ? tf.matMul(p, q, false, true) : tf.matMul(p, tf.transpose(q))
  const Tmm = (p: tf.Tensor2D, q: tf.Tensor2D) =>
    native ? tf.matMul(p, q, true, false) : tf.matMul(tf.transpose(p), q)
  const dropped = xLora !== x
  const op = tf.customGrad((...args: Array<tf.Tensor | tf.GradSaveFunc>) => {
    const [xIn, xlIn, aIn, bIn] = (dropped ? args.slice(0, 4) : [args[0], ...args.slice(0, 3)]) as Array<tf.Tensor2D>
    const save = args[args.length - 1] as tf.GradSaveFunc
    const xas = tf.mul(tf.matMul(xlIn!, aIn!), scale) as tf.Tensor2D // s · xLora A [N, r]
    save([xlIn!, xas, aIn!, bIn!])
    return {
      value: tf.add(tf.matMul(xIn!, w), tf.matMul(xas, bIn!)), // [N, out]
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) => {
        const [xl, xa, aS, bS] = saved as [tf.Tensor2D, tf.Tensor2D, tf.Tensor2D, tf.Tensor2D]
        const g = dy as tf.Tensor2D
        const gb = tf.mul(mmT(g, bS), scale) as tf.Tensor2D // s · dy Bᵀ [N, r]
        const dA = Tmm(xl, gb) // [in, r]
        const dB = Tmm(xa, g) // [r, out]
        const dxBase = mmT(g, w) // [N, in]
        const dxLora = mmT(gb, aS) // [N, in]
        return dropped ? [dxBase, dxLora, dA, dB] : [tf.add(dxBase, dxLora), dA, dB]
      }
    }
  }) as unknown as (...inputs: Array<tf.Tensor>) => tf.Tensor2D
  return dropped ? op(x, xLora, a, b) : op(x, a, b)
}

/**
 * `a + b` keeping nothing for the backward pass (tfjs' Add keeps both operands, for broadcasting, which a residual
 * sum of equal shapes does not need): the residual stream's adds.
 */
export const residualAdd = (a: tf.Tensor2D, b: tf.Tensor2D): tf.Tensor2D =>
  (
    tf.customGrad((...args: Array<tf.Tensor | tf.GradSaveFunc>) => {
      ;(args[2] as tf.GradSaveFunc)([])
      return {
        value: tf.add(args[0] as tf.Tensor, args[1] as tf.Tensor),
        gradFunc: (dy: tf.Tensor) => [dy, tf.clone(dy)] // two tensors: each input's gradient is its own
      }
    }) as unknown as (a: tf.Tensor, b: tf.Tensor) => tf.Tensor2D
  )(a, b)
