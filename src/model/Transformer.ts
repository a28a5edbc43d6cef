/**
 * A decoder-only transformer of the Qwen3 / Qwen2 / Llama family in TensorFlow.js: the model itself, its parameters
 * under their HF names (specs, initialisation, import from and export to HF-layout arrays), its LoRA adapters'
 * bookkeeping and how its frozen weights are stored. Its forward pass, numerically the HF forward, is Decoder.ts, over
 * the weights a view (WeightView.ts) gathers; the custom-gradient linear layers are Linear.ts.
 *
 * Departure from the HF code, on purpose (it does not change the maths): linear weights are held TRANSPOSED,
 * `[in, out]`, so every projection is `x @ W` on a 2-D `x`: the wasm backend runs only untransposed, unbatched matmuls
 * on XNNPACK (~10× faster). The variables still carry HF names; the HF `[out, in]` layout is restored on
 * save/snapshot (`toHfArrays`). `lm_head` (untied) is held as `[D, V]`; a tied head reuses `embed_tokens` `[V, D]`,
 * transposed once per forward (or once per weight version for inference).
 *
 * Legend: D hidden, V vocab.
 */
import * as tf from "../tensor/Tf.ts"
import type { TransformerConfig } from "./ModelConfig.ts"
import * as Prng from "./Prng.ts"

/** A LoRA adapter on one linear module (see Lora.ts): `y += dropout(x) @ A @ B · scale`. */
export interface Adapter {
  readonly a: tf.Variable // Aᵀ [in, r]   (PEFT lora_A.weight is [r, in])
  readonly b: tf.Variable // Bᵀ [r, out]  (PEFT lora_B.weight is [out, r])
  readonly scale: number // alpha / r
  readonly dropout: number
}

export interface Transformer {
  readonly config: TransformerConfig
  /** HF tensor name → variable. Linear weights (`*_proj.weight`, `lm_head.weight`) are held transposed `[in, out]`. */
  readonly params: ReadonlyMap<string, tf.Variable>
  /** HF module name (`model.layers.0.self_attn.q_proj`) → adapter. Empty unless LoRA is attached. */
  readonly adapters: Map<string, Adapter>
  /** Unique per process: tfjs variable names are global, so ours are `t<id>/<hf name>`. */
  readonly id: number
}

export interface ParameterSpec {
  readonly name: string // HF name
  readonly hfShape: ReadonlyArray<number> // shape as HF stores it
  readonly transposed: boolean // held as the transpose of hfShape
  readonly init: "normal" | "ones" | "zeros"
}

/** True for tensors HF stores `[out, in]` that we hold `[in, out]`. */
export const isTransposed = (name: string): boolean => name.endsWith("_proj.weight") || name === "lm_head.weight"

