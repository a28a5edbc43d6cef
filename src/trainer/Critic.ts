/**
 * The critic for GAE (SkyRL's critic worker): a copy of the policy's trunk with a scalar value head, trained by
 * `ValueLoss.ppo` on GAE returns with its own AdamW. V(s_t) — the value of the state in which token t is chosen —
 * is read from the hidden state of position t − 1, so values line up with per-token log-probs (index t = token t).
 *
 * Departure: SkyRL initialises the critic from a separate checkpoint when given; here it always starts as a copy of
 * the policy (its trunk) with a zero value head, which is SkyRL's default when no critic path is set.
 */
import * as tf from "../tensor/Tf.ts"
import * as Diagnostics from "../algo/Diagnostics.ts"
import * as ValueLoss from "../algo/ValueLoss.ts"
import type { OptimizerConfig } from "../config/TrainerConfig.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as Decoder from "../model/Decoder.ts"
import * as Snapshot from "../model/Snapshot.ts"
import * as Transformer from "../model/Transformer.ts"
import * as Optimizer from "./Optimizer.ts"
import * as TrainingBatch from "./TrainingBatch.ts"

export interface Critic {
  readonly model: Transformer.Transformer
  readonly head: tf.Variable // [D, 1]
  readonly optimizer: Optimizer.AdamW
}

export const make = async (policy: Transformer.Transformer, config: OptimizerConfig): Promise<Critic> => {
  // the policy's weights are downloaded before any critic tensor exists: nothing to free if the read fails
  const weights = await Snapshot.fromModel(policy, PolicyVersion.initial)
  const model = Transformer.init(policy.config, 0)
  Snapshot.load(model, weights)
  const head = tf.tidy(() => tf.variable(tf.zeros([policy.config.hiddenSize, 1]), true, `critic${model.id}/value_head`))
  const optimizer = Optimizer.make([...Transformer.trainableVariables(model), head], config)
  return { model, head, optimizer }
}

export const dispose = (critic: Critic): void => {
  critic.optimizer.dispose()
  critic.head.dispose()
  Transformer.dispose(critic.model)
}

/**
 * V(s_t) for every position, aligned with ids: [B, T] (position 0 has no preceding state: 0). Differentiable;
 * `checkpoint` recomputes each layer's activations in the backward pass (trainer.gradient_checkpointing).
 */
export const valuesTensor = (critic: Critic, batch: TrainingBatch.Batch, checkpoint = false): tf.Tensor2D =>
  tf.tidy(() => {
    const B = batch.ids.length
    const T = batch.length
    const hidden = Decoder.hiddenStates(critic.model, {
      ids: batch.ids,
      attentionMask: batch.attentionMask,
      training: true,
      checkpoint
    }) // [B·T, D]
    const v = tf.reshape(tf.matMul(hidden, critic.head), [B, T]) // v(h_t)   [B, T]
    return tf.concat([tf.zeros([B, 1]), tf.slice(v, [0, 0], [B, T - 1])], 1) as tf.Tensor2D // V(s_t) = v(h_{t−1})
  })

/** V(s_t) as plain numbers (no gradient), for GAE. Async: the values are downloaded after the forward pass. */
export const values = async (critic: Critic, batch: TrainingBatch.Batch): Promise<Array<Array<number>>> => {
  const v = valuesTensor(critic, batch) // [B, T]
  return v.array().finally(() => v.dispose())
}

/**
 * One critic optimizer step on rows [from, to): the PPO value loss against the batch's GAE returns. Async: the
 * diagnostics and the gradient norm are downloaded.
 */
export const update = async (
  critic: Critic,
  batch: TrainingBatch.Batch,
  from: number,
  to: number,
  options: {
    readonly valueClip: number
    readonly lr: number
    readonly microBatch: number
    readonly checkpoint?: boolean // trainer.gradient_checkpointing
  }
): Promise<Record<string, number>> => {
  let accumulated: tf.NamedTensorMap | undefined
  const collected: Array<Record<string, number>> = []
  const rows = to - from
  for (let a = from; a < to; a += options.microBatch) {
    const b = Math.min(to, a + options.microBatch)
    const micro = TrainingBatch.slice(batch, a, b)
    const share = (b - a) / rows
    const result = Diagnostics.variableGrads(
      () =>
        tf.tidy(() => {
          const out = ValueLoss.ppo(
            {
              values: valuesTensor(critic, micro, options.checkpoint === true),
              oldValues: tf.tensor2d(micro.values),
              returns: tf.tensor2d(micro.returns),
              lossMask: tf.tensor2d(micro.lossMask)
            },
            options.valueClip
          )
          return { loss: tf.mul(out.loss, share) as tf.Scalar, metrics: { ...out.metrics, valueLoss: out.loss } }
        }),
      [...Transformer.trainableVariables(critic.model), critic.head]
    )
    result.value.dispose()
    accumulated = Optimizer.accumulate(accumulated, result.grads)
    collected.push(await Diagnostics.read(result.metrics))
  }
  if (accumulated === undefined) return {}
  const summed = accumulated
  const gradNorm = await critic.optimizer.apply(summed, options.lr).finally(() => tf.dispose(summed))
  const mean = (key: string) => collected.reduce((s, m) => s + (m[key] ?? 0), 0) / Math.max(1, collected.length)
  return {
    "critic/value_loss": mean("valueLoss"),
    "critic/values_mean": mean("valuesMean"),
    "critic/values_clipfrac": mean("valuesClipfrac"),
    "critic/grad_norm": gradNorm
  }
}
