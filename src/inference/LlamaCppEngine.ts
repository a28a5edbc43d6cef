/**
 * Rollouts on llama.cpp (through node-llama-cpp, which `npm run setup:llamacpp` installs and ./LlamaCppPackage.ts
 * loads only when this engine is chosen: a user without it runs everything else): each policy version is exported as
 * a GGUF file (model/GgufExport.ts, tensor type `type`) and loaded; token ids in, token ids + behaviour log-probs +
 * finish reason + versions out.
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
 * Batching: `maxBatch` sequences over contexts of at most `sequencesPerContext` each, one by default. With several
 * sequences in a context (node-llama-cpp then decodes their pending tokens together in one batch per step), under many
 * concurrent multi-turn requests now and then every sequence of one context samples one step's token from logits that
 * are not its own: llama.cpp reports log p ≈ 0 where the policy gives −16 to −20, and the tokens after it match again
 * (docs/results.md, "Quickstart RL on the llama.cpp engine"). With one sequence per context none showed, and the
 * engine tests, which failed now and then with several, pass; it costs batching across trajectories (about half the
 * speed on the quickstart policy), so `sequencesPerContext` above 1 is for measuring, not for training.
 *
 * Prefix reuse: a request takes the free sequence whose cached tokens share the longest prefix with its prompt, erases
 * the rest and evaluates only the new tokens, so a trajectory's next turn (and the other samples of its prompt) skips
 * the prefill of what is already cached. The KV cells are the same version's computation of the same tokens, so the
 * log-probs do not change.
 *
 * Threads: llama.cpp runs in a worker thread (./worker/llamacpp-worker.ts). node-llama-cpp drives every decode step
 * from JavaScript (the step's batch, the sampling, the token's confidence: about 70% of a thread while generating the
 * quickstart policy), so on the main thread generation stalled whenever the trainer held it and slowed the trainer in
 * turn. What crosses: the requests and results by postMessage, and each version as a file path.
 *
 * Weights: `updateWeights` writes `<dir>/v<version>.gguf` (from the snapshot's tensors, or, for a snapshot that only
 * names a version, from the shared model's variables) and the worker loads it; requests admitted afterwards sample from it,
 * requests in flight finish on the version they started with (their results say so), and a replaced model is freed
 * when its last request ends. A LoRA run exports its frozen base once (`v<version>-base.gguf`, named by the version it
 * was written at: a base that changes is written under a new name) and each version's adapters as a
 * GGUF LoRA adapter (`v<version>-lora.gguf`, F32 whatever `type` the base has: adapters are small); the worker keeps
 * the base loaded and gives each version's contexts that version's adapter.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Worker } from "node:worker_threads"
import { Effect } from "effect"
import * as DiskFull from "../domain/DiskFull.ts"
import { InferenceError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { AdapterWeights, WeightSnapshot } from "../domain/WeightSnapshot.ts"
import * as GgufExport from "../model/GgufExport.ts"
import * as GgufLora from "../model/GgufLora.ts"
import * as Lora from "../model/Lora.ts"
import * as Transformer from "../model/Transformer.ts"
import * as Addon from "../native/Addon.ts"
import { type GenerateRequest, type GenerateResult, InferenceEngine } from "./InferenceEngine.ts"
import * as LlamaCppPackage from "./LlamaCppPackage.ts"

export interface LlamaCppEngineOptions {
  /** The policy's model: its config, and its weights for version 0 and for snapshots that carry no tensors. */
  readonly model: Transformer.Transformer
  /** Written into each GGUF file, and read by the worker to decode for stop strings. */
  readonly tokenizer: GgufExport.TokenizerFiles
  readonly type: GgufExport.ExportType
  /** Where each version's GGUF file is written (the newest two are kept). */
  readonly dir: string
  readonly maxBatch: number
  /** llama.cpp's CPU threads; default 1 (generator.engine.llamacpp_threads) */
  readonly threads?: number
  /**
   * The longest prompt + completion a request may have (default and upper bound: the model's max_position_embeddings);
   * each sequence gets this many KV cells, so a run sets its prompt and generation limits here rather than a real
   * model's 40 K positions.
   */
  readonly contextSize?: number
  /** At most this many sequences per llama.cpp context (default `sequencesPerContext`). */
  readonly sequencesPerContext?: number
}

/** Sequences per llama.cpp context (see the header: with more than one, a step's logits can go to the wrong sequence). */
export const sequencesPerContext = 1