/** Every parameter of the architecture, in HF order and layout. */
export const parameterSpecs = (c: TransformerConfig): ReadonlyArray<ParameterSpec> => {
  const specs: Array<ParameterSpec> = []
  const add = (name: string, hfShape: ReadonlyArray<number>, init: ParameterSpec["init"]) =>
    specs.push({ name, hfShape, transposed: isTransposed(name), init })
  const D = c.hiddenSize
  const qDim = c.numHeads * c.headDim
  const kvDim = c.numKvHeads * c.headDim
  add("model.embed_tokens.weight", [c.vocabSize, D], "normal")
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}`
    add(`${p}.input_layernorm.weight`, [D], "ones")
    add(`${p}.self_attn.q_proj.weight`, [qDim, D], "normal")
    add(`${p}.self_attn.k_proj.weight`, [kvDim, D], "normal")
    add(`${p}.self_attn.v_proj.weight`, [kvDim, D], "normal")
    if (c.attentionBias) {
      add(`${p}.self_attn.q_proj.bias`, [qDim], "zeros")
      add(`${p}.self_attn.k_proj.bias`, [kvDim], "zeros")
      add(`${p}.self_attn.v_proj.bias`, [kvDim], "zeros")
    }
    if (c.qkNorm) {
      add(`${p}.self_attn.q_norm.weight`, [c.headDim], "ones")
      add(`${p}.self_attn.k_norm.weight`, [c.headDim], "ones")
    }
    add(`${p}.self_attn.o_proj.weight`, [D, qDim], "normal")
    add(`${p}.post_attention_layernorm.weight`, [D], "ones")
    add(`${p}.mlp.gate_proj.weight`, [c.intermediateSize, D], "normal")
    add(`${p}.mlp.up_proj.weight`, [c.intermediateSize, D], "normal")
    add(`${p}.mlp.down_proj.weight`, [D, c.intermediateSize], "normal")
  }
  add("model.norm.weight", [D], "ones")
  if (!c.tieWordEmbeddings) add("lm_head.weight", [c.vocabSize, D], "normal")
  return specs
}

/** Transpose a row-major `[rows, cols]` array. */
export const transpose2d = (data: Float32Array, rows: number, cols: number): Float32Array => {
  const out = new Float32Array(data.length)
  for (let r = 0; r < rows; r++) {
    const src = r * cols
    for (let c = 0; c < cols; c++) out[c * rows + r] = data[src + c]!
  }
  return out
}

/**
 * Model ids are unique per process, not per module instance: tfjs' variable registry is global, and two copies of
 * this module (a bundle plus a direct import) must not hand out the same `t<id>/` prefix.
 */
const idCounter = Symbol.for("effect-rl/model/Transformer/nextId")
const nextModelId = (): number => {
  const g = globalThis as unknown as Record<symbol, number | undefined>
  const id = g[idCounter] ?? 0
  g[idCounter] = id + 1
  return id
}

/**
 * Build a model from HF-layout arrays (`get(name)` returns HF shape + data; a missing tied `lm_head` is fine).
 * With `layout: "held"` the data of linear weights is already transposed to `[in, out]` (a loader that transposed
 * while reading), so it is used as it is. Throws when a tensor is missing or has the wrong shape.
 */
export const fromHfArrays = (
  config: TransformerConfig,
  get: (name: string) => HfArray | undefined,
  layout: "hf" | "held" = "hf"
): Transformer => {
  const id = nextModelId()
  const params = new Map<string, tf.Variable>()
  try {
    for (const spec of parameterSpecs(config))
      params.set(spec.name, makeVariable(id, spec, checked(spec, get(spec.name)), layout))
  } catch (e) {
    for (const v of params.values()) v.dispose()
    throw e
  }
  return { config, params, adapters: new Map(), id }
}

/** A tensor as a HF checkpoint names and shapes it. */
export interface HfArray {
  readonly shape: ReadonlyArray<number>
  readonly data: Float32Array
}

const checked = (spec: ParameterSpec, found: HfArray | undefined): Float32Array => {
  if (found === undefined) throw new Error(`missing tensor ${spec.name}`)
  if (found.shape.length !== spec.hfShape.length || found.shape.some((d, i) => d !== spec.hfShape[i])) {
    throw new Error(`tensor ${spec.name} has shape [${found.shape.join(", ")}], expected [${spec.hfShape.join(", ")}]`)
  }
  return found.data
}

/**
 * `fromHfArrays` (layout "held") reading one tensor at a time: each is read, made a variable and handed to `store`
 * (which may keep it more compactly: NativeBackend.storeBf16) before the next is read, so loading never holds the
 * whole model in float32 when the model will not.
 */
export const fromHfArraysStreaming = async (
  config: TransformerConfig,
  read: (spec: ParameterSpec) => Promise<HfArray | undefined>,
  store?: (name: string, variable: tf.Variable) => void
): Promise<Transformer> => {
  const id = nextModelId()
  const params = new Map<string, tf.Variable>()
  try {
    for (const spec of parameterSpecs(config)) {
      const variable = makeVariable(id, spec, checked(spec, await read(spec)), "held")
      params.set(spec.name, variable)
      store?.(spec.name, variable)
    }
  } catch (e) {
    for (const v of params.values()) v.dispose()
    throw e
  }
  return { config, params, adapters: new Map(), id }
}

const makeVariable = (id: number, spec: ParameterSpec, hfData: Float32Array, layout: "hf" | "held"): tf.Variable => {
  const [rows, cols] = spec.hfShape
  const data = spec.transposed && layout === "hf" ? transpose2d(hfData, rows!, cols!) : hfData
  const shape = spec.transposed ? [cols!, rows!] : [...spec.hfShape]
  return tf.tidy(() => tf.variable(tf.tensor(data, shape, "float32"), true, `t${id}/${spec.name}`))
}

/**
 * A fresh random model, as HF initialises one: linear and embedding weights ~ N(0, initializerRange²), norms 1,
 * biases 0. Deterministic in `seed` (our own PRNG, not tfjs').
 */
export const init = (config: TransformerConfig, seed = 0, initializerRange = 0.02): Transformer => {
  const prng = Prng.make(seed)
  const arrays = new Map<string, Float32Array>()
  for (const spec of parameterSpecs(config)) {
    const size = spec.hfShape.reduce((a, b) => a * b, 1)
    const data = new Float32Array(size)
    if (spec.init === "ones") data.fill(1)
    else if (spec.init === "normal") for (let i = 0; i < size; i++) data[i] = prng.normal() * initializerRange
    arrays.set(spec.name, data)
  }
  const shapes = new Map(parameterSpecs(config).map((s) => [s.name, s.hfShape]))
  return fromHfArrays(config, (name) => {
    const data = arrays.get(name)
    return data === undefined ? undefined : { shape: shapes.get(name)!, data }
  })
}

/**
 * All weights in HF layout and names (linear weights transposed back to `[out, in]`). Async (webgpu has no
 * synchronous download); one weight is downloaded at a time, so only one held-layout copy is alive beside the result.
 * The weights must not change until it resolves.
 */
export const toHfArrays = async (
  model: Transformer
): Promise<Array<{ readonly name: string; readonly shape: ReadonlyArray<number>; readonly data: Float32Array }>> => {
  const out: Array<{ readonly name: string; readonly shape: ReadonlyArray<number>; readonly data: Float32Array }> = []
  for (const spec of parameterSpecs(model.config)) {
    const held = (await model.params.get(spec.name)!.data()) as Float32Array
    const data = spec.transposed ? transpose2d(held, spec.hfShape[1]!, spec.hfShape[0]!) : new Float32Array(held)
    out.push({ name: spec.name, shape: spec.hfShape, data })
  }
  return out
}

/** Overwrite one weight from HF-layout data (in place: the variable keeps its identity, so optimizers still hold it). */
export const assignHf = (model: Transformer, name: string, shape: ReadonlyArray<number>, data: Float32Array): void => {
  const variable = model.params.get(name)
  if (variable === undefined) throw new Error(`unknown weight ${name}`)
  const transposed = isTransposed(name)
  const heldShape = transposed ? [shape[1]!, shape[0]!] : [...shape]
  if (heldShape.length !== variable.shape.length || heldShape.some((d, i) => d !== variable.shape[i])) {
    throw new Error(`weight ${name}: shape [${shape.join(", ")}] does not match the model`)
  }
  const held = transposed ? transpose2d(data, shape[0]!, shape[1]!) : data
  tf.tidy(() => variable.assign(tf.tensor(held, heldShape, "float32")))
}

/** The variables an optimizer should update: the adapters when LoRA is attached, else every weight. */
export const trainableVariables = (model: Transformer): Array<tf.Variable> =>
  model.adapters.size > 0 ? [...model.adapters.values()].flatMap((a) => [a.a, a.b]) : [...model.params.values()]

/**
 * A model that reads `model`'s base weights (the same variables, nothing copied) with adapters of its own: several
 * adapters served over one base. Dispose it with `disposeAdapters`, never `dispose` (that would free the base).
 */
export const shareBase = (model: Transformer): Transformer => {
  const shared: Transformer = { config: model.config, params: model.params, adapters: new Map(), id: nextModelId() }
  if (storedFrozen.has(model)) storedFrozen.add(shared)
  return shared
}

/** Free the model's adapters, leaving its base weights alone. */
export const disposeAdapters = (model: Transformer): void => {
  for (const a of model.adapters.values()) {
    a.a.dispose()
    a.b.dispose()
  }
  model.adapters.clear()
}

export const dispose = (model: Transformer): void => {
  for (const v of model.params.values()) v.dispose()
  for (const a of model.adapters.values()) {
    a.a.dispose()
    a.b.dispose()
  }
  model.adapters.clear()
}

/**
 * The weights a model only reads: the base projection weights that carry LoRA adapters (they are never trained), or
 * with `all`, every projection weight (a model loaded for inference only). What can be stored as bfloat16.
 */
export const frozenWeights = (model: Transformer, all = false): Array<tf.Variable> =>
  [...model.params.entries()]
    .filter(([name]) => name.endsWith("_proj.weight") && (all || model.adapters.has(name.slice(0, -".weight".length))))
    .map(([, v]) => v)

const storedFrozen = new WeakSet<Transformer>()

/**
 * Hand each frozen weight (`frozenWeights(model, all)`) to `store`, which may keep it more compactly (the native
 * backend's `storeBf16`), and remember it: inference views of the model then read weights in place (lean) instead of
 * fusing or merging copies, which would undo the compact storage. Returns the bytes `store` reports saved.
 */
export const storeFrozen = (model: Transformer, store: (weight: tf.Variable) => number, all = false): number => {
  let saved = 0
  for (const w of frozenWeights(model, all)) saved += store(w)
  if (saved > 0) storedFrozen.add(model)
  return saved
}

/**
 * Whether `storeFrozen` kept the model's frozen weights compactly (or those of the base it shares): its inference
 * views then read weights in place (WeightView.ts).
 */
export const isFrozenStored = (model: Transformer): boolean => storedFrozen.has(model)
