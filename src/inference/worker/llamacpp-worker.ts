/**
 * The worker-thread side of LlamaCppEngine (../LlamaCppEngine.ts has the protocol and the rules: log-probs, batching,
 * prefix reuse, versions). node-llama-cpp drives each decode step from JavaScript (a step's batch, the sampling, the
 * token's confidence), so generation here does not wait while the trainer holds the main thread, and the trainer does
 * not wait for it.
 */
import * as path from "node:path"
import { parentPort, workerData } from "node:worker_threads"
import * as ByteTokenizer from "../../tokenizer/ByteTokenizer.ts"
import * as HfTokenizer from "../../tokenizer/HfTokenizer.ts"
import type { GenerateRequest, GenerateResult } from "../InferenceEngine.ts"
import type { FromLlamaWorker, LlamaWorkerInit, ToLlamaWorker } from "../LlamaCppEngine.ts"
import * as LlamaCppPackage from "../LlamaCppPackage.ts"

const port = parentPort!
const init = workerData as LlamaWorkerInit
const post = (message: FromLlamaWorker) => port.postMessage(message)
const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

type LlamaModel = Awaited<ReturnType<LlamaCppPackage.Llama["loadModel"]>>
type LlamaContext = Awaited<ReturnType<LlamaModel["createContext"]>>
type LlamaSequence = ReturnType<LlamaContext["getSequence"]>

interface Loaded {
  readonly version: number
  readonly model: LlamaModel
  /** the GGUF file `model` was loaded from (a LoRA run's base: shared by its versions) */
  readonly file: string
  /** this version's GGUF LoRA adapter, applied by every context */
  readonly lora?: string
  readonly contexts: ReadonlyArray<LlamaContext>
  /** the sequences not in use, their KV cache kept: each running request holds one */
  readonly idle: Array<LlamaSequence>
  active: number
  replaced: boolean
}

/** How many leading tokens two sequences share. */
const commonPrefix = (a: ReadonlyArray<number>, b: ReadonlyArray<number>): number => {
  const n = Math.min(a.length, b.length)
  let i = 0
  while (i < n && a[i] === b[i]) i++
  return i
}

/** The free sequence whose cached tokens share the longest prefix with `prompt`, taken out of `idle`. */
const takeSequence = (idle: Array<LlamaSequence>, prompt: ReadonlyArray<number>) => {
  let best = 0
  let bestShared = -1
  idle.forEach((sequence, i) => {
    const shared = commonPrefix(sequence.contextTokens, prompt)
    if (shared > bestShared) {
      best = i
      bestShared = shared
    }
  })
  return idle.splice(best, 1)[0]!
}

const decoder = ByteTokenizer.isByteTokenizerJson(init.tokenizer.tokenizerJson)
  ? ByteTokenizer.fromHfFiles(init.tokenizer.tokenizerJson, init.tokenizer.tokenizerConfig)
  : HfTokenizer.fromFiles(init.tokenizer)

const llama = await LlamaCppPackage.cpu()

/** Loaded models by file, with how many versions use each: a LoRA run's versions share their base. */
const models = new Map<string, { readonly model: Promise<LlamaModel>; users: number }>()

const useModel = (file: string): Promise<LlamaModel> => {
  const entry = models.get(file) ?? { model: llama.loadModel({ modelPath: file, gpuLayers: 0 }), users: 0 }
  entry.users++
  models.set(file, entry)
  return entry.model
}

const releaseModel = async (file: string) => {
  const entry = models.get(file)
  if (entry === undefined || --entry.users > 0) return
  models.delete(file)
  await (await entry.model).dispose()
}

/**
 * node-llama-cpp (3.21.1) keeps every adapter a model has loaded, by path, until the model is disposed, and offers no
 * way to unload one; a run that loads an adapter per version would keep them all. Its internal map and the adapter's
 * own `dispose` unload a version's adapter once its contexts are gone.
 */
const unloadAdapter = async (model: LlamaModel, file: string) => {
  const adapters = (model as unknown as { _loraAdapters?: Map<string, { dispose?: () => Promise<void> | void }> })
    ._loraAdapters
  if (adapters === undefined) return
  const key = path.resolve(file)
  const adapter = adapters.get(key)
  adapters.delete(key)
  await adapter?.dispose?.()
}

