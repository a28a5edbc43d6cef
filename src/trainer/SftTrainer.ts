/**
 * Supervised fine-tuning: next-token cross-entropy on the loss-masked tokens of chat conversations (SftDataset.ts:
 * the assistant turns, end-of-turn token included), token-mean over the whole optimizer batch:
 *
 *   L(θ) = −(1 / Σ_{b,t} m_{b,t}) · Σ_{b,t} m_{b,t} · log π_θ(x_{b,t} | x_{b,<t})
 *
 * Each step takes `batch_size` sequences in a seeded shuffled order (reshuffled every epoch), runs them in
 * micro-batches of `micro_batch_size` and sums their gradients (each micro-batch loss is divided by the token count of
 * the WHOLE batch, so accumulation gives exactly the gradient of L, whatever the micro-batch size), then applies one
 * AdamW update (Optimizer.ts: global-norm clipping, warmup + cosine learning rate over the run's steps).
 *
 * Output goes through SftOutput, which RunLayers.sft builds over Metrics and Checkpointer in `output_dir` (opened as a
 * run directory: config.yaml written, an earlier run's files moved to `earlier/`): `metrics.jsonl` (one `train` line
 * per logged step, `MetricsRecord`), and every `save_interval` steps and at the end a checkpoint `step-N/` (a HF
 * directory that loads as `model.path`, plus optimizer.safetensors and trainer_state.json with SFT's own state under
 * `data.sft`) named by `latest`, both in `output_dir` itself. Progress lines go to stderr.
 *
 * Departures, on purpose:
 * 1. The last partial batch of an epoch is kept (HF's `dataloader_drop_last: false`); its token-mean uses its own
 *    token count.
 * 2. `train/loss` in a record is the token-weighted mean over the steps since the previous record, not the last step.
 * 3. Checkpoints hold the optimizer moments (Checkpointer writes them for every run), but `sft` does not resume from
 *    them: a checkpoint starts a run as `model.path`.
 * 4. With `model.lora.rank > 0` only the adapters train; a checkpoint holds the MERGED weights (loadable as
 *    `model.path` by every command, HF and vLLM) plus the adapter alone in `adapter/` (PEFT layout).
 */
import * as tf from "../tensor/Tf.ts"
import { Clock, Console, Context, Effect, Schema } from "effect"
import type { LoraConfig } from "../config/ModelConfig.ts"
import type { SftConfig } from "../config/SftConfig.ts"
import type * as SftDataset from "../data/SftDataset.ts"
import { type CheckpointError, ConfigError } from "../domain/Errors.ts"
import * as LogProbs from "../model/LogProbs.ts"
import * as Lora from "../model/Lora.ts"
import * as HfConfig from "../model/ModelConfig.ts"
import * as Prng from "../model/Prng.ts"
import * as Transformer from "../model/Transformer.ts"
import { Tokenizer } from "../tokenizer/Tokenizer.ts"
import * as Optimizer from "./Optimizer.ts"
import { loraOptions as modelLoraOptions, PolicyModel } from "./PolicyModel.ts"
import type { TrainerState } from "./Trainer.ts"

/**
 * Where a run's metrics lines and checkpoints go. RunLayers.sft builds it over Metrics (`train` lines of
 * `<output_dir>/metrics.jsonl`) and Checkpointer (`step-N/` and `latest` in `output_dir`): both sit above the
 * trainer's room, as they do for the RL loop.
 */
export class SftOutput extends Context.Service<
  SftOutput,
  {
    /** One metrics line for `step`; names from MetricKeys (`epoch`, `train/*`, `eval/loss`). */
    readonly record: (step: number, values: Readonly<Record<string, number>>) => Effect.Effect<void>
    /** A checkpoint of `model` after `step`, SFT's own state in `data`; returns its directory. */
    readonly save: (
      step: number,
      model: Transformer.Transformer,
      trainer: TrainerState,
      data: Readonly<Record<string, unknown>>
    ) => Effect.Effect<string, CheckpointError>
  }
