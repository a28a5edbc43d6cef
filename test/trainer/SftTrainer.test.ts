/**
 * SftTrainer: a tiny model (hidden 32, 2 layers) learns to answer "reverse abc" with "cba" from 40 rows; the
 * saved checkpoint loads back (weights + tokenizer) and scores tokens exactly as the trained in-memory model;
 * its output goes through Metrics and Checkpointer (RunLayers.sft) into the output directory's old places;
 * gradient accumulation over micro-batches gives the full batch's gradient; `sft` runs from the command line.
 */
import { readFileSync, rmSync } from "node:fs"
import { NodeServices } from "@effect/platform-node"
import { assert, beforeAll, describe, it } from "@effect/vitest"
import * as tf from "../../src/tensor/Tf.ts"
import { Effect, FileSystem, Schema } from "effect"
import * as TensorBackend from "../../src/backend/TensorBackend.ts"
import type { RunConfig } from "../../src/config/RunConfig.ts"
import * as RunConfigLoader from "../../src/config/RunConfigLoader.ts"
import * as SftDataset from "../../src/data/SftDataset.ts"
import type { Message } from "../../src/domain/Message.ts"
import * as RunLayers from "../../src/layers/RunLayers.ts"
import * as MetricKeys from "../../src/metrics/MetricKeys.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as LogProbs from "../../src/model/LogProbs.ts"
import * as HfConfig from "../../src/model/ModelConfig.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import * as Checkpointer from "../../src/store/Checkpointer.ts"
import * as AutoTokenizer from "../../src/tokenizer/AutoTokenizer.ts"
import * as ByteTokenizer from "../../src/tokenizer/ByteTokenizer.ts"
import * as Optimizer from "../../src/trainer/Optimizer.ts"
import * as PolicyModel from "../../src/trainer/PolicyModel.ts"
import * as SftTrainer from "../../src/trainer/SftTrainer.ts"
import * as Cli from "../fixtures/Cli.ts"

const tinyInit = {
  architecture: "qwen3",
  vocab_size: 320,
  hidden_size: 32,
  intermediate_size: 64,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 16,
  seed: 7
} as const

/** Row i: "reverse xyz" → "zyx", three letters from a–f picked by a fixed LCG (deterministic, no repeats). */
const reverseRows = (n: number, offset = 0) =>
  Array.from({ length: n }, (_, i) => {
    let s = (i + offset) * 2654435761
    const word = Array.from({ length: 3 }, () => {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0
      return "abcdef"[(s >>> 16) % 6]!
    }).join("")
    return {
      messages: [
        { role: "user", content: `reverse ${word}` },
        { role: "assistant", content: [...word].reverse().join("") }
      ]
    }
  })

const writeJsonl = (fs: FileSystem.FileSystem, file: string, rows: ReadonlyArray<unknown>) =>
  fs.writeFileString(file, rows.map((r) => JSON.stringify(r)).join("\n"))

// the backend the file starts with (RunLayers.sft initialises the config's)
const backend = { name: "wasm", kernels: "stock" } as const

/** The metrics.jsonl lines of an SFT run, decoded (a line that does not decode fails the test). */
const metricsLines = (fs: FileSystem.FileSystem, dir: string) =>
  Effect.map(fs.readFileString(`${dir}/metrics.jsonl`), (text) =>
    text
      .trim()
      .split("\n")
      .map((line) => Schema.decodeUnknownSync(SftTrainer.MetricsRecord)(JSON.parse(line)))
  )

/** Load and tokenize the run's data with its tokenizer, then train: what `sft` runs on RunLayers.sft. */
const trainOn = (config: RunConfig) =>
  Effect.gen(function* () {
    const s = config.sft
    const data = yield* SftDataset.loadSplits(
      { train: s.data, eval: s.eval_data },
      { maxLength: s.max_length, lossOn: s.loss_on }
    )
    return yield* SftTrainer.run({ config: s, train: data.train, eval: data.eval, lora: config.model.lora })
  })

// wasm: the pure-JS cpu backend is ~20× slower here; the process-wide backend is set once for the file
beforeAll(() => Effect.runPromise(TensorBackend.initialise({ name: "wasm", threads: 0, kernels: "stock" })))

