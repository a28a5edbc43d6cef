/**
 * Rollout sampling, llama.cpp against effect-rl, engine to engine through the InferenceEngine interface: our
 * LocalEngine (KV cache, continuous batching, prefix cache) and LlamaCppEngine (a GGUF export of the same weights,
 * llama.cpp in a worker thread through node-llama-cpp), each with its own overheads (scheduler, worker messages,
 * per-token log-probs). Same model, same batch (one `generate` call of B requests), same prompts (fresh random ids at
 * every call, so neither engine reuses a cached prefix), same number of new tokens, temperature 1, top-k 0, top-p 1,
 * no stop tokens: every request generates exactly N tokens, which the bench checks. Same threads: llama.cpp's
 * `threads` = our backend's threads (`--threads`, default the machine's cores); llama.cpp also runs at one thread
 * (`--llamacpp-threads LIST`, default "T,1"), its best setting where the cores are not its own: node-llama-cpp drives
 * each decode step from the worker's JavaScript, and llama.cpp's threads meet at a barrier after each op of the
 * graph, so on 2 cores shared with that JS thread (and the neighbours) 2 threads wait on each other at every op (the
 * quickstart policy decodes ~13× slower at 2 threads than at 1 on this 2-core box).
 *
 * `npm run bench -- sample --engine llamacpp` runs this file (as does `npm run bench -- sample-llamacpp`). Each side
 * runs in its own child process (ours first, then llama.cpp once per thread count and GGUF type), one after another,
 * so each peak RSS (the child's own maxRSS, all its threads, loading included) is that side's alone. The llama.cpp side's peak also holds what its engine needs to export: the effect-rl
 * model loaded as float32 and the engine's float32 copy of the weights (as in a training run), besides llama.cpp's
 * mapped GGUF file.
 *
 * Defaults: batch 8, prompt 128, 128 new tokens on a checkpoint (`--model DIR`; the quickstart policy is
 * data/quickstart/policy); batch 8, prompt 32, 96 new tokens on the perf model. A checkpoint without tokenizer.json
 * is exported with the byte tokenizer's files (ids in, ids out: the tokenizer takes no part in the timing).
 *
 * Last stdout line: {"bench":"sample-llamacpp","threads",…,"ours":{msPerStep,tokensPerSec,cpuMsPerStep,peakRssMb,…},
 * "llamacpp":[{ggufType,threads,…}],"ratio":llama.cpp tokens/s / ours (same threads, first GGUF type),"bestRatio",
 * "ratios":{"TYPE@THREADS": …},…}; also written to bench/out/sample-llamacpp.json (`--out FILE`: bench/results/FILE),
 * with the command line, date and machine load.
 * msPerStep = a call's wall time / N (prefill included); cpuMsPerStep: CPU time of all the child's threads.
 *
 * Run: npm run bench -- sample --engine llamacpp [--model DIR] [--gguf-type f32|f16|bf16|q8_0[,…]] [--batch B]
 *        [--prompt P] [--new N] [--weights f32|bf16] [--backend NAME] [--threads N] [--llamacpp-threads N[,…]]
 *        [--iters N] [--warmup N] [--out FILE]
 * (`--weights bf16`: our side stores every projection weight as bfloat16, as bench/sample.ts does; defaults:
 * --gguf-type f32, --iters 5 on the perf model, 3 on a checkpoint, --warmup 1.)
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as tf from "../src/tensor/Tf.ts"
import { Effect } from "effect"
import * as NativeBackend from "../src/backend/NativeBackend.ts"
import type { GenerateRequest, InferenceEngine } from "../src/inference/InferenceEngine.ts"
import * as LlamaCppEngine from "../src/inference/LlamaCppEngine.ts"
import * as LocalEngine from "../src/inference/LocalEngine.ts"
import type * as GgufExport from "../src/model/GgufExport.ts"
import * as Prng from "../src/model/Prng.ts"
import * as Sampling from "../src/model/Sampling.ts"
import * as Transformer from "../src/model/Transformer.ts"
import * as ByteTokenizer from "../src/tokenizer/ByteTokenizer.ts"
import * as Harness from "./harness.ts"

const ggufTypes: Record<string, GgufExport.ExportType> = { f32: "F32", f16: "F16", bf16: "BF16", q8_0: "Q8_0" }

interface Workload {
  readonly batch: number
  readonly prompt: number
  readonly newTokens: number
  readonly iters: number
  readonly warmup: number
}

const workload = (): Workload => {
  const real = Harness.hasModel()
  return {
    batch: Number(Harness.arg("batch", "8")),
    prompt: Number(Harness.arg("prompt", real ? "128" : "32")),
    newTokens: Number(Harness.arg("new", real ? "128" : "96")),
    iters: Number(Harness.arg("iters", real ? "3" : "5")),
    warmup: Number(Harness.arg("warmup", "1"))
  }
}

/** One side's figures, as its child prints them. */
interface Side {
  readonly side: "ours" | "llamacpp"
  readonly msPerStep: number
  readonly tokensPerSec: number
  readonly cpuMsPerStep: number
  readonly peakRssMb: number
  /** reading the checkpoint into effect-rl (both sides: llama.cpp's is exported from it) */
  readonly loadSeconds: number
  /** creating the engine: for llama.cpp the GGUF export and llama.cpp's load */
  readonly engineSeconds: number
  /** tokens generated per call, summed over its requests (B × N, checked) */
  readonly generated: number
  readonly backend: string
  readonly kernels: string
  readonly tfjsBackend: string
  readonly threads: number
  readonly weights?: string
  readonly ggufType?: GgufExport.ExportType
  readonly ggufMb?: number
}