>()("rl/trainer/SftOutput") {}

export interface Options {
  readonly config: SftConfig
  readonly train: ReadonlyArray<SftDataset.Example>
  readonly eval?: ReadonlyArray<SftDataset.Example>
  /** Asked after each step: true ends the run there, with a checkpoint (the CLI's graceful stop on Ctrl-C/SIGTERM). */
  readonly stopRequested?: () => boolean
  /** `model.lora`: with rank > 0, adapters are attached (seeded by `sft.seed`) and only they train */
  readonly lora?: LoraConfig
}

/** The run's result; the `sft` command prints it (with `event: "summary"`) as its last stdout line. */
export interface Summary {
  readonly steps: number
  readonly epochs: number // passes over the data, fractional
  readonly trainLoss: number // token-mean loss of the last logged window
  readonly firstLoss: number // loss of the first step, before any update
  readonly evalLoss: number | null // at the end; null without eval data
  readonly outputDir: string
  readonly checkpoint: string // the final step-N directory
  readonly seconds: number
  readonly tokens: number // real (non-padding) tokens trained on
  readonly stopped?: "signal" // stopped early by a graceful stop (Ctrl-C, SIGTERM) after a checkpointed step
}

/** One metrics.jsonl line of an SFT run, as Metrics writes it (`event`, `step`, `time`, then the values). */
export const MetricsRecord = Schema.Struct({
  event: Schema.Literal("train"),
  step: Schema.Int,
  time: Schema.Finite, // seconds since the run's Metrics started
  epoch: Schema.Finite,
  "train/loss": Schema.Finite,
  "train/lr": Schema.Finite,
  "train/grad_norm": Schema.Finite,
  "train/tokens_per_second": Schema.Finite,
  "train/loss_tokens": Schema.Int,
  "eval/loss": Schema.optionalKey(Schema.Finite)
})
export type MetricsRecord = typeof MetricsRecord.Type

/** `model.lora` as the adapters take it; undefined unless rank > 0 (no adapters). */
export const loraOptions = (config: LoraConfig | undefined): Lora.LoraOptions | undefined =>
  config === undefined ? undefined : modelLoraOptions(config)

/** A micro-batch, right-padded to its longest sequence. */
export interface Padded {
  readonly ids: Array<Array<number>> // [b, L]
  readonly attentionMask: Array<Array<number>> // [b, L], 1 = real token
  readonly lossMask: Array<Array<number>> // [b, L]
}

export const pad = (examples: ReadonlyArray<SftDataset.Example>, padId: number): Padded => {
  const L = Math.max(...examples.map((e) => e.ids.length))
  const fill = <A>(xs: ReadonlyArray<A>, value: A) => [...xs, ...new Array<A>(L - xs.length).fill(value)]
  return {
    ids: examples.map((e) => fill(e.ids, padId)),
    attentionMask: examples.map((e) =>
      fill(
        e.ids.map(() => 1),
        0
      )
    ),
    lossMask: examples.map((e) => fill<number>(e.lossMask, 0))
  }
}

