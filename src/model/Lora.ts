/**
 * LoRA (Hu et al. 2021) adapters on chosen linear modules: `y = x W + dropout(x) Aᵀ Bᵀ · α/r`, A [r, in] initialised
 * as PEFT does (Kaiming-uniform, a = √5, i.e. U(−1/√in, 1/√in)), B [out, r] zeros, so attaching changes nothing until
 * training moves B. The base weights are frozen (`trainable = false`); `Transformer.trainableVariables` then returns
 * only the adapters.
 *
 * Saved in PEFT's layout, loadable by `PeftModel.from_pretrained`: `adapter_config.json` and
 * `adapter_model.safetensors` with tensors `base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight`
 * [out, r]. We hold both transposed (Aᵀ [in, r], Bᵀ [r, out]) for the same XNNPACK reason as the base weights.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import * as tf from "../tensor/Tf.ts"
import type { AdapterWeights } from "../domain/WeightSnapshot.ts"
import * as Checkpoint from "./Checkpoint.ts"
import * as Prng from "./Prng.ts"
import * as Safetensors from "./Safetensors.ts"
import * as Transformer from "./Transformer.ts"

export interface LoraOptions {
  readonly rank: number // r
  readonly alpha: number // α; the update is scaled by α / r
  readonly dropout: number // on the adapter's input, training only
  readonly targetModules: ReadonlyArray<string> // e.g. ["q_proj", "k_proj", "v_proj", "o_proj"]
}

const linearModules = (model: Transformer.Transformer): Array<string> =>
  [...model.params.keys()].filter((n) => n.endsWith("_proj.weight")).map((n) => n.slice(0, -".weight".length))

/** The modules `targetModules` selects (by last name component, as PEFT matches them). */
export const targets = (model: Transformer.Transformer, targetModules: ReadonlyArray<string>): Array<string> => {
  const chosen = linearModules(model).filter((m) => targetModules.includes(m.split(".").pop()!))
  if (chosen.length === 0) throw new Error(`LoRA: target_modules [${targetModules.join(", ")}] match no linear module`)
  return chosen
}

/** Attach fresh adapters (seeded) and freeze the base. Replaces adapters already attached. */
export const attach = (model: Transformer.Transformer, options: LoraOptions, seed = 0): void => {
  if (!(options.rank > 0)) throw new Error(`LoRA: rank must be positive, got ${options.rank}`)
  detach(model)
  const prng = Prng.make(seed)
  for (const module of targets(model, options.targetModules)) {
    const [inDim, outDim] = model.params.get(`${module}.weight`)!.shape as [number, number] // held [in, out]
    const bound = 1 / Math.sqrt(inDim)
    const a = Float32Array.from({ length: inDim * options.rank }, () => (2 * prng.next() - 1) * bound)
    addAdapter(model, module, options, a, new Float32Array(options.rank * outDim), inDim, outDim)
  }
  for (const v of model.params.values()) v.trainable = false
}

/** `aHeld` = Aᵀ [in, r], `bHeld` = Bᵀ [r, out]. */
const addAdapter = (
  model: Transformer.Transformer,
  module: string,
  options: LoraOptions,
  aHeld: Float32Array,
  bHeld: Float32Array,
  inDim: number,
  outDim: number
): void => {
  const r = options.rank
  const a = tf.tidy(() => tf.variable(tf.tensor2d(aHeld, [inDim, r]), true, `t${model.id}/${module}.lora_A`))
  const b = tf.tidy(() => tf.variable(tf.tensor2d(bHeld, [r, outDim]), true, `t${model.id}/${module}.lora_B`))
  model.adapters.set(module, { a, b, scale: options.alpha / r, dropout: options.dropout })
}

/** Remove adapters without merging; the base becomes trainable again. */
export const detach = (model: Transformer.Transformer): void => {
  for (const adapter of model.adapters.values()) {
    adapter.a.dispose()
    adapter.b.dispose()
  }
  model.adapters.clear()
  for (const v of model.params.values()) v.trainable = true
}

/** Fold the adapters into the base weights (W ← W + α/r · Aᵀ Bᵀ, held layout) and detach them. */
export const merge = (model: Transformer.Transformer): void => {
  for (const [module, adapter] of model.adapters) {
    const w = model.params.get(`${module}.weight`)!
    tf.tidy(() => w.assign(tf.add(w, tf.mul(tf.matMul(adapter.a, adapter.b), adapter.scale))))
  }
  detach(model)
}

const peftName = (module: string, which: "A" | "B") => `base_model.model.${module}.lora_${which}.weight`
const peftPattern = /^base_model\.model\.(.+)\.lora_([AB])\.weight$/

