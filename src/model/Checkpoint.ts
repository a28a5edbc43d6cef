/**
 * HF checkpoint directories: `config.json` + `model.safetensors` (or shards listed in `model.safetensors.index.json`)
 * [+ `generation_config.json`], the layout HF transformers' `from_pretrained` and vLLM load.
 *
 * This and HfCache.ts (which only finds a directory by model name) are the files in model/ that touch the file system
 * (`node:fs`); the Effect shell wraps them and maps `CheckpointLoadError` to the domain `CheckpointError`.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import type * as tf from "../tensor/Tf.ts"
import * as ModelConfig from "./ModelConfig.ts"
import * as Safetensors from "./Safetensors.ts"
import * as Transformer from "./Transformer.ts"

export class CheckpointLoadError extends Error {
  override readonly name = "CheckpointLoadError"
  readonly path: string
  constructor(file: string, message: string) {
    super(`${file}: ${message}`)
    this.path = file
  }
}

const readJson = async (file: string): Promise<Record<string, unknown>> => {
  let text: string
  try {
    text = await fs.readFile(file, "utf8")
  } catch (cause) {
    throw new CheckpointLoadError(file, `cannot read (${(cause as Error).message})`)
  }
  try {
    return JSON.parse(text) as Record<string, unknown>
  } catch (cause) {
    throw new CheckpointLoadError(file, `not valid JSON (${(cause as Error).message})`)
  }
}

const exists = (file: string): Promise<boolean> =>
  fs.access(file).then(
    () => true,
    () => false
  )

/** The weight files of a checkpoint directory: `model.safetensors`, or the shards its index lists. */
const weightFiles = async (dir: string): Promise<Array<string>> => {
  const single = path.join(dir, "model.safetensors")
  const index = path.join(dir, "model.safetensors.index.json")
  if (await exists(single)) return [single]
  if (await exists(index)) {
    const weightMap = (await readJson(index))["weight_map"] as Record<string, string> | undefined
    if (weightMap === undefined) throw new CheckpointLoadError(index, `has no "weight_map"`)
    return [...new Set(Object.values(weightMap))].map((f) => path.join(dir, f))
  }
  throw new CheckpointLoadError(dir, "has neither model.safetensors nor model.safetensors.index.json")
}

/** Every tensor of a checkpoint directory, single-file or sharded, by HF name. Reads whole files: small ones only. */
export const readTensors = async (dir: string): Promise<Map<string, Safetensors.Tensor>> => {
  const tensors = new Map<string, Safetensors.Tensor>()
  for (const file of await weightFiles(dir)) {
    let bytes: Uint8Array
    try {
      bytes = await fs.readFile(file)
    } catch (cause) {
      throw new CheckpointLoadError(file, `cannot read (${(cause as Error).message})`)
    }
    let decoded: Safetensors.Decoded
    try {
      decoded = Safetensors.decode(bytes, file)
    } catch (cause) {
      throw new CheckpointLoadError(file, (cause as Error).message)
    }
    for (const [name, t] of decoded.tensors) tensors.set(name, t)
  }
  return tensors
}

/** Where a tensor's bytes are: its file and header entry. */
export interface Located {
  readonly file: string
  readonly entry: Safetensors.Entry
}

/** Every tensor's place, from the files' headers alone (no tensor data is read). */
export const readEntries = async (dir: string): Promise<Map<string, Located>> => {
  const located = new Map<string, Located>()
  for (const file of await weightFiles(dir)) {
    let handle: fs.FileHandle
    try {
      handle = await fs.open(file, "r")
    } catch (cause) {
      throw new CheckpointLoadError(file, `cannot read (${(cause as Error).message})`)
    }
    try {
      const size = (await handle.stat()).size
      const first8 = new Uint8Array(8)
      await handle.read(first8, 0, 8, 0)
      const length = Safetensors.headerLength(first8, size, file)
      const header = new Uint8Array(length)
      await handle.read(header, 0, length, 8)
      for (const entry of Safetensors.parseHeader(header, size, file).entries) located.set(entry.name, { file, entry })
    } catch (cause) {
      if (cause instanceof CheckpointLoadError) throw cause
      throw new CheckpointLoadError(file, (cause as Error).message)
    } finally {
      await handle.close()
    }
  }
  return located
}

/**
 * Reads one tensor into `out` as float32, transposed (`[rows, cols]` → `[cols, rows]`) when asked. The default reads
 * blocks of rows with `node:fs` and widens them in JS; the native addon has a faster one (src/native/TensorFile.ts).
 */
export type TensorReader = (at: Located, out: Float32Array, transpose: boolean) => Promise<void>

/** The JS reader: blocks of about 16 MB, so only `out` and one block are in memory. */
export const jsReader: TensorReader = async ({ file, entry }, out, transpose) => {
  const bytesPer = Safetensors.elementBytes(entry.dtype)
  const [rows, cols] = entry.shape.length === 2 ? [entry.shape[0]!, entry.shape[1]!] : [1, out.length]
  const rowBytes = Math.max(1, cols * bytesPer)
  const blockRows = Math.max(1, Math.floor((16 << 20) / rowBytes))
  const handle = await fs.open(file, "r")
  try {
    const buffer = new Uint8Array(Math.min(rows, blockRows) * rowBytes)
    for (let r0 = 0; r0 < rows; r0 += blockRows) {
      const n = Math.min(blockRows, rows - r0)
      const want = n * rowBytes
      let got = 0
      while (got < want) {
        const { bytesRead } = await handle.read(buffer, got, want - got, entry.begin + r0 * rowBytes + got)
        if (bytesRead === 0) throw new CheckpointLoadError(file, `ends inside tensor ${entry.name}`)
        got += bytesRead
      }
      Safetensors.widenInto(
        buffer.subarray(0, want),
        entry.dtype,
        out,
        transpose ? { firstRow: r0, rows, cols } : { at: r0 * cols }
      )
    }
  } finally {
    await handle.close()
  }
}