/** The checkpoint's HF tokenizer files, or the byte tokenizer's when it has none (the perf model, bare checkpoints). */
const tokenizerFiles = (dir: string): GgufExport.TokenizerFiles => {
  const read = (file: string) => {
    const p = path.join(dir, file)
    return dir !== "" && fs.existsSync(p) ? fs.readFileSync(p, "utf8") : undefined
  }
  const json = read("tokenizer.json")
  if (json === undefined) {
    const files = ByteTokenizer.make().hfFiles()
    return { tokenizerJson: files["tokenizer.json"], tokenizerConfig: files["tokenizer_config.json"] }
  }
  const template = read("chat_template.jinja")
  return {
    tokenizerJson: JSON.parse(json),
    tokenizerConfig: JSON.parse(read("tokenizer_config.json") ?? "{}"),
    ...(template === undefined ? {} : { chatTemplate: template })
  }
}

/**
 * Time `engine.generate` on B fresh random prompts per call (the same sequence of prompts on both sides), checking that
 * every request returns exactly N tokens and N finite log-probs.
 */
const measure = async (engine: InferenceEngine["Service"], vocab: number, w: Workload) => {
  const prng = Prng.make(1)
  let call = 0
  let generated = 0
  const ms = await Harness.medianMs(
    async () => {
      const requests: Array<GenerateRequest> = Array.from({ length: w.batch }, (_, i) => ({
        promptIds: Array.from({ length: w.prompt }, () => Math.floor(prng.next() * vocab)),
        sampling: { ...Sampling.defaultParams, temperature: 1, maxNewTokens: w.newTokens, seed: call * w.batch + i }
      }))
      call++
      const results = await Effect.runPromise(engine.generate(requests))
      results.forEach((r, i) => {
        if (r.tokens.length !== w.newTokens || r.logprobs.length !== w.newTokens || r.finishReason !== "length") {
          throw new Error(
            `request ${i} of call ${call}: ${r.tokens.length} tokens, ${r.logprobs.length} log-probs, finish ` +
              `${r.finishReason}; expected exactly ${w.newTokens} (no stop tokens)`
          )
        }
        const bad = r.logprobs.findIndex((l) => !Number.isFinite(l) || l > 0)
        if (bad >= 0) throw new Error(`request ${i} of call ${call}: log-prob ${r.logprobs[bad]} at token ${bad}`)
      })
      generated = results.reduce((n, r) => n + r.tokens.length, 0)
    },
    w.iters,
    w.warmup
  )
  return {
    msPerStep: ms.wall / w.newTokens,
    tokensPerSec: (generated * 1000) / ms.wall,
    cpuMsPerStep: ms.cpu / w.newTokens,
    generated
  }
}

/** A child: one side, measured; prints its Side as the last stdout line. */
const runSide = async (side: "ours" | "llamacpp"): Promise<void> => {
  const w = workload()
  const backend = await Harness.setUpBackend()
  const ggufType = ggufTypes[Harness.arg("gguf-type", "f32")]!
  // our side: `--weights bf16` (native backend) stores every projection weight as bfloat16, read in place; the
  // llama.cpp side exports from float32 weights (the GGUF type sets its precision)
  const weights = side === "ours" && backend.backend === "native" ? Harness.arg("weights", "f32") : "f32"
  const { model, loadSeconds } = await Harness.benchModel(
    "inference",
    weights === "bf16" ? (weight, v) => weight.endsWith("_proj.weight") && NativeBackend.storeBf16(v) : undefined
  )
  if (weights === "bf16") Transformer.storeFrozen(model, NativeBackend.storeBf16, true)
  const dir = side === "llamacpp" ? fs.mkdtempSync(path.join(os.tmpdir(), "sample-llamacpp-")) : ""
  try {
    const result = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const start = performance.now()
          const engine =
            side === "ours"
              ? yield* LocalEngine.make({ model, maxBatch: w.batch })
              : yield* LlamaCppEngine.make({
                  model,
                  tokenizer: tokenizerFiles(Harness.arg("model", "")),
                  type: ggufType,
                  dir,
                  maxBatch: w.batch,
                  threads: backend.threads,
                  // KV cells for exactly prompt + new tokens per sequence, not a real model's 40 K positions
                  contextSize: w.prompt + w.newTokens
                })
          const engineSeconds = (performance.now() - start) / 1000
          const ggufMb =
            side === "llamacpp"
              ? fs.readdirSync(dir).reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0) / 2 ** 20
              : undefined
          const figures = yield* Effect.promise(() => measure(engine, model.config.vocabSize, w))
          return { engineSeconds, ggufMb, figures }
        })
      )
    )
    const out: Side = {
      side,
      ...result.figures,
      peakRssMb: Math.round(Harness.peakRssMb()),
      loadSeconds,
      engineSeconds: result.engineSeconds,
      backend: backend.backend,
      kernels: backend.kernels,
      tfjsBackend: tf.getBackend(),
      threads: backend.threads,
      ...(side === "ours" ? { weights } : { ggufType, ggufMb: Math.round(result.ggufMb ?? 0) })
    }
    console.error(`${side}${side === "llamacpp" ? ` ${ggufType}` : ""}: ${JSON.stringify(out)}`)
    console.log(JSON.stringify(out))
  } finally {
    Transformer.dispose(model)
    if (dir !== "") fs.rmSync(dir, { recursive: true, force: true })
  }
}