const chunks = <A>(xs: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> =>
  Array.from({ length: Math.ceil(xs.length / size) }, (_, i) => xs.slice(i * size, (i + 1) * size))

const lossTokensOf = (examples: ReadonlyArray<SftDataset.Example>): number =>
  examples.reduce((n, e) => n + e.lossMask.reduce<number>((a, b) => a + b, 0), 0)

/** Micro-batches of rows of similar length (less padding); the sums over them do not depend on the grouping. */
const byLength = (examples: ReadonlyArray<SftDataset.Example>, size: number) =>
  chunks(
    [...examples].sort((a, b) => a.ids.length - b.ids.length),
    size
  )

/** Σ_{b,t} m·(−log π(x_t | x_<t)) over a padded micro-batch: a scalar, differentiable. Call inside tidy. */
const maskedNllSum = (
  model: Transformer.Transformer,
  micro: Padded,
  training: boolean,
  checkpoint = false
): tf.Scalar => {
  const { logprobs } = LogProbs.ofSequences(model, {
    ids: micro.ids,
    attentionMask: micro.attentionMask,
    training,
    checkpoint
  }) // [b, L]
  const mask = tf.tensor2d(micro.lossMask, [micro.ids.length, micro.ids[0]!.length]) // [b, L]
  return tf.neg(tf.sum(tf.mul(logprobs, mask))) as tf.Scalar
}

/**
 * Token-mean loss of `examples` under the model's current weights, no gradient. NaN when nothing is masked in.
 * Async: each micro-batch's sum is downloaded (webgpu has no synchronous read).
 */
export const evaluate = async (
  model: Transformer.Transformer,
  examples: ReadonlyArray<SftDataset.Example>,
  options: { readonly microBatchSize: number; readonly padId: number }
): Promise<number> => {
  let nll = 0
  for (const chunk of byLength(examples, options.microBatchSize)) {
    const sum = tf.tidy(() => maskedNllSum(model, pad(chunk, options.padId), false)) // []
    nll += (await sum.data().finally(() => sum.dispose()))[0]!
  }
  const count = lossTokensOf(examples)
  return count === 0 ? Number.NaN : nll / count
}

export interface StepStats {
  readonly loss: number // L of the batch, before the update
  readonly gradNorm: number // before clipping
  readonly tokens: number // real tokens in the batch
  readonly lossTokens: number
}

/**
 * One optimizer step on `batch`: accumulate ∇L over micro-batches, then AdamW at learning rate `lr`. Async: the loss
 * and the gradient norm are downloaded.
 * @throws Error on a non-finite loss (nothing is applied then).
 */
export const trainStep = async (
  model: Transformer.Transformer,
  optimizer: Optimizer.AdamW,
  variables: Array<tf.Variable>,
  batch: ReadonlyArray<SftDataset.Example>,
  options: {
    readonly microBatchSize: number
    readonly padId: number
    readonly lr: number
    readonly checkpoint?: boolean // sft.gradient_checkpointing
  }
): Promise<StepStats> => {
  const lossTokens = lossTokensOf(batch)
  const tokens = batch.reduce((n, e) => n + e.ids.length, 0)
  if (lossTokens === 0) return { loss: 0, gradNorm: 0, tokens, lossTokens }
  let accumulated: tf.NamedTensorMap | undefined
  let loss = 0
  for (const chunk of byLength(batch, options.microBatchSize)) {
    const micro = pad(chunk, options.padId)
    // this micro-batch's share of L: its masked NLL sum over the batch's token count
    const { value, grads } = tf.variableGrads(
      () => tf.div(maskedNllSum(model, micro, true, options.checkpoint === true), lossTokens) as tf.Scalar,
      variables
    )
    loss += (await value.data().finally(() => value.dispose()))[0]!
    if (accumulated === undefined) accumulated = grads
    else {
      const sum: tf.NamedTensorMap = {}
      for (const [name, g] of Object.entries(grads)) {
        sum[name] = tf.add(accumulated[name]!, g)
        accumulated[name]!.dispose()
        g.dispose()
      }
      accumulated = sum
    }
  }
  if (!Number.isFinite(loss)) {
    tf.dispose(accumulated)
    throw new Error(`SFT: non-finite loss (${loss}) on a batch of ${batch.length} sequences`)
  }
  const summed = accumulated!
  const gradNorm = await optimizer.apply(summed, options.lr).finally(() => tf.dispose(summed))
  return { loss, gradNorm, tokens, lossTokens }
}

/** The example order of one epoch: a Fisher–Yates shuffle seeded by (seed, epoch), or the file order. */
export const epochOrder = (n: number, seed: number, epoch: number, shuffle: boolean): Array<number> => {
  const order = Array.from({ length: n }, (_, i) => i)
  if (!shuffle) return order
  const rng = Prng.make((seed ^ Math.imul(epoch + 1, 0x9e3779b1)) >>> 0)
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rng.next() * (i + 1))
    ;[order[i], order[j]] = [order[j]!, order[i]!]
  }
  return order
}