/** The options of the adapters attached to `model` (rank, α = scale · r, dropout, targets by last name component). */
export const optionsOf = (model: Transformer.Transformer): LoraOptions => {
  const first = [...model.adapters.values()][0]
  if (first === undefined) throw new Error("LoRA: the model has no adapters")
  const rank = first.a.shape[1]!
  return {
    rank,
    alpha: first.scale * rank,
    dropout: first.dropout,
    targetModules: [...new Set([...model.adapters.keys()].map((m) => m.split(".").pop()!))]
  }
}

/** The attached adapters as PEFT tensors (A [r, in], B [out, r]). Async: tensors are downloaded. */
export const toWeights = async (
  model: Transformer.Transformer,
  options: LoraOptions = optionsOf(model)
): Promise<AdapterWeights> => {
  if (model.adapters.size === 0) throw new Error("LoRA: the model has no adapters")
  const names: Array<string> = []
  const shapes: Array<Array<number>> = []
  const data: Array<Float32Array> = []
  for (const [module, adapter] of model.adapters) {
    const [inDim, r] = adapter.a.shape as [number, number]
    const outDim = adapter.b.shape[1]!
    names.push(peftName(module, "A"), peftName(module, "B"))
    shapes.push([r, inDim], [outDim, r])
    data.push(
      Transformer.transpose2d((await adapter.a.data()) as Float32Array, inDim, r),
      Transformer.transpose2d((await adapter.b.data()) as Float32Array, r, outDim)
    )
  }
  return {
    rank: options.rank,
    alpha: options.alpha,
    dropout: options.dropout,
    targetModules: [...options.targetModules],
    names,
    shapes,
    data
  }
}

/**
 * Attach `weights` to the model, replacing its adapters, and freeze the base. Throws, leaving no adapter attached,
 * when a target module's tensors are missing or of the wrong shape.
 */
export const attachWeights = (model: Transformer.Transformer, weights: AdapterWeights): LoraOptions => {
  const options: LoraOptions = {
    rank: weights.rank,
    alpha: weights.alpha,
    dropout: weights.dropout,
    targetModules: weights.targetModules
  }
  const byName = new Map(weights.names.map((n, i) => [n, i]))
  for (const name of weights.names) {
    const module = peftPattern.exec(name)?.[1]
    if (module === undefined || !model.params.has(`${module}.weight`))
      throw new Error(`adapter tensor ${name} names no linear module of the model`)
  }
  detach(model)
  try {
    for (const module of targets(model, options.targetModules)) {
      const ia = byName.get(peftName(module, "A"))
      const ib = byName.get(peftName(module, "B"))
      if (ia === undefined || ib === undefined)
        throw new Error(`missing ${peftName(module, ia === undefined ? "A" : "B")}`)
      const [r, inDim] = weights.shapes[ia] as [number, number]
      const [outDim, rb] = weights.shapes[ib] as [number, number]
      const [heldIn, heldOut] = model.params.get(`${module}.weight`)!.shape as [number, number]
      if (r !== options.rank || rb !== r) throw new Error(`${module}: adapter rank does not match r = ${options.rank}`)
      if (inDim !== heldIn || outDim !== heldOut)
        throw new Error(`${module}: adapter is [${outDim}, ${inDim}], the module is [${heldOut}, ${heldIn}]`)
      addAdapter(
        model,
        module,
        options,
        Transformer.transpose2d(weights.data[ia]!, r, inDim),
        Transformer.transpose2d(weights.data[ib]!, outDim, r),
        inDim,
        outDim
      )
    }
  } catch (cause) {
    detach(model)
    throw cause
  }
  for (const v of model.params.values()) v.trainable = false
  return options
}

/**
 * Run `f` with the model's adapters swapped for `adapters` (none: the base model alone), restoring them after. `f`
 * must be synchronous: nothing else may see the model meanwhile.
 */
export const withAdapters = <A>(
  model: Transformer.Transformer,
  adapters: ReadonlyMap<string, Transformer.Adapter>,
  f: () => A
): A => {
  const saved = new Map(model.adapters)
  model.adapters.clear()
  for (const [k, v] of adapters) model.adapters.set(k, v)
  try {
    return f()
  } finally {
    model.adapters.clear()
    for (const [k, v] of saved) model.adapters.set(k, v)
  }
}

/** PEFT's `adapter_config.json` for `weights`. */
export const peftConfig = (
  weights: Pick<AdapterWeights, "rank" | "alpha" | "dropout" | "targetModules">,
  baseModelPath: string | null = null
) => ({
  peft_type: "LORA",
  task_type: "CAUSAL_LM",
  base_model_name_or_path: baseModelPath,
  r: weights.rank,
  lora_alpha: weights.alpha,
  lora_dropout: weights.dropout,
  target_modules: [...weights.targetModules],
  bias: "none",
  fan_in_fan_out: false,
  inference_mode: true,
  init_lora_weights: true,
  modules_to_save: null,
  layers_to_transform: null,
  use_rslora: false,
  use_dora: false,
  revision: null
})

