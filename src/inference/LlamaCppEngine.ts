/**
 * Rollouts on llama.cpp (through node-llama-cpp, loaded only when this engine is chosen: a user without the optional
 * package runs everything else): each policy version is exported as a GGUF file (model/GgufExport.ts, tensor type
 * `type`) and loaded; token ids in, token ids + behaviour log-probs + finish reason + versions out.
 *
 * Log-probs: node-llama-cpp's `confidence` is the probability of the sampled token under softmax over the
 * candidates its sampler chain leaves (top-k → top-p → temperature), in float32. Requests ask for top-k 0 (the
 * whole vocabulary) and top-p 1 unless they set them, so at temperature τ > 0 that is softmax(z/τ), our "processed"
 * log-prob, which the trainer recomputes; at τ = 0 (greedy) the chain is greedy alone and it is softmax(z), our raw
 * log-prob, as LocalEngine reports for greedy tokens. Departure: llama.cpp applies top-p before temperature (we apply
 * it after), so with top-p < 1 and τ ≠ 1 the nucleus can differ. At F32 the log-probs match the trainer's within
 * 1e-5 (test/model/GgufExport.test.ts); an F16/BF16/Q8_0 export moves them (mean |Δ log p| about 0.001 / 0.008 /
 * 0.03 on the quickstart policy), which the trainer records as `policy/rollout_logprob_abs_diff` and TIS
 * (`trainer.algorithm.off_policy_correction`) reweights.
 *
 * Batching: one llama.cpp context with `maxBatch` sequences; concurrent requests each hold a sequence and
 * node-llama-cpp decodes their pending tokens together in one batch per step.
 *
 * Weights: `updateWeights` writes `<dir>/v<version>.gguf` (from the snapshot's tensors, or, for a snapshot that only
 * names a version, from the shared model's variables) and loads it; requests admitted afterwards sample from it,
 * requests in flight finish on the version they started with (their results say so), and a replaced model is freed
 * when its last request ends. A LoRA run's adapters are not supported (export the merged model instead).
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect } from "effect"
import { InferenceError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"
import * as GgufExport from "../model/GgufExport.ts"
import * as Transformer from "../model/Transformer.ts"
import { type GenerateRequest, type GenerateResult, InferenceEngine } from "./InferenceEngine.ts"

export interface LlamaCppEngineOptions {
  /** The policy's model: its config, and its weights for version 0 and for snapshots that carry no tensors. */
  readonly model: Transformer.Transformer
  readonly tokenizer: GgufExport.TokenizerFiles
  readonly type: GgufExport.ExportType
  /** Where each version's GGUF file is written (the newest two are kept). */
  readonly dir: string
  readonly maxBatch: number
  /** llama.cpp's CPU threads; default 1 (generator.engine.llamacpp_threads) */
  readonly threads?: number
  readonly decode: (ids: ReadonlyArray<number>) => string
}

type LlamaModule = typeof import("node-llama-cpp")
type LlamaModel = Awaited<ReturnType<Awaited<ReturnType<LlamaModule["getLlama"]>>["loadModel"]>>
type LlamaContext = Awaited<ReturnType<LlamaModel["createContext"]>>

interface Loaded {
  readonly version: number
  readonly file: string
  readonly model: LlamaModel
  readonly context: LlamaContext
  /** the context's sequences not in use: each running request holds one, its history cleared when it ends */
  readonly idle: Array<ReturnType<LlamaContext["getSequence"]>>
  active: number
  replaced: boolean
}

const fail = (message: string) => (cause: unknown) =>
  new InferenceError({
    engine: "llamacpp",
    reason: "Internal",
    message: `${message}: ${cause instanceof Error ? cause.message : String(cause)}`
  })