/** Optimizer steps of a run: `max_steps`, else `epochs` × ⌈examples / batch_size⌉. */
export const totalSteps = (config: SftConfig, examples: number): number =>
  config.max_steps ?? config.epochs * Math.ceil(examples / config.batch_size)

const seconds = (s: number): string => (s >= 120 ? `${(s / 60).toFixed(1)}m` : `${s.toFixed(1)}s`)

/**
 * Train the PolicyModel's weights on `options.train`; metrics lines and checkpoints go to SftOutput. A non-finite loss
 * is a defect (Effect.die with the step).
 */
export const run = Effect.fn("SftTrainer.run")(function* (options: Options) {
  const c = options.config
  const { model } = yield* PolicyModel
  const tokenizer = yield* Tokenizer
  const output = yield* SftOutput
  const train = options.train
  const evalSet = options.eval ?? []
  if (train.length === 0) {
    return yield* new ConfigError({ path: "sft.data", message: "no training examples (sft.data is empty)" })
  }
  if (tokenizer.vocabSize > model.config.vocabSize) {
    return yield* new ConfigError({
      path: "model",
      message: `the tokenizer has ${tokenizer.vocabSize} ids but the model's vocabulary is ${model.config.vocabSize}`
    })
  }
  for (const e of [...train, ...evalSet]) {
    if (e.ids.length > model.config.maxPositionEmbeddings) {
      return yield* new ConfigError({
        path: "sft.max_length",
        message: `${e.source}: ${e.ids.length} tokens exceed the model's ${model.config.maxPositionEmbeddings} positions`
      })
    }
    if (e.ids.some((id) => id >= model.config.vocabSize)) {
      return yield* new ConfigError({ path: "sft.data", message: `${e.source}: a token id exceeds the vocabulary` })
    }
  }
  const lora = loraOptions(options.lora)
  if (lora !== undefined) {
    yield* Effect.try({
      try: () => Lora.attach(model, lora, c.seed),
      catch: (cause) =>
        new ConfigError({ path: "model.lora", message: cause instanceof Error ? cause.message : String(cause) })
    })
  }
  const variables = Transformer.trainableVariables(model)
  const optimizer = yield* Effect.acquireRelease(
    Effect.sync(() => Optimizer.make(variables, c.optimizer)),
    (o) => Effect.sync(() => o.dispose())
  )
  const stepsPerEpoch = Math.ceil(train.length / c.batch_size)
  const total = totalSteps(c, train.length)
  const micro = { microBatchSize: c.micro_batch_size, padId: tokenizer.padId }
  const outputDir = c.output_dir

  /** A checkpoint of the step: the RL trainer's state shape (no KL term here), SFT's own under `data.sft`. */
  const save = Effect.fnUntraced(function* (step: number, sft: Readonly<Record<string, unknown>>) {
    const moments = yield* Effect.promise(() => optimizer.state())
    return yield* output.save(step, model, { step, version: moments.step, optimizer: moments, klCoef: 0 }, { sft })
  })

  yield* Console.error(
    `sft: ${train.length} sequences (${train.reduce((n, e) => n + e.ids.length, 0)} tokens, ` +
      `${lossTokensOf(train)} in the loss), ${evalSet.length} held out; ` +
      `${HfConfig.parameterCount(model.config).toLocaleString()} parameters; ` +
      `${total} steps of ${c.batch_size} (micro-batches of ${c.micro_batch_size}), ${stepsPerEpoch} steps per epoch`
  )
  const started = yield* Clock.currentTimeMillis
  let order: Array<number> = []
  let window = { nll: 0, lossTokens: 0, tokens: 0, trainMs: 0 }
  let trainLoss = Number.NaN
  let firstLoss = Number.NaN
  let evalLoss: number | undefined
  let tokens = 0
  let checkpoint = ""
  let stoppedAt: number | undefined
  for (let step = 1; step <= total; step++) {
    const epoch = Math.floor((step - 1) / stepsPerEpoch)
    const position = (step - 1) % stepsPerEpoch
    if (position === 0) order = epochOrder(train.length, c.seed, epoch, c.shuffle)
    const batch = order.slice(position * c.batch_size, (position + 1) * c.batch_size).map((i) => train[i]!)
    const lr = Optimizer.learningRate(c.optimizer, step - 1, total)
    const stepStarted = yield* Clock.currentTimeMillis
    const stats = yield* Effect.tryPromise({
      try: () => trainStep(model, optimizer, variables, batch, { ...micro, lr, checkpoint: c.gradient_checkpointing }),
      catch: (cause) => new Error(`step ${step}: ${cause instanceof Error ? cause.message : String(cause)}`)
    }).pipe(Effect.orDie)
    if (step === 1) firstLoss = stats.loss
    tokens += stats.tokens
    window = {
      ...window,
      nll: window.nll + stats.loss * stats.lossTokens,
      lossTokens: window.lossTokens + stats.lossTokens,
      tokens: window.tokens + stats.tokens,
      trainMs: window.trainMs + ((yield* Clock.currentTimeMillis) - stepStarted)
    }
    const stopped = step < total && options.stopRequested?.() === true // Ctrl-C / SIGTERM: the last step, checkpointed
    const last = step === total || stopped
    if (stopped) yield* Effect.logInfo(`stop requested: checkpointing step ${step} and stopping`)
    const evaluated =
      evalSet.length > 0 && (last || (c.eval_interval > 0 && step % c.eval_interval === 0))
        ? yield* Effect.promise(() => evaluate(model, evalSet, micro))
        : undefined
    if (evaluated !== undefined) evalLoss = evaluated
    if (last || evaluated !== undefined || step % c.log_interval === 0) {
      const now = yield* Clock.currentTimeMillis
      trainLoss = window.lossTokens === 0 ? 0 : window.nll / window.lossTokens
      const tokensPerSecond = window.tokens / Math.max(1e-3, window.trainMs / 1000) // training only, not eval
      const elapsed = (now - started) / 1000
      const epoch = step / stepsPerEpoch
      const values = {
        epoch,
        "train/loss": trainLoss,
        "train/lr": lr,
        "train/grad_norm": stats.gradNorm,
        "train/tokens_per_second": tokensPerSecond,
        "train/loss_tokens": window.lossTokens,
        ...(evaluated === undefined ? {} : { "eval/loss": evaluated })
      }
      yield* output.record(step, values)
      yield* Console.error(
        `sft step ${step}/${total} epoch ${epoch.toFixed(2)} loss ${trainLoss.toFixed(4)}` +
          (evaluated === undefined ? "" : ` eval_loss ${evaluated.toFixed(4)}`) +
          ` lr ${lr.toExponential(2)} grad_norm ${stats.gradNorm.toFixed(3)} tok/s ${tokensPerSecond.toFixed(0)}` +
          ` elapsed ${seconds(elapsed)} eta ${seconds((elapsed / step) * (total - step))}`
      )
      window = { nll: 0, lossTokens: 0, tokens: 0, trainMs: 0 }
    }
    if (last || (c.save_interval > 0 && step % c.save_interval === 0)) {
      checkpoint = yield* save(step, {
        epoch: step / stepsPerEpoch,
        total_steps: total,
        train_loss: trainLoss,
        eval_loss: evalLoss ?? null,
        learning_rate: lr,
        seed: c.seed,
        loss_on: c.loss_on
      })
    }
    yield* Effect.yieldNow
    if (stopped) {
      stoppedAt = step
      break
    }
  }
  const summary: Summary = {
    steps: stoppedAt ?? total,
    epochs: total / stepsPerEpoch,
    trainLoss,
    firstLoss,
    evalLoss: evalLoss ?? null,
    outputDir,
    checkpoint,
    seconds: ((yield* Clock.currentTimeMillis) - started) / 1000,
    tokens,
    ...(stoppedAt === undefined ? {} : { stopped: "signal" as const })
  }
  return summary
}, Effect.scoped)
