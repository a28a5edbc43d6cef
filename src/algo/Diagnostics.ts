/**
 * Carrying a loss's diagnostics through `tf.variableGrads`.
 *
 * `tf.variableGrads(f)` runs `f` inside its own tidy and keeps only the returned scalar, so metric tensors built next
 * to the loss would be disposed before anyone reads them. {@link variableGrads} keeps them: the caller owns the
 * returned `value`, `grads` and `metrics` and frees them with {@link dispose} (or reads and frees metrics with
 * {@link read}, outside any tidy: it awaits the download; {@link readSync} where the backend reads synchronously).
 */
import * as tf from "../tensor/Tf.ts"

/** A scalar loss and named scalar diagnostics. */
export interface LossWithMetrics<M extends Readonly<Record<string, tf.Scalar>>> {
  readonly loss: tf.Scalar
  readonly metrics: M
}

/**
 * `tf.variableGrads` for a loss that returns diagnostics: gradients of `loss` w.r.t. `varList` (default: all
 * trainable variables), and the metrics kept alive for the caller.
 */
export const variableGrads = <M extends Readonly<Record<string, tf.Scalar>>>(
  f: () => LossWithMetrics<M>,
  varList?: Array<tf.Variable>
): { readonly value: tf.Scalar; readonly grads: tf.NamedTensorMap; readonly metrics: M } => {
  let metrics: M | undefined
  const { value, grads } = tf.variableGrads(() => {
    const out = f()
    // kept: owned by our caller from here on, freed by `dispose`/`read`
    for (const metric of Object.values(out.metrics)) tf.keep(metric)
    metrics = out.metrics
    return out.loss
  }, varList)
  return { value, grads, metrics: metrics! }
}

/** Read every metric as a number and dispose the tensors. Async: webgpu has no synchronous download. */
export const read = async <M extends Readonly<Record<string, tf.Scalar>>>(
  metrics: M
): Promise<{ [K in keyof M]: number }> => {
  const entries = Object.entries(metrics)
  const data = await Promise.all(entries.map(([, x]) => x.data())).finally(() => tf.dispose(entries.map(([, x]) => x)))
  return Object.fromEntries(entries.map(([key], i) => [key, data[i]![0]!])) as { [K in keyof M]: number }
}

/**
 * {@link read}, synchronously (`dataSync`), for the plain-array functions: every backend but webgpu in Node reads
 * synchronously (see `Matrix.assertSyncRead`).
 */
export const readSync = <M extends Readonly<Record<string, tf.Scalar>>>(metrics: M): { [K in keyof M]: number } => {
  const entries = Object.entries(metrics)
  try {
    return Object.fromEntries(entries.map(([key, x]) => [key, x.dataSync()[0]!])) as { [K in keyof M]: number }
  } finally {
    tf.dispose(entries.map(([, x]) => x))
  }
}

/** Dispose what {@link variableGrads} returned. */
export const dispose = (result: {
  readonly value: tf.Scalar
  readonly grads: tf.NamedTensorMap
  readonly metrics: Readonly<Record<string, tf.Scalar>>
}): void => {
  result.value.dispose()
  tf.dispose(result.grads)
  tf.dispose(Object.values(result.metrics))
}