// ---------------------------------------------------------------------------------------------------------------
// The protocol (worker/llamacpp-worker.ts is the other side)

export interface LlamaWorkerInit {
  readonly contextSize: number
  readonly maxBatch: number
  readonly sequencesPerContext: number
  readonly threads: number
  readonly tokenizer: GgufExport.TokenizerFiles
}

export type ToLlamaWorker =
  | { readonly type: "generate"; readonly id: number; readonly request: GenerateRequest }
  | {
      readonly type: "load"
      readonly id: number
      /** the model's GGUF file (a LoRA run's base: the same file at every version) */
      readonly file: string
      /** a LoRA run: this version's GGUF LoRA adapter */
      readonly lora?: string
      readonly version: number
    }
  | { readonly type: "close"; readonly id: number }

export type FromLlamaWorker =
  | { readonly type: "ready" }
  | { readonly type: "result"; readonly id: number; readonly result: GenerateResult }
  | { readonly type: "result"; readonly id: number; readonly error: string }
  | { readonly type: "ack"; readonly id: number; readonly error?: string }

/** The worker entry beside this file, with this file's extension (.ts in src/, .js in dist/). */
const workerUrl = (): URL => {
  const here = new URL(import.meta.url)
  const ext = here.pathname.endsWith(".ts") ? ".ts" : ".js"
  return new URL(`./worker/llamacpp-worker${ext}`, here)
}

const fail = (message: string) => (cause: unknown) =>
  new InferenceError({
    engine: "llamacpp",
    reason: "Internal",
    message: `${message}: ${cause instanceof Error ? cause.message : String(cause)}`
  })

