/**
 * `sft --config FILE [key.path=value ...]`: supervised fine-tuning of `model` on the chat rows of `sft.data`
 * (default: `data.train`), eval loss on `sft.eval_data` (default: `data.val`). Progress goes to stderr; the last
 * stdout line is `{"event":"summary","steps":…,"trainLoss":…,"evalLoss":…,"outputDir":…,"seconds":…,…}`.
 *
 * `run(config)` is the same program for embedding (the quickstart calls it): it initialises the tensor backend,
 * loads the tokenizer and the data, and runs SftTrainer with the PolicyModel of `config.model`.
 */
import { Console, Effect, type FileSystem, type Path } from "effect"
import { Command } from "effect/cli"
import * as TensorBackend from "../backend/TensorBackend.ts"
import type { RunConfig } from "../config/RunConfig.ts"
import * as SftDataset from "../data/SftDataset.ts"
import * as AutoTokenizer from "../tokenizer/AutoTokenizer.ts"
import * as Tokenizer from "../tokenizer/Tokenizer.ts"
import * as PolicyModel from "../trainer/PolicyModel.ts"
import * as SftTrainer from "../trainer/SftTrainer.ts"
import * as RunFlags from "./RunFlags.ts"

/** Run SFT as `config` describes; the result is what the command prints (without `event`). */
export const run = Effect.fn("cli.sft")(function* (config: RunConfig) {
  yield* TensorBackend.initialise(config.backend)
  const tokenizer = yield* AutoTokenizer.fromConfig(config.tokenizer, config.model.path)
  const s = config.sft
  const trainFiles = s.data.length > 0 ? s.data : config.data.train
  const evalFiles = s.eval_data.length > 0 ? s.eval_data : config.data.val
  const options = { maxLength: s.max_length, lossOn: s.loss_on }
  const train = yield* SftDataset.load(trainFiles, tokenizer, options)
  const held = yield* SftDataset.load(evalFiles, tokenizer, options)
  for (const [name, loaded] of [
    ["train", train],
    ["eval", held]
  ] as const) {
    if (loaded.truncated > 0 || loaded.dropped > 0) {
      yield* Console.error(
        `sft ${name}: ${loaded.truncated} of ${loaded.rows} rows cut at max_length ${s.max_length}, ` +
          `${loaded.dropped} dropped (no loss token left)`
      )
    }
  }
  return yield* SftTrainer.run({ config: s, train: train.examples, eval: held.examples, lora: config.model.lora }).pipe(
    Effect.provide([PolicyModel.layer(config.model), Tokenizer.layerImpl(tokenizer)])
  )
}) satisfies (config: RunConfig) => Effect.Effect<SftTrainer.Summary, unknown, FileSystem.FileSystem | Path.Path>

export const command = Command.make(
  "sft",
  { config: RunFlags.config, overrides: RunFlags.overrides },
  ({ config, overrides }) =>
    Effect.gen(function* () {
      const decoded = yield* RunFlags.load(config, overrides)
      const summary = yield* run(decoded)
      yield* Console.log(JSON.stringify({ event: "summary", ...summary }))
    })
).pipe(
  Command.withDescription(
    "Supervised fine-tuning on chat data (loss on assistant turns), with eval loss, metrics.jsonl and checkpoints"
  )
)
