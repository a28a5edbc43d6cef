/**
 * `sft --config FILE [key.path=value ...]`: supervised fine-tuning of `model` on the chat rows of `sft.data`
 * (default: `data.train`), eval loss on `sft.eval_data` (default: `data.val`). Writes `sft.output_dir` (config.yaml,
 * metrics.jsonl, step-N/ and latest: RunLayers.sft). Progress goes to stderr; the last stdout line is
 * `{"event":"summary","steps":…,"trainLoss":…,"evalLoss":…,"outputDir":…,"seconds":…,…}`.
 *
 * `run(config)` is the same program for embedding: the data tokenized with the run's tokenizer, then SftTrainer, on
 * the layers of RunLayers.sft.
 */
import { Console, Effect } from "effect"
import { Command } from "effect/cli"
import type { RunConfig } from "../config/RunConfig.ts"
import * as SftDataset from "../data/SftDataset.ts"
import * as RunLayers from "../layers/RunLayers.ts"
import * as StopSignal from "../pipeline/StopSignal.ts"
import * as SftTrainer from "../trainer/SftTrainer.ts"
import * as RunFlags from "./RunFlags.ts"

/** Run SFT as `config` describes; the result is what the command prints (without `event`). */
export const run = Effect.fn("cli.sft")(function* (config: RunConfig) {
  const s = config.sft
  const files = {
    train: s.data.length > 0 ? s.data : config.data.train,
    eval: s.eval_data.length > 0 ? s.eval_data : config.data.val
  }
  return yield* Effect.gen(function* () {
    const data = yield* SftDataset.loadSplits(files, { maxLength: s.max_length, lossOn: s.loss_on })
    // Ctrl-C / SIGTERM end the run after the step in progress, with a checkpoint
    return yield* StopSignal.honour(
      SftTrainer.run({
        config: s,
        train: data.train,
        eval: data.eval,
        lora: config.model.lora,
        stopRequested: StopSignal.requested
      })
    )
  }).pipe(Effect.provide(RunLayers.sft(config, { outputDir: s.output_dir })))
})

export const command = Command.make(
  "sft",
  { config: RunFlags.config, overrides: RunFlags.overrides },
  ({ config, overrides }) =>
    Effect.gen(function* () {
      const decoded = yield* RunFlags.load(config, overrides)
      const summary = yield* run(decoded)
      if (summary.stopped !== undefined) {
        yield* Console.error(
          `stopped after step ${summary.steps}: ${summary.checkpoint} holds its weights (start RL or more SFT from ` +
            `them with model.path=${summary.checkpoint}; sft itself starts over)`
        )
      }
      yield* Console.log(JSON.stringify({ event: "summary", ...summary }))
    })
).pipe(
  Command.withDescription(
    "Supervised fine-tuning on chat data (loss on assistant turns), with eval loss, metrics.jsonl and checkpoints"
  ),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --config configs/sft-quickstart.yaml sft.max_steps=100`,
      description: "100 steps of the quickstart's warm-start SFT"
    }
  ])
)