// biome-ignore lint/complexity/noExcessiveLinesPerFunction: a make closure is its service's class (400 lines at most)
export const make = Effect.fnUntraced(function* (options: LlamaCppEngineOptions) {
  // here as well as in the worker: a missing node-llama-cpp fails the layer, saying how to install it
  yield* Effect.tryPromise({ try: LlamaCppPackage.load, catch: fail("generator.engine.kind llamacpp") })
  const config = options.model.config
  const contextSize = Math.min(options.contextSize ?? Infinity, config.maxPositionEmbeddings)
  let arrays = new Map<string, GgufExport.HfArray>()
  // a LoRA run: the base is written once, the adapters at every version
  const loraRun = options.model.adapters.size > 0
  let adapter: AdapterWeights | undefined
  // a LoRA run's base GGUF, named by the version it was written at: the worker shares a loaded model between the
  // versions that name the same file, so a base written again needs a new name
  let baseFile: string | undefined

  type Reply = Exclude<FromLlamaWorker, { readonly type: "ready" }>
  const pending = new Map<number, { resolve: (reply: Reply) => void; reject: (error: Error) => void }>()
  let nextId = 0
  let broken: Error | undefined
  const failAll = (error: Error) => {
    broken ??= error
    for (const p of pending.values()) p.reject(error)
    pending.clear()
  }
  const init: LlamaWorkerInit = {
    contextSize,
    maxBatch: options.maxBatch,
    sequencesPerContext: options.sequencesPerContext ?? sequencesPerContext,
    threads: options.threads ?? 1,
    tokenizer: options.tokenizer
  }
  const startWorker = () =>
    new Promise<Worker>((resolve, reject) => {
      const worker = new Worker(workerUrl(), { workerData: init })
      worker.on("message", (message: FromLlamaWorker) => {
        if (message.type === "ready") return resolve(worker)
        const p = pending.get(message.id)
        pending.delete(message.id)
        p?.resolve(message)
      })
      worker.on("error", (e) => {
        reject(e)
        failAll(new Error(`llama.cpp worker failed: ${e.message}`))
      })
      worker.on("exit", (code) => {
        reject(new Error(`llama.cpp worker exited (${code})`))
        failAll(new Error(`llama.cpp worker exited (${code})`))
      })
    })
  const call = (build: (id: number) => ToLlamaWorker) =>
    new Promise<Reply>((resolve, reject) => {
      if (broken !== undefined) return reject(broken)
      const id = nextId++
      pending.set(id, { resolve, reject })
      worker.postMessage(build(id))
    })

  // versions loaded in the worker; `version` is the one new requests sample from
  let version = 0
  // GgufExport.write writes beside and renames into place: llama.cpp maps a loaded GGUF file, and rewriting one in
  // place (the same version exported again) truncates pages a loaded model still reads, which kills it with SIGBUS
  const writeModel = (file: string) =>
    GgufExport.write(file, { config, arrays: [...arrays.values()], tokenizer: options.tokenizer, type: options.type })
  const load = async (next: number) => {
    await fs.mkdir(options.dir, { recursive: true })
    const stem = path.join(options.dir, `v${String(next).padStart(6, "0")}`)
    let file = `${stem}.gguf`
    let lora: string | undefined
    if (loraRun) {
      if (baseFile === undefined) {
        baseFile = `${stem}-base.gguf`
        await writeModel(baseFile)
      }
      file = baseFile
      lora = `${stem}-lora.gguf`
      await GgufLora.writeAdapter(lora, { config, adapter: adapter!, type: "F32" })
    } else {
      await writeModel(file)
    }
    const reply = await call((id) => ({
      type: "load",
      id,
      file,
      ...(lora === undefined ? {} : { lora }),
      version: next
    }))
    if (reply.type === "ack" && reply.error !== undefined) throw new Error(reply.error)
    version = next
    // keep the newest two versions' files and the base they use (llama.cpp maps what it loaded; an unlinked file stays
    // readable while mapped)
    const names = await fs.readdir(options.dir)
    const versions = names.filter((f) => /^v\d+(-lora)?\.gguf$/.test(f)).sort()
    const bases = names.filter((f) => /^v\d+-base\.gguf$/.test(f) && path.join(options.dir, f) !== baseFile)
    for (const f of [...versions.slice(0, -2), ...bases]) await fs.rm(path.join(options.dir, f), { force: true })
    // each version's contexts are allocated anew and the last one's freed: glibc keeps the freed pages (its heap
    // fragments and its mmap threshold rises), about 14 MB of resident memory a version, unless handed back
    Addon.load().kernels?.mallocTrim({})
  }
  /** The model's weights as they are now: the base (once, in a LoRA run) and the adapters. */
  const readModel = async () => {
    if (!loraRun || baseFile === undefined) {
      arrays = new Map((await Transformer.toHfArrays(options.model)).map((a) => [a.name, a]))
    }
    if (loraRun) adapter = await Lora.toWeights(options.model)
  }

  const worker: Worker = yield* Effect.acquireRelease(
    Effect.tryPromise({ try: startWorker, catch: fail("cannot start llama.cpp") }),
    (w) =>
      Effect.promise(async () => {
        w.removeAllListeners("exit")
        if (broken === undefined) await call((id) => ({ type: "close", id })).catch(() => undefined)
        await w.terminate()
      })
  )
  yield* Effect.tryPromise({
    try: async () => {
      await readModel()
      await load(0)
    },
    catch: fail("cannot export or load version 0")
  })

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
    try {
      // only what the worker reads: a request's callbacks and constraint objects do not cross
      const reply = await call((id) => ({
        type: "generate",
        id,
        request: { promptIds: request.promptIds, sampling: request.sampling }
      }))
      if (reply.type !== "result") throw new Error(`unexpected reply ${reply.type}`)
      if ("error" in reply) throw new Error(reply.error)
      const r = reply.result
      return {
        ...r,
        policyVersionFirst: PolicyVersion.make(r.policyVersionFirst),
        policyVersionLast: PolicyVersion.make(r.policyVersionLast)
      }
    } finally {
      giveSlot()
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
        if (snapshot.version < version) throw new Error(`version ${snapshot.version} < ${version}`)
        if (snapshot.adapter !== undefined) {
          if (!loraRun) throw new Error("a LoRA snapshot for a model without adapters")
          adapter = snapshot.adapter
        } else if (snapshot.names.length === 0) await readModel()
        else {
          snapshot.names.forEach((name, i) =>
            arrays.set(name, { name, shape: snapshot.shapes[i]!, data: snapshot.data[i]! })
          )
          baseFile = undefined // a LoRA run's base is written again if it ever changes
        }
        await load(snapshot.version)
      },
      // a full disk under the engine's GGUF directory stops the run in one line, as everywhere a run writes
      catch: DiskFull.orElse(options.dir, fail(`cannot load version ${snapshot.version}`))
    }).pipe(Effect.catchTag("DiskFullError", (e) => Effect.die(e)))

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
    version: Effect.sync(() => PolicyVersion.make(version))
  })
})
