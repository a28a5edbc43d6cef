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
import * as tf from "@tensorflow/tfjs"
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

/** Save the attached adapters as a PEFT directory (adapter_config.json + adapter_model.safetensors). */
export const save = async (
  model: Transformer.Transformer,
  dir: string,
  options: LoraOptions,
  baseModelPath: string | null = null
): Promise<void> => {
  if (model.adapters.size === 0) throw new Error("LoRA.save: the model has no adapters")
  const tensors: Array<Safetensors.NamedTensor> = []
  for (const [module, adapter] of model.adapters) {
    const [inDim, r] = adapter.a.shape as [number, number]
    const outDim = adapter.b.shape[1]!
    tensors.push({
      name: peftName(module, "A"),
      shape: [r, inDim],
      data: Transformer.transpose2d((await adapter.a.data()) as Float32Array, inDim, r)
    })
    tensors.push({
      name: peftName(module, "B"),
      shape: [outDim, r],
      data: Transformer.transpose2d((await adapter.b.data()) as Float32Array, r, outDim)
    })
  }
  const config = {
    peft_type: "LORA",
    task_type: "CAUSAL_LM",
    base_model_name_or_path: baseModelPath,
    r: options.rank,
    lora_alpha: options.alpha,
    lora_dropout: options.dropout,
    target_modules: [...options.targetModules],
    bias: "none",
    fan_in_fan_out: false,
    inference_mode: true,
    init_lora_weights: true,
    modules_to_save: null,
    layers_to_transform: null,
    use_rslora: false,
    use_dora: false,
    revision: null
  }
  await fs.mkdir(dir, { recursive: true })
  await fs.writeFile(path.join(dir, "adapter_config.json"), `${JSON.stringify(config, null, 2)}\n`)
  await fs.writeFile(path.join(dir, "adapter_model.safetensors"), Safetensors.encode(tensors))
}

/** Load a PEFT adapter directory onto the model (replacing attached adapters); returns its options. */
export const load = async (model: Transformer.Transformer, dir: string): Promise<LoraOptions> => {
  const configFile = path.join(dir, "adapter_config.json")
  let json: Record<string, unknown>
  try {
    json = JSON.parse(await fs.readFile(configFile, "utf8")) as Record<string, unknown>
  } catch (cause) {
    throw new Checkpoint.CheckpointLoadError(configFile, (cause as Error).message)
  }
  const targetModules = json["target_modules"]
  const options: LoraOptions = {
    rank: Number(json["r"]),
    alpha: Number(json["lora_alpha"]),
    dropout: Number(json["lora_dropout"] ?? 0),
    targetModules: Array.isArray(targetModules) ? targetModules.map(String) : [String(targetModules)]
  }
  const file = path.join(dir, "adapter_model.safetensors")
  const { tensors } = Safetensors.decode(await fs.readFile(file), file)
  detach(model)
  try {
    for (const module of targets(model, options.targetModules)) {
      const a = tensors.get(peftName(module, "A"))
      const b = tensors.get(peftName(module, "B"))
      if (a === undefined || b === undefined)
        throw new Error(`missing ${peftName(module, a === undefined ? "A" : "B")}`)
      const [r, inDim] = a.shape as [number, number]
      const outDim = b.shape[0]!
      if (r !== options.rank || b.shape[1] !== r)
        throw new Error(`${module}: adapter rank does not match r = ${options.rank}`)
      addAdapter(
        model,
        module,
        options,
        Transformer.transpose2d(a.data, r, inDim),
        Transformer.transpose2d(b.data, outDim, r),
        inDim,
        outDim
      )
    }
  } catch (cause) {
    detach(model)
    throw new Checkpoint.CheckpointLoadError(file, (cause as Error).message)
  }
  for (const v of model.params.values()) v.trainable = false
  return options
}