type Outcome =
  | Side
  | { readonly side: string; readonly ggufType?: string; readonly threads: number; readonly error: string }

/** Run one side in a child process (this bench again with `--side`); its Side, or why it failed. */
const child = async (side: "ours" | "llamacpp", flags: ReadonlyArray<string>): Promise<Outcome> => {
  // the overriding flags come first: a flag's first occurrence is the one read
  const args = [
    path.join(import.meta.dirname, "run.ts"),
    "sample-llamacpp",
    "--side",
    side,
    ...flags,
    ...process.argv.slice(3)
  ]
  const proc = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "inherit"] })
  let stdout = ""
  proc.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk))
  const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
    proc.on("error", reject)
    proc.on("exit", (code, signal) => resolve({ code, signal }))
  })
  const type = flags.includes("--gguf-type") ? flags[flags.indexOf("--gguf-type") + 1] : undefined
  const threads = Number(flags[flags.indexOf("--threads") + 1])
  if (exit.code !== 0) {
    const error = exit.signal === "SIGKILL" ? "killed (out of memory?)" : `failed (${exit.signal ?? exit.code})`
    console.error(`bench: the ${side} side ${error}; its stderr is above`)
    return { side, ...(type === undefined ? {} : { ggufType: ggufTypes[type]! }), threads, error }
  }
  return JSON.parse(stdout.trim().split("\n").at(-1)!) as Side
}

export const run = async (): Promise<void> => {
  const side = Harness.arg("side", "")
  if (side === "ours" || side === "llamacpp") return runSide(side)
  if (side !== "") throw new Error(`--side ${side}: ours or llamacpp`)
  const w = workload()
  const types = Harness.arg("gguf-type", "f32").split(",")
  const unknown = types.find((t) => ggufTypes[t] === undefined)
  if (unknown !== undefined) throw new Error(`--gguf-type ${unknown}: one of ${Object.keys(ggufTypes).join(", ")}`)
  const threads = Harness.arg("threads", String(os.availableParallelism()))
  // llama.cpp at our thread count, and at one thread when that differs (its best on a small model: see the header)
  const llamaThreads = Harness.arg("llamacpp-threads", threads === "1" ? "1" : `${threads},1`).split(",")
  const ours = await child("ours", ["--threads", threads])
  const llama: Array<Outcome> = []
  for (const n of llamaThreads) {
    for (const t of types) llama.push(await child("llamacpp", ["--gguf-type", t, "--threads", n]))
  }
  const ok = (s: Outcome): s is Side => !("error" in s)
  const measured = ok(ours) ? llama.filter(ok) : []
  const ratioOf = (l: Side) => l.tokensPerSec / (ours as Side).tokensPerSec
  const key = (l: Side) => `${l.ggufType}@${l.threads}`
  const same = measured.find((l) => String(l.threads) === threads)
  const best = measured.reduce<Side | undefined>(
    (b, l) => (b === undefined || ratioOf(l) > ratioOf(b) ? l : b),
    undefined
  )
  Harness.report({
    bench: "sample-llamacpp",
    threads: Number(threads),
    threadsNote:
      "ours and llama.cpp's `ratio` entry ran at `threads` (llama.cpp's threads = our backend's threads); the " +
      "llamacpp entries at other thread counts are llama.cpp's other settings; each side ran alone, in its own child " +
      "process, one after another",
    ours,
    llamacpp: llama,
    // llama.cpp tokens/s over ours: at the same threads (the first GGUF type), at llama.cpp's best setting, and each
    ratio: same === undefined ? null : ratioOf(same),
    bestRatio: best === undefined ? null : { setting: key(best), ratio: ratioOf(best) },
    ratios: Object.fromEntries(measured.map((l) => [key(l), ratioOf(l)])),
    // our CPU ms per step over llama.cpp's (all threads of each process)
    cpuRatios: Object.fromEntries(measured.map((l) => [key(l), (ours as Side).cpuMsPerStep / l.cpuMsPerStep])),
    workload: {
      model: Harness.hasModel() ? path.basename(path.resolve(Harness.arg("model", ""))) : "perf",
      ...w,
      temperature: 1,
      topK: 0,
      topP: 1,
      stopTokens: "none"
    },
    ...Harness.environment(),
    tfjsBackend: ok(ours) ? ours.tfjsBackend : null
  })
}

if (import.meta.main) await run()