export const make = Effect.fnUntraced(function* (options: LlamaCppEngineOptions) {
  const llamaCpp = yield* Effect.tryPromise({
    try: () => import("node-llama-cpp"),
    catch: fail(
      "generator.engine.kind llamacpp needs the optional package node-llama-cpp (npm i -E node-llama-cpp@3.21.1)"
    )
  })
  const llama = yield* Effect.tryPromise({
    try: () => llamaCpp.getLlama({ gpu: false, build: "never", logLevel: llamaCpp.LlamaLogLevel.error }),
    catch: fail("cannot start llama.cpp")
  })
  const config = options.model.config
  const contextSize = config.maxPositionEmbeddings
  let arrays = new Map<string, GgufExport.HfArray>()

  const load = async (version: number): Promise<Loaded> => {
    await fs.mkdir(options.dir, { recursive: true })
    const file = path.join(options.dir, `v${String(version).padStart(6, "0")}.gguf`)
    await GgufExport.write(file, {
      config,
      arrays: [...arrays.values()],
      tokenizer: options.tokenizer,
      type: options.type
    })
    const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 })
    const context = await model.createContext({
      contextSize: contextSize * options.maxBatch,
      sequences: options.maxBatch,
      batchSize: Math.min(contextSize * options.maxBatch, 4096),
      flashAttention: false,
      // llama.cpp's default F16 cache alone moves log-probs by ~1e-2; F32 keeps an F32 export at ~1e-5
      experimentalKvCacheKeyType: "F32",
      experimentalKvCacheValueType: "F32",
      // one thread unless told: more than the cores it has to itself makes llama.cpp's threads wait on each other
      threads: options.threads ?? 1
    })
    const idle = Array.from({ length: options.maxBatch }, () => context.getSequence())
    return { version, file, model, context, idle, active: 0, replaced: false }
  }
  const free = async (loaded: Loaded) => {
    await loaded.context.dispose()
    await loaded.model.dispose()
  }

  const readModel = async () => {
    if (options.model.adapters.size > 0) throw new Error("LoRA adapters are not supported: export the merged model")
    arrays = new Map((await Transformer.toHfArrays(options.model)).map((a) => [a.name, a]))
  }

  let current: Loaded = yield* Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        await readModel()
        return load(0)
      },
      catch: fail("cannot export or load version 0")
    }),
    (): Effect.Effect<void> => Effect.promise(() => free(current))
  )
  let paused = false
  let waiters: Array<() => void> = []
  // a sequence slot per running request; requests beyond maxBatch wait for one
  let slots = options.maxBatch
  const slotWaiters: Array<() => void> = []
  const takeSlot = async () => {
    while (paused || slots === 0) {
      await new Promise<void>((resolve) => (paused ? waiters : slotWaiters).push(resolve))
    }
    slots--
  }
  const giveSlot = () => {
    slots++
    slotWaiters.shift()?.()
  }

  const generateOne = async (request: GenerateRequest): Promise<GenerateResult> => {
    await takeSlot()
    const loaded = current
    loaded.active++
    const sequence = loaded.idle.pop()!
    try {
      const s = request.sampling
      const limit = Math.min(s.maxNewTokens, contextSize - request.promptIds.length)
      const tokens: Array<number> = []
      const logprobs: Array<number> = []
      let finishReason: "stop" | "length" = "length"
      if (limit > 0) {
        for await (const out of sequence.evaluateWithMetadata(
          request.promptIds as Array<never>,
          { confidence: true },
          {
            temperature: s.temperature,
            topK: s.topK,
            topP: s.topP,
            seed: s.seed,
            yieldEogToken: true
          }
        )) {
          tokens.push(out.token)
          logprobs.push(Math.log(out.confidence))
          if (s.stopTokenIds.includes(out.token)) {
            finishReason = "stop"
            break
          }
          if (s.stopStrings.length > 0) {
            const text = options.decode(tokens)
            if (s.stopStrings.some((stop) => text.includes(stop))) {
              finishReason = "stop"
              break
            }
          }
          if (tokens.length >= limit) break
        }
      }
      const version = PolicyVersion.make(loaded.version)
      return { tokens, logprobs, finishReason, policyVersionFirst: version, policyVersionLast: version }
    } finally {
      await sequence.clearHistory()
      loaded.idle.push(sequence)
      loaded.active--
      giveSlot()
      if (loaded.replaced && loaded.active === 0) await free(loaded)
    }
  }

  const generate = (requests: ReadonlyArray<GenerateRequest>) =>
    Effect.tryPromise({
      try: () => Promise.all(requests.map(generateOne)),
      catch: fail("llama.cpp generation failed")
    })

  const updateWeights = (snapshot: WeightSnapshot) =>
    Effect.tryPromise({
      try: async () => {
        if (snapshot.version < current.version) throw new Error(`version ${snapshot.version} < ${current.version}`)
        if (snapshot.adapter !== undefined) throw new Error("LoRA adapters are not supported: export the merged model")
        if (snapshot.names.length === 0) await readModel()
        else
          snapshot.names.forEach((name, i) =>
            arrays.set(name, { name, shape: snapshot.shapes[i]!, data: snapshot.data[i]! })
          )
        const next = await load(snapshot.version)
        const previous = current
        current = next
        previous.replaced = true
        if (previous.active === 0) await free(previous)
        // keep the newest two files
        const files = (await fs.readdir(options.dir)).filter((f) => /^v\d+\.gguf$/.test(f)).sort()
        for (const f of files.slice(0, -2)) await fs.rm(path.join(options.dir, f), { force: true })
      },
      catch: fail(`cannot load version ${snapshot.version}`)
    })

  return InferenceEngine.of({
    generate,
    updateWeights,
    pause: Effect.sync(() => {
      paused = true
    }),
    resume: Effect.sync(() => {
      paused = false
      const woken = waiters
      waiters = []
      for (const wake of woken) wake()
    }),
    version: Effect.sync(() => PolicyVersion.make(current.version))
  })
})