const load = async (file: string, version: number, lora: string | undefined): Promise<Loaded> => {
  const model = await useModel(file).catch(async (e: unknown) => {
    await releaseModel(file).catch(() => undefined)
    throw e
  })
  const sizes: Array<number> = []
  for (let left = init.maxBatch; left > 0; left -= init.sequencesPerContext) {
    sizes.push(Math.min(left, init.sequencesPerContext))
  }
  const created = await Promise.allSettled(
    sizes.map((sequences) =>
      model.createContext({
        contextSize: init.contextSize * sequences,
        sequences,
        batchSize: Math.min(init.contextSize * sequences, 4096),
        flashAttention: false,
        // llama.cpp's default F16 cache alone moves log-probs by ~1e-2; F32 keeps an F32 export at ~1e-5
        experimentalKvCacheKeyType: "F32",
        experimentalKvCacheValueType: "F32",
        // one thread unless told: more than the cores it has to itself makes llama.cpp's threads wait on each other
        threads: init.threads,
        // scale 1: llama.cpp multiplies it by the adapter's own alpha / rank, as PEFT does
        ...(lora === undefined ? {} : { lora: { adapters: [{ filePath: lora, scale: 1 }] } })
      })
    )
  )
  const contexts = created.flatMap((c) => (c.status === "fulfilled" ? [c.value] : []))
  const failed = created.find((c) => c.status === "rejected")
  if (failed !== undefined) {
    for (const context of contexts) await context.dispose()
    if (lora !== undefined) await unloadAdapter(model, lora)
    await releaseModel(file)
    throw failed.reason
  }
  const idle = contexts.flatMap((context, i) => Array.from({ length: sizes[i]! }, () => context.getSequence()))
  return { version, model, file, ...(lora === undefined ? {} : { lora }), contexts, idle, active: 0, replaced: false }
}

const free = async (loaded: Loaded) => {
  for (const context of loaded.contexts) await context.dispose()
  if (loaded.lora !== undefined) await unloadAdapter(loaded.model, loaded.lora)
  await releaseModel(loaded.file)
}

let current: Loaded | undefined

const generate = async (request: GenerateRequest): Promise<GenerateResult> => {
  const loaded = current
  if (loaded === undefined) throw new Error("no weights loaded")
  loaded.active++
  const prompt = request.promptIds
  const sequence = takeSequence(loaded.idle, prompt)
  try {
    const s = request.sampling
    const limit = Math.min(s.maxNewTokens, init.contextSize - prompt.length)
    const tokens: Array<number> = []
    const logprobs: Array<number> = []
    let finishReason: "stop" | "length" = "length"
    if (limit > 0) {
      // keep the cached prefix (at least the prompt's last token is evaluated: its logits give the first token)
      const keep = Math.max(0, Math.min(commonPrefix(sequence.contextTokens, prompt), prompt.length - 1))
      if (keep < sequence.nextTokenIndex) {
        await sequence.eraseContextTokenRanges([{ start: keep, end: sequence.nextTokenIndex }])
      }
      for await (const out of sequence.evaluateWithMetadata(
        prompt.slice(sequence.nextTokenIndex) as Array<never>,
        { confidence: true },
        { temperature: s.temperature, topK: s.topK, topP: s.topP, seed: s.seed, yieldEogToken: true }
      )) {
        tokens.push(out.token)
        logprobs.push(Math.log(out.confidence))
        if (s.stopTokenIds.includes(out.token)) {
          finishReason = "stop"
          break
        }
        if (s.stopStrings.length > 0) {
          const text = decoder.decode(tokens)
          if (s.stopStrings.some((stop) => text.includes(stop))) {
            finishReason = "stop"
            break
          }
        }
        if (tokens.length >= limit) break
      }
    }
    return {
      tokens,
      logprobs,
      finishReason,
      policyVersionFirst: loaded.version as GenerateResult["policyVersionFirst"],
      policyVersionLast: loaded.version as GenerateResult["policyVersionLast"]
    }
  } finally {
    loaded.idle.push(sequence)
    loaded.active--
    if (loaded.replaced && loaded.active === 0) await free(loaded)
  }
}

const handle = async (message: ToLlamaWorker) => {
  switch (message.type) {
    case "generate":
      try {
        post({ type: "result", id: message.id, result: await generate(message.request) })
      } catch (e) {
        post({ type: "result", id: message.id, error: messageOf(e) })
      }
      return
    case "load":
      try {
        const next = await load(message.file, message.version, message.lora)
        const previous = current
        current = next
        if (previous !== undefined) {
          previous.replaced = true
          if (previous.active === 0) await free(previous)
        }
        post({ type: "ack", id: message.id })
      } catch (e) {
        post({ type: "ack", id: message.id, error: messageOf(e) })
      }
      return
    case "close":
      // the requests in flight have ended (the main thread closes the engine with its scope)
      if (current !== undefined) await free(current)
      current = undefined
      await llama.dispose()
      post({ type: "ack", id: message.id })
      port.close()
      return
  }
}

port.on("message", (message: ToLlamaWorker) => void handle(message))
post({ type: "ready" })