/** The architecture of a checkpoint directory (its `config.json`). */
export const readConfig = async (dir: string): Promise<ModelConfig.TransformerConfig> => {
  const file = path.join(dir, "config.json")
  const json = await readJson(file)
  try {
    return ModelConfig.fromHf(json)
  } catch (cause) {
    throw new CheckpointLoadError(file, (cause as Error).message)
  }
}

export interface Loaded {
  readonly model: Transformer.Transformer
  readonly dtype: Safetensors.ReadDType // of the embedding, i.e. what the checkpoint was saved in
}

export interface LoadOptions {
  /** How each tensor is read (default `jsReader`; the native addon's is faster: src/native/TensorFile.ts). */
  readonly reader?: TensorReader
  /**
   * Called with each weight as soon as it is loaded, before the next is read: a frozen weight can be stored compactly
   * there (`NativeBackend.storeBf16`), so that the float32 copy of the whole model never exists.
   */
  readonly store?: (name: string, variable: tf.Variable) => void
}

/**
 * Load a HF directory into a new Transformer (weights converted to float32). Streams: each tensor is read from disk
 * straight into the array the model keeps (linear weights transposed on the way), one tensor at a time, so memory
 * holds the model and one read block, never the file's bytes beside it.
 */
export const load = async (dir: string, options: LoadOptions = {}): Promise<Loaded> => {
  const config = await readConfig(dir)
  const located = await readEntries(dir)
  const reader = options.reader ?? jsReader
  const read = async (spec: Transformer.ParameterSpec): Promise<Transformer.HfArray | undefined> => {
    const at = located.get(spec.name)
    if (at === undefined) return undefined // fromHfArraysStreaming names what is missing
    const { shape } = at.entry
    const fits = shape.length === spec.hfShape.length && shape.every((d, i) => d === spec.hfShape[i])
    if (!fits) return { shape, data: new Float32Array(0) } // and what has the wrong shape
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1))
    try {
      await reader(at, data, spec.transposed)
    } catch (cause) {
      if (cause instanceof CheckpointLoadError) throw cause
      throw new CheckpointLoadError(at.file, `tensor ${spec.name}: ${(cause as Error).message}`)
    }
    return { shape, data }
  }
  try {
    const model = await Transformer.fromHfArraysStreaming(config, read, options.store)
    return { model, dtype: located.get("model.embed_tokens.weight")!.entry.dtype }
  } catch (cause) {
    if (cause instanceof CheckpointLoadError) throw cause
    throw new CheckpointLoadError(dir, (cause as Error).message)
  }
}

export interface SaveOptions {
  readonly dtype?: Safetensors.WriteDType // default F32
  /** Split into shards of at most this many bytes (+ index), as `save_pretrained(max_shard_size=...)`. */
  readonly maxShardBytes?: number
  /** Written as generation_config.json when given. */
  readonly generationConfig?: Readonly<Record<string, unknown>>
}

/** Write tensors as model.safetensors, or as shards + model.safetensors.index.json. */
export const writeTensors = async (
  dir: string,
  tensors: ReadonlyArray<Safetensors.NamedTensor>,
  options: SaveOptions = {}
): Promise<void> => {
  const dtype = options.dtype ?? "F32"
  const width = dtype === "F32" ? 4 : 2
  const max = options.maxShardBytes ?? Number.POSITIVE_INFINITY
  const shards: Array<Array<Safetensors.NamedTensor>> = [[]]
  let size = 0
  for (const t of tensors) {
    const bytes = t.data.length * width
    if (size > 0 && size + bytes > max) {
      shards.push([])
      size = 0
    }
    shards[shards.length - 1]!.push(t)
    size += bytes
  }
  await fs.mkdir(dir, { recursive: true })
  // A stale file of the other form would win on load (model.safetensors is read first): remove it.
  await fs.rm(path.join(dir, shards.length === 1 ? "model.safetensors.index.json" : "model.safetensors"), {
    force: true
  })
  if (shards.length === 1) {
    await fs.writeFile(path.join(dir, "model.safetensors"), Safetensors.encode(shards[0]!, dtype))
    return
  }
  const weightMap: Record<string, string> = {}
  let total = 0
  for (const [i, shard] of shards.entries()) {
    const file = `model-${String(i + 1).padStart(5, "0")}-of-${String(shards.length).padStart(5, "0")}.safetensors`
    await fs.writeFile(path.join(dir, file), Safetensors.encode(shard, dtype))
    for (const t of shard) {
      weightMap[t.name] = file
      total += t.data.length * width
    }
  }
  const index = { metadata: { total_size: total }, weight_map: weightMap }
  await fs.writeFile(path.join(dir, "model.safetensors.index.json"), `${JSON.stringify(index, null, 2)}\n`)
}

/** Save a Transformer as a HF directory (config.json, weights, optional generation_config.json). */
export const save = async (model: Transformer.Transformer, dir: string, options: SaveOptions = {}): Promise<void> => {
  const dtype = options.dtype ?? "F32"
  await fs.mkdir(dir, { recursive: true })
  const config = ModelConfig.toHf(model.config, dtype === "F32" ? "float32" : "bfloat16")
  await fs.writeFile(path.join(dir, "config.json"), `${JSON.stringify(config, null, 2)}\n`)
  await writeTensors(dir, await Transformer.toHfArrays(model), options)
  if (options.generationConfig !== undefined) {
    await fs.writeFile(
      path.join(dir, "generation_config.json"),
      `${JSON.stringify(options.generationConfig, null, 2)}\n`
    )
  }
}