export const configFile = "adapter_config.json"
export const weightsFile = "adapter_model.safetensors"

/** Write `weights` as a PEFT directory (adapter_config.json + adapter_model.safetensors, F32); returns the bytes. */
export const writeDir = async (
  dir: string,
  weights: AdapterWeights,
  baseModelPath: string | null = null
): Promise<number> => {
  const bytes = Safetensors.encode(
    weights.names.map((name, i) => ({ name, shape: weights.shapes[i]!, data: weights.data[i]! }))
  )
  const config = `${JSON.stringify(peftConfig(weights, baseModelPath), null, 2)}\n`
  await fs.mkdir(dir, { recursive: true })
  await fs.writeFile(path.join(dir, configFile), config)
  await fs.writeFile(path.join(dir, weightsFile), bytes)
  return bytes.byteLength + Buffer.byteLength(config)
}

/** Whether `dir` holds a PEFT adapter (its adapter_config.json). */
export const isAdapterDir = async (dir: string): Promise<boolean> =>
  fs.access(path.join(dir, configFile)).then(
    () => true,
    () => false
  )

/** The adapter's base model as its config records it (`base_model_name_or_path`), when it does. */
export const baseModelOf = async (dir: string): Promise<string | undefined> => {
  const json = JSON.parse(await fs.readFile(path.join(dir, configFile), "utf8")) as Record<string, unknown>
  const base = json["base_model_name_or_path"]
  return typeof base === "string" && base.length > 0 ? base : undefined
}

/** Read a PEFT adapter directory. Fails with CheckpointLoadError naming the file. */
export const readDir = async (dir: string): Promise<AdapterWeights> => {
  const config = path.join(dir, configFile)
  let json: Record<string, unknown>
  try {
    json = JSON.parse(await fs.readFile(config, "utf8")) as Record<string, unknown>
  } catch (cause) {
    throw new Checkpoint.CheckpointLoadError(config, (cause as Error).message)
  }
  if (json["peft_type"] !== undefined && json["peft_type"] !== "LORA")
    throw new Checkpoint.CheckpointLoadError(config, `peft_type ${String(json["peft_type"])}: only LORA adapters load`)
  for (const flag of ["use_dora", "use_rslora"] as const)
    if (json[flag] === true) throw new Checkpoint.CheckpointLoadError(config, `${flag}: true is not supported`)
  const rank = Number(json["r"])
  const alpha = Number(json["lora_alpha"])
  if (!(Number.isInteger(rank) && rank > 0) || !(alpha > 0))
    throw new Checkpoint.CheckpointLoadError(
      config,
      `r (${json["r"]}) and lora_alpha (${json["lora_alpha"]}) must be positive`
    )
  const targetModules = json["target_modules"]
  const file = path.join(dir, weightsFile)
  let decoded: Safetensors.Decoded
  try {
    decoded = Safetensors.decode(await fs.readFile(file), file)
  } catch (cause) {
    throw new Checkpoint.CheckpointLoadError(file, (cause as Error).message)
  }
  const names = [...decoded.tensors.keys()].filter((n) => peftPattern.test(n))
  return {
    rank,
    alpha,
    dropout: Number(json["lora_dropout"] ?? 0),
    targetModules: Array.isArray(targetModules) ? targetModules.map(String) : [String(targetModules)],
    names,
    shapes: names.map((n) => decoded.tensors.get(n)!.shape),
    data: names.map((n) => decoded.tensors.get(n)!.data)
  }
}

/** Save the attached adapters as a PEFT directory (adapter_config.json + adapter_model.safetensors). */
export const save = async (
  model: Transformer.Transformer,
  dir: string,
  options: LoraOptions,
  baseModelPath: string | null = null
): Promise<void> => {
  if (model.adapters.size === 0) throw new Error("LoRA.save: the model has no adapters")
  await writeDir(dir, await toWeights(model, options), baseModelPath)
}

/** Load a PEFT adapter directory onto the model (replacing attached adapters); returns its options. */
export const load = async (model: Transformer.Transformer, dir: string): Promise<LoraOptions> => {
  const weights = await readDir(dir)
  try {
    return attachWeights(model, weights)
  } catch (cause) {
    throw new Checkpoint.CheckpointLoadError(path.join(dir, weightsFile), (cause as Error).message)
  }
}
