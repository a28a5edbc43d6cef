/**
 * HF checkpoint directories: `config.json` + `model.safetensors` (or shards listed in `model.safetensors.index.json`)
 * [+ `generation_config.json`], the layout HF transformers' `from_pretrained` and vLLM load.
 *
 * This is the one file in model/ that touches the file system (Promise-based `node:fs`); the Effect shell wraps it
 * and maps `CheckpointLoadError` to the domain `CheckpointError`.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
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

/** Every tensor of a checkpoint directory, single-file or sharded, by HF name. */
export const readTensors = async (dir: string): Promise<Map<string, Safetensors.Tensor>> => {
  const single = path.join(dir, "model.safetensors")
  const index = path.join(dir, "model.safetensors.index.json")
  let files: Array<string>
  if (await exists(single)) files = [single]
  else if (await exists(index)) {
    const weightMap = (await readJson(index))["weight_map"] as Record<string, string> | undefined
    if (weightMap === undefined) throw new CheckpointLoadError(index, `has no "weight_map"`)
    files = [...new Set(Object.values(weightMap))].map((f) => path.join(dir, f))
  } else {
    throw new CheckpointLoadError(dir, "has neither model.safetensors nor model.safetensors.index.json")
  }
  const tensors = new Map<string, Safetensors.Tensor>()
  for (const file of files) {
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

/** Load a HF directory into a new Transformer (weights converted to float32). */
export const load = async (dir: string): Promise<Loaded> => {
  const config = await readConfig(dir)
  const tensors = await readTensors(dir)
  try {
    const model = Transformer.fromHfArrays(config, (name) => tensors.get(name))
    return { model, dtype: tensors.get("model.embed_tokens.weight")!.dtype }
  } catch (cause) {
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