describe("SftTrainer.run", () => {
  it.effect(
    "drives the assistant-token loss below half its start on 40 reverse rows, and saves a checkpoint that loads",
    () =>
      Effect.gen(function* () {
        const fs = yield* FileSystem.FileSystem
        const dir = yield* fs.makeTempDirectoryScoped()
        yield* writeJsonl(fs, `${dir}/train.jsonl`, reverseRows(40))
        yield* writeJsonl(fs, `${dir}/val.jsonl`, reverseRows(8, 1000))
        const config = yield* RunConfigLoader.fromObject(
          { model: { init: tinyInit }, tokenizer: { kind: "byte" }, backend },
          [
            `sft.data=[${dir}/train.jsonl]`,
            `sft.eval_data=[${dir}/val.jsonl]`,
            "sft.max_steps=40",
            "sft.batch_size=8",
            "sft.micro_batch_size=4",
            "sft.optimizer.lr=0.01",
            "sft.optimizer.warmup_steps=4",
            "sft.optimizer.scheduler=cosine",
            "sft.log_interval=5",
            "sft.eval_interval=20",
            "sft.save_interval=20",
            `sft.output_dir=${dir}/out`
          ]
        )
        const tokenizer = ByteTokenizer.make()
        const held = yield* SftDataset.load(config.sft.eval_data, tokenizer, {
          maxLength: config.sft.max_length,
          lossOn: config.sft.loss_on
        })
        const { summary, before, after } = yield* Effect.gen(function* () {
          const { model } = yield* PolicyModel.PolicyModel
          const micro = { microBatchSize: 8, padId: tokenizer.padId }
          const before = yield* Effect.promise(() => SftTrainer.evaluate(model, held.examples, micro))
          const summary = yield* trainOn(config)
          const after = yield* Effect.promise(() => SftTrainer.evaluate(model, held.examples, micro))
          // the final checkpoint scores a held-out conversation exactly as the in-memory model
          const loaded = yield* Effect.promise(() => Checkpoint.load(`${dir}/out/step-40`))
          const reloadedTokenizer = yield* AutoTokenizer.load(`${dir}/out/step-40`)
          const conversation = reverseRows(1, 2000)[0]!.messages as ReadonlyArray<Message>
          const ids = reloadedTokenizer.applyChatTemplateIds(conversation, { addGenerationPrompt: false })
          assert.deepStrictEqual(ids, tokenizer.applyChatTemplateIds(conversation, { addGenerationPrompt: false }))
          const live = yield* Effect.promise(() => LogProbs.ofIds(model, ids))
          const saved = yield* Effect.promise(() => LogProbs.ofIds(loaded.model, ids))
          Transformer.dispose(loaded.model)
          for (const [t, lp] of live.entries()) assert.closeTo(saved[t]!, lp, 1e-5)
          return { summary, before, after }
        }).pipe(Effect.provide(RunLayers.sft(config, { outputDir: config.sft.output_dir })))

        console.log(JSON.stringify({ firstLoss: summary.firstLoss, trainLoss: summary.trainLoss, before, after }))
        assert.strictEqual(summary.steps, 40)
        assert.strictEqual(summary.epochs, 8) // 40 rows / 8 = 5 steps per epoch
        assert.isBelow(summary.trainLoss, 0.5 * summary.firstLoss)
        assert.isBelow(after, 0.5 * before) // held-out rows too
        assert.closeTo(summary.evalLoss!, after, 1e-5)
        assert.strictEqual(summary.checkpoint, `${dir}/out/step-40`)

        const records = yield* metricsLines(fs, `${dir}/out`)
        assert.deepStrictEqual(
          records.map((r) => r.step),
          [5, 10, 15, 20, 25, 30, 35, 40]
        )
        assert.deepStrictEqual(
          records.filter((r) => r["eval/loss"] !== undefined).map((r) => r.step),
          [20, 40]
        )
        // warmup: step 1 runs at lr/4; the cosine ends at lr · min_lr_ratio
        assert.closeTo(records[7]!["train/lr"], Optimizer.learningRate(config.sft.optimizer, 39, 40), 1e-12)
        assert.isTrue(records.every((r) => r["train/tokens_per_second"] > 0))
        assert.strictEqual(records[7]!.epoch, 8)
      }).pipe(Effect.provide(NodeServices.layer))
  )

  it.effect(
    "writes through Checkpointer and Metrics: step-N/ with trainer_state.json, latest, decodable metrics lines",
    () =>
      Effect.gen(function* () {
        const fs = yield* FileSystem.FileSystem
        const dir = yield* fs.makeTempDirectoryScoped()
        const out = `${dir}/out`
        yield* writeJsonl(fs, `${dir}/train.jsonl`, reverseRows(12))
        const config = yield* RunConfigLoader.fromObject(
          { model: { init: tinyInit }, tokenizer: { kind: "byte" }, backend },
          [
            `sft.data=[${dir}/train.jsonl]`,
            "sft.max_steps=3",
            "sft.batch_size=4",
            "sft.log_interval=1",
            "sft.save_interval=1",
            `sft.output_dir=${out}`
          ]
        )
        const runOnce = trainOn(config).pipe(Effect.provide(RunLayers.sft(config, { outputDir: out })))
        yield* runOnce
        const first = yield* fs.readFileString(`${out}/metrics.jsonl`)
        const summary = yield* runOnce // into the same directory: the first run's files move to earlier/

        // Checkpointer's layout, in the output directory itself; every step kept (checkpoint.keep_n is 2)
        assert.strictEqual(yield* fs.readFileString(`${out}/latest`), "step-3")
        assert.strictEqual(summary.checkpoint, `${out}/step-3`)
        for (const step of [1, 2, 3]) {
          assert.deepStrictEqual((yield* fs.readDirectory(`${out}/step-${step}`)).sort(), [
            "config.json",
            "model.safetensors",
            "optimizer.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "trainer_state.json"
          ])
        }
        const state = JSON.parse(yield* fs.readFileString(`${out}/step-3/trainer_state.json`))
        assert.deepStrictEqual(
          { step: state.step, version: state.version, optimizerStep: state.optimizerStep, klCoef: state.klCoef },
          { step: 3, version: 3, optimizerStep: 3, klCoef: 0 }
        )
        assert.isAbove(state.optimizerNames.length, 0)
        assert.deepStrictEqual(Object.keys(state.data), ["sft"])
        assert.strictEqual(state.data.sft.total_steps, 3)
        assert.strictEqual(state.data.sft.epoch, 1) // 12 rows / 4 = 3 steps per epoch
        // an SFT checkpoint starts a run as model.path (or eval --model OUT/latest), never resumes one
        assert.strictEqual(yield* Effect.promise(() => Checkpointer.resolveModelDir(`${out}/latest`)), `${out}/step-3`)
        const refused = yield* Checkpointer.make({ runDir: dir, keepN: 2, tokenizer: ByteTokenizer.make() })
          .read(`${out}/step-3`)
          .pipe(Effect.flip)
        assert.match(refused.message, /sft checkpoint's: start a run from its weights with model\.path=/)

        // metrics.jsonl: one decodable `train` line per step, every name one of MetricKeys
        const records = yield* metricsLines(fs, out)
        assert.deepStrictEqual(
          records.map((r) => [r.event, r.step]),
          [
            ["train", 1],
            ["train", 2],
            ["train", 3]
          ]
        )
        const names = records.flatMap((r) => Object.keys(r)).filter((k) => !["event", "step", "time"].includes(k))
        assert.deepStrictEqual(
          names.filter((k) => MetricKeys.meaning(k) === undefined),
          []
        )
        assert.isTrue((yield* fs.readFileString(`${out}/config.yaml`)).includes("output_dir"))
        const [earlier] = yield* fs.readDirectory(`${out}/earlier`)
        assert.strictEqual(yield* fs.readFileString(`${out}/earlier/${earlier}/metrics.jsonl`), first)
      }).pipe(Effect.provide(NodeServices.layer))
  )
})

describe("SftTrainer.run with LoRA", () => {
  it.effect("trains only the adapters and saves merged weights (same log-probs) plus a PEFT adapter", () =>
    Effect.gen(function* () {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      yield* writeJsonl(fs, `${dir}/train.jsonl`, reverseRows(16))
      const config = yield* RunConfigLoader.fromObject(
        { model: { init: tinyInit, lora: { rank: 4, alpha: 8 } }, tokenizer: { kind: "byte" }, backend },
        [
          `sft.data=[${dir}/train.jsonl]`,
          "sft.max_steps=6",
          "sft.max_length=64",
          "sft.optimizer.lr=0.02",
          `sft.output_dir=${dir}/out`
        ]
      )
      yield* Effect.gen(function* () {
        const { model } = yield* PolicyModel.PolicyModel
        const embedBefore = Array.from(model.params.get("model.embed_tokens.weight")!.dataSync())
        const summary = yield* trainOn(config)
        assert.strictEqual(model.adapters.size, 2 * 4) // q, k, v, o of 2 layers
        assert.deepStrictEqual(Array.from(model.params.get("model.embed_tokens.weight")!.dataSync()), embedBefore)
        assert.isBelow(summary.trainLoss, summary.firstLoss)
        const loaded = yield* Effect.promise(() => Checkpoint.load(summary.checkpoint))
        const train = yield* SftDataset.load(config.sft.data, ByteTokenizer.make(), {
          maxLength: 64,
          lossOn: "assistant"
        })
        const ids = train.examples[0]!.ids
        const live = yield* Effect.promise(() => LogProbs.ofIds(model, ids))
        const saved = yield* Effect.promise(() => LogProbs.ofIds(loaded.model, ids))
        Transformer.dispose(loaded.model)
        for (const [t, lp] of live.entries()) assert.closeTo(saved[t]!, lp, 1e-4)
        assert.deepStrictEqual((yield* fs.readDirectory(`${summary.checkpoint}/adapter`)).sort(), [
          "adapter_config.json",
          "adapter_model.safetensors"
        ])
        const adapter = JSON.parse(yield* fs.readFileString(`${summary.checkpoint}/adapter/adapter_config.json`))
        assert.deepStrictEqual([adapter.r, adapter.lora_alpha], [4, 8])
      }).pipe(Effect.provide(RunLayers.sft(config, { outputDir: config.sft.output_dir })))
    }).pipe(Effect.provide(NodeServices.layer))
  )
})

describe("SftTrainer.trainStep", () => {
  it("gives the same update whether the batch runs whole or in micro-batches of 1 (token-mean over the batch)", async () => {
    const tokenizer = ByteTokenizer.make()
    const batch = reverseRows(3).map((row, i) => ({
      ...SftDataset.tokenize(tokenizer, { messages: row.messages as ReadonlyArray<Message> }),
      source: `row${i}`
    }))
    // uneven lengths, so a per-micro-batch mean would weigh tokens differently
    batch[1] = { ...batch[1]!, ids: batch[1]!.ids.slice(0, 32), lossMask: batch[1]!.lossMask.slice(0, 32) }
    const config = HfConfig.fromInit({
      ...tinyInit,
      rope_theta: 10000,
      rms_norm_eps: 1e-6,
      max_position_embeddings: 256,
      tie_word_embeddings: true
    })
    const opt = {
      lr: 0.01,
      weight_decay: 0,
      beta1: 0.9,
      beta2: 0.999,
      // Adam's first step is lr·g/(|g| + eps): with eps 1e-8 a weight whose gradient is ~1e-7 moves by ~lr whatever the
      // float rounding of g, so summation-order differences (native kernels) would show as 1e-5 weight differences;
      // eps 1e-3 keeps the update linear in such tiny gradients and still ≈ lr for the large ones.
      eps: 1e-3,
      max_grad_norm: 0,
      warmup_steps: 0,
      scheduler: "constant",
      min_lr_ratio: 0.1
    } as const
    const runWith = async (microBatchSize: number) => {
      const model = Transformer.init(config, 11)
      const variables = Transformer.trainableVariables(model)
      const optimizer = Optimizer.make(variables, opt)
      const stats = await SftTrainer.trainStep(model, optimizer, variables, batch, {
        microBatchSize,
        padId: 256,
        lr: 0.01
      })
      const weights = variables.map((v) => Array.from(v.dataSync()))
      optimizer.dispose()
      Transformer.dispose(model)
      return { stats, weights }
    }
    const live = tf.memory().numTensors
    const whole = await runWith(3)
    const split = await runWith(1)
    const probe = Transformer.init(config, 11)
    const evalLoss = await SftTrainer.evaluate(probe, batch, { microBatchSize: 2, padId: 256 })
    Transformer.dispose(probe)
    assert.strictEqual(tf.memory().numTensors, live) // nothing leaked
    assert.closeTo(evalLoss, whole.stats.loss, 1e-5) // same token-mean, before the update
    assert.closeTo(split.stats.loss, whole.stats.loss, 1e-5)
    assert.closeTo(split.stats.gradNorm, whole.stats.gradNorm, 1e-4)
    assert.strictEqual(whole.stats.lossTokens, 4 + 2 + 4) // row 1 is cut after two answer letters
    for (const [i, w] of whole.weights.entries()) {
      for (const [j, x] of w.entries()) assert.closeTo(split.weights[i]![j]!, x, 1e-5)
    }
  })
})

describe("sft command", () => {
  it("trains from configs/sft-tiny.yaml and prints the summary as the last stdout line", () => {
    const out = `${process.env["TMPDIR"] ?? "/tmp"}/sft-cli-${process.pid}`
    const result = Cli.run(
      ["sft", "--config", "configs/sft-tiny.yaml", "sft.max_steps=3", "sft.log_interval=1", `sft.output_dir=${out}`],
      { timeoutMs: 60_000 }
    )
    assert.strictEqual(result.code, 0, result.stderr)
    const summary = JSON.parse(result.lastLine)
    assert.strictEqual(summary.event, "summary")
    assert.strictEqual(summary.steps, 3)
    assert.strictEqual(summary.outputDir, out)
    assert.isTrue(Number.isFinite(summary.trainLoss) && Number.isFinite(summary.evalLoss))
    assert.match(result.stderr, /sft step 3\/3 .* loss \d+\.\d+ .* lr .* tok\/s \d+ elapsed .* eta /)
    assert.strictEqual(readFileSync(`${out}/latest`, "utf8"), "step-3")
    rmSync(out, { recursive: true, force: true })
  })
})
