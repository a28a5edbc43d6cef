/**
 * A decoder-only transformer of the Qwen3 / Qwen2 / Llama family in TensorFlow.js, numerically the HF forward:
 * pre-norm blocks of RMSNorm → grouped-query attention with RoPE (HF `rotate_half` convention) → residual, RMSNorm →
 * SiLU-gated MLP → residual, a final RMSNorm and a tied or untied LM head.
 *
 * Departures from the HF code, on purpose (none changes the maths):
 * 1. Linear weights are held TRANSPOSED, `[in, out]`, so every projection is `x @ W` on a 2-D `x`: the wasm backend
 *    runs only untransposed, unbatched matmuls on XNNPACK (~10× faster). The variables still carry HF names; the
 *    HF `[out, in]` layout is restored on save/snapshot (`toHfArrays`). `lm_head` (untied) is held as `[D, V]`; a tied
 *    head reuses `embed_tokens` `[V, D]`, transposed once per forward (or once per weight version for inference).
 * 2. Linear gradients go through `linear` (a custom gradient) that transposes explicitly on stock kernels, so the
 *    backward matmuls are untransposed too (native matmuls take the transposes as flags instead).
 * 3. Grouped-query attention does not repeat K/V: the `rep = H / Hkv` query heads sharing one KV head are stacked
 *    along the query axis, `[B, Hkv, rep·T, hd]`, and meet their KV head in one batched matmul.
 * 4. RoPE's `rotate_half` is a fixed `[hd, hd]` signed permutation matmul, and the attention scale 1/√hd is folded into
 *    the query's cos/sin tables.
 * 5. Masked scores are −1e9, not −inf, so rows with no visible key (left padding) stay finite.
 * 6. For inference, `inferenceView` fuses q/k/v into one `[D, (H+2Hkv)·hd]` matmul and gate/up into one `[D, 2I]`
 *    (LoRA adapters merged), folds each RMSNorm weight into the rows of the matmul after it and 1/√hd into q, and
 *    norms + rotates q and k as one tensor: 239 kernels per decode step of the perf model instead of ~320.
 * 7. With the native kernels registered (src/native/NativeKernels.ts), RMSNorm, RoPE, attention and SiLU gating run
 *    as fused kernels (Fused.ts, with native gradients), and an inference view runs 7 kernels per layer (~33 per decode
 *    step of the perf model); the KV cache (token-major `[B, C, Hkv, hd]`) then grows in place. Without them the same
 *    maths runs as tfjs compositions (points 3 and 4).
 *
 * Known cost on stock kernels: the two attention matmuls are batched ([B·Hkv] products), which stock wasm runs on its
 * slow loop — about 40% of a train step of the perf model (profiled). `setAttentionMatmul("split")` unstacks them into
 * 2-D matmuls, but wasm's Unpack/Slice make that slower still; the fused native attention is the fix.
 *
 * Legend: B batch, T new tokens, L cached + new tokens (keys), D hidden, H heads, Hkv KV heads, hd head dim, I MLP
 * width, V vocab.
 */
import * as tf from "@tensorflow/tfjs"
import * as Fused from "./Fused.ts"
import type { RopeScaling, TransformerConfig } from "./ModelConfig.ts"
import * as Prng from "./Prng.ts"
import * as Recompute from "./Recompute.ts"

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

// ---------------------------------------------------------------------------------------------------------------
// Forward

/** `x @ W` for 2-D x with untransposed matmuls in both directions (see the module header, point 2). */
export const linear: (x: tf.Tensor2D, w: tf.Tensor2D) => tf.Tensor2D = tf.customGrad(
  // biome-ignore lint/suspicious/noExplicitAny: tfjs' CustomGradientFunc types its inputs as Tensor[] spread
  ((x: tf.Tensor2D, w: tf.Tensor2D, save: any) => {
    save([x, w])
    return {
      value: tf.matMul(x, w), // [N, out]
      gradFunc: (dy: tf.Tensor2D, saved: Array<tf.Tensor2D>) => {
        const [xs, ws] = saved as [tf.Tensor2D, tf.Tensor2D]
        // Native matmuls take the transposes as flags (no copies); stock wasm runs transposed matmuls ~10× slower.
        if (Fused.nativeAvailable()) return [tf.matMul(dy, ws, false, true), tf.matMul(xs, dy, true, false)]
        return [tf.matMul(dy, tf.transpose(ws)), tf.matMul(tf.transpose(xs), dy)] // dx [N, in], dW [in, out]
      }
    }
    // biome-ignore lint/suspicious/noExplicitAny: see above
  }) as any
) as unknown as (x: tf.Tensor2D, w: tf.Tensor2D) => tf.Tensor2D

/**
 * A LoRA projection in one op: `x @ W + s · (xLora @ A) @ B` for a frozen W (xLora is x, or x with the adapter's
 * dropout). Composed from tfjs ops, each keeps its inputs for the backward pass (the sum both of its [N, out]
 * operands, the scaling its [N, out] product): three [N, out] tensors per projection, most of a LoRA step's memory
 * at real sizes. This keeps xLora and s · xLora @ A [N, r]:
 * dx = dy Wᵀ + s (dy Bᵀ) Aᵀ, dA = s xLoraᵀ (dy Bᵀ), dB = (s xLora A)ᵀ dy.
 */
export const loraLinear = (
  x: tf.Tensor2D,
  xLora: tf.Tensor2D,
  w: tf.Tensor2D,
  a: tf.Tensor2D,
  b: tf.Tensor2D,
  scale: number
): tf.Tensor2D => {
  const native = Fused.nativeAvailable()
  const mmT = (p: tf.Tensor2D, q: tf.Tensor2D) =>
    native ? tf.matMul(p, q, false, true) : tf.matMul(p, tf.transpose(q))
  const Tmm = (p: tf.Tensor2D, q: tf.Tensor2D) =>
    native ? tf.matMul(p, q, true, false) : tf.matMul(tf.transpose(p), q)
  const dropped = xLora !== x
  const op = tf.customGrad((...args: Array<tf.Tensor | tf.GradSaveFunc>) => {
    const [xIn, xlIn, aIn, bIn] = (dropped ? args.slice(0, 4) : [args[0], ...args.slice(0, 3)]) as Array<tf.Tensor2D>
    const save = args[args.length - 1] as tf.GradSaveFunc
    const xas = tf.mul(tf.matMul(xlIn!, aIn!), scale) as tf.Tensor2D // s · xLora A [N, r]
    save([xlIn!, xas, aIn!, bIn!])
    return {
      value: tf.add(tf.matMul(xIn!, w), tf.matMul(xas, bIn!)), // [N, out]
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) => {
        const [xl, xa, aS, bS] = saved as [tf.Tensor2D, tf.Tensor2D, tf.Tensor2D, tf.Tensor2D]
        const g = dy as tf.Tensor2D
        const gb = tf.mul(mmT(g, bS), scale) as tf.Tensor2D // s · dy Bᵀ [N, r]
        const dA = Tmm(xl, gb) // [in, r]
        const dB = Tmm(xa, g) // [r, out]
        const dxBase = mmT(g, w) // [N, in]
        const dxLora = mmT(gb, aS) // [N, in]
        return dropped ? [dxBase, dxLora, dA, dB] : [tf.add(dxBase, dxLora), dA, dB]
      }
    }
  }) as unknown as (...inputs: Array<tf.Tensor>) => tf.Tensor2D
  return dropped ? op(x, xLora, a, b) : op(x, a, b)
}

/**
 * `a + b` keeping nothing for the backward pass (tfjs' Add keeps both operands, for broadcasting, which a residual
 * sum of equal shapes does not need): the residual stream's adds.
 */
export const residualAdd = (a: tf.Tensor2D, b: tf.Tensor2D): tf.Tensor2D =>
  (
    tf.customGrad((...args: Array<tf.Tensor | tf.GradSaveFunc>) => {
      ;(args[2] as tf.GradSaveFunc)([])
      return {
        value: tf.add(args[0] as tf.Tensor, args[1] as tf.Tensor),
        gradFunc: (dy: tf.Tensor) => [dy, tf.clone(dy)] // two tensors: each input's gradient is its own
      }
    }) as unknown as (a: tf.Tensor, b: tf.Tensor) => tf.Tensor2D
  )(a, b)

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
 * How the stock (tfjs-composed) attention runs its batched matmuls: `"batched"` (default) or `"split"` into 2-D
 * matmuls. See `Fused.setAttentionMatmul`.
 */
export const setAttentionMatmul = Fused.setAttentionMatmul

/** One projection: `x @ W (+ b) (+ dropout(x) @ A @ B · scale)`. */
interface Projection {
  readonly w: tf.Tensor2D // [in, out]
  readonly b?: tf.Tensor1D // [out]
  /** An `Adapter`'s weights: the variables, or (in an activation recompute) the tensors standing in for them. */
  readonly adapter?: {
    readonly a: tf.Tensor // Aᵀ [in, r]
    readonly b: tf.Tensor // Bᵀ [r, out]
    readonly scale: number
    readonly dropout: number
  }
}

interface LayerView {
  /** undefined in inference views: the norm weights are folded into the rows of the next projection's weight. */
  readonly inputNorm: tf.Tensor1D | undefined // [D]
  readonly postNorm: tf.Tensor1D | undefined // [D]
  readonly qNorm?: tf.Tensor1D // [hd]
  readonly kNorm?: tf.Tensor1D // [hd]
  /**
   * Inference views: 1/√hd is folded into q (its projection columns, or `qkNorm`), so q and k are normed (`qkNorm`,
   * q_norm·(1/√hd) stacked H times over k_norm stacked Hkv times) and rotated together as one [N, H + Hkv, hd] tensor.
   */
  readonly jointQk?: { readonly qkNorm?: tf.Tensor2D } // [H + Hkv, hd]
  /** [q, k, v] separately (training), or one fused q|k|v projection (inference). */
  readonly qkv: ReadonlyArray<Projection>
  readonly o: Projection
  /** [gate, up] separately, or one fused gate|up projection. */
  readonly gateUp: ReadonlyArray<Projection>
  readonly down: Projection
}

/** The weights one forward reads. `owned` tensors belong to the view (fused copies) and die with it. */
export interface WeightView {
  readonly layers: ReadonlyArray<LayerView>
  readonly embed: tf.Tensor2D // [V, D]
  readonly finalNorm: tf.Tensor1D | undefined // [D]; undefined = folded into the head's rows
  readonly head: tf.Tensor2D | undefined // [D, V]; undefined = tied, transpose embed per forward
  readonly owned: ReadonlyArray<tf.Tensor>
  /** false for inference views: plain matmuls, skipping the custom-gradient wrapper's per-op overhead. */
  readonly differentiable: boolean
}

const param = (model: Transformer, name: string): tf.Variable => {
  const v = model.params.get(name)
  if (v === undefined) throw new Error(`model has no weight ${name}`)
  return v
}

const projection = (model: Transformer, module: string, withBias: boolean): Projection => {
  const adapter = model.adapters.get(module)
  return {
    w: param(model, `${module}.weight`) as tf.Tensor2D,
    ...(withBias ? { b: param(model, `${module}.bias`) as tf.Tensor1D } : {}),
    ...(adapter !== undefined ? { adapter } : {})
  }
}

/** The live variables, unfused: what training differentiates through. Owns nothing. */
export const trainingView = (model: Transformer): WeightView => {
  const c = model.config
  const layers: Array<LayerView> = []
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}`
    layers.push({
      inputNorm: param(model, `${p}.input_layernorm.weight`) as tf.Tensor1D,
      postNorm: param(model, `${p}.post_attention_layernorm.weight`) as tf.Tensor1D,
      ...(c.qkNorm
        ? {
            qNorm: param(model, `${p}.self_attn.q_norm.weight`) as tf.Tensor1D,
            kNorm: param(model, `${p}.self_attn.k_norm.weight`) as tf.Tensor1D
          }
        : {}),
      qkv: ["q_proj", "k_proj", "v_proj"].map((m) => projection(model, `${p}.self_attn.${m}`, c.attentionBias)),
      o: projection(model, `${p}.self_attn.o_proj`, false),
      gateUp: ["gate_proj", "up_proj"].map((m) => projection(model, `${p}.mlp.${m}`, false)),
      down: projection(model, `${p}.mlp.down_proj`, false)
    })
  }
  return {
    layers,
    embed: param(model, "model.embed_tokens.weight") as tf.Tensor2D,
    finalNorm: param(model, "model.norm.weight") as tf.Tensor1D,
    head: c.tieWordEmbeddings ? undefined : (param(model, "lm_head.weight") as tf.Tensor2D),
    owned: [],
    differentiable: true
  }
}

/** The effective `[in, out]` weight of a projection with its adapter folded in. */
const merged = (p: Projection): tf.Tensor2D =>
  p.adapter === undefined ? p.w : tf.add(p.w, tf.mul(tf.matMul(p.adapter.a, p.adapter.b), p.adapter.scale))

export interface InferenceViewOptions {
  /**
   * Read the live weights in place instead of fusing copies (q|k|v, gate|up, the head with the final norm folded in),
   * which cost about 75% of the weights again. Default: lean above `leanAboveBytes` of weights, where the copies
   * would matter (Qwen3-1.7B and larger), and when frozen weights are stored compactly (`storeFrozen`); fused
   * otherwise, where a decode step's kernel count matters more.
   */
  readonly lean?: boolean
}

/** Weights (float32 bytes) above which inference views are lean by default: 4 GiB, about 1B parameters. */
export const leanAboveBytes = 4 * 2 ** 30

const leanByDefault = (model: Transformer): boolean => {
  if (storedFrozen.has(model)) return true
  let bytes = 0
  for (const v of model.params.values()) bytes += v.size * 4
  return bytes > leanAboveBytes
}

/**
 * A snapshot of the current weights fused for fast inference (q|k|v and gate|up concatenated, adapters merged, tied
 * head transposed). Copies: rebuild it after the variables change, and `disposeView` it.
 */
export const inferenceView = (model: Transformer, options: InferenceViewOptions = {}): WeightView => {
  const base = trainingView(model)
  if (options.lean ?? leanByDefault(model)) {
    // the live weights, read in place: no copies (and no fusing); adapters run unmerged
    return { ...base, differentiable: false }
  }
  const owned: Array<tf.Tensor> = []
  const own = <T extends tf.Tensor>(compute: () => T): T => {
    const t = tf.tidy(compute)
    owned.push(t)
    return t
  }
  const c = model.config
  const scale = 1 / Math.sqrt(c.headDim)
  const qCols = c.numHeads * c.headDim
  const kvCols = 2 * c.numKvHeads * c.headDim
  // without q/k norm, 1/√hd scales q's projection columns (and bias); with it, q_norm's weight
  const colScale = c.qkNorm
    ? undefined
    : Float32Array.from({ length: qCols + kvCols }, (_, i) => (i < qCols ? scale : 1))
  const rowsTimes = (w: tf.Tensor2D, g: tf.Tensor1D | undefined): tf.Tensor2D =>
    g === undefined ? w : (tf.mul(w, tf.reshape(g, [-1, 1])) as tf.Tensor2D) // diag(g) W: x̂·g @ W = x̂ @ diag(g) W
  const layers = base.layers.map((layer): LayerView => {
    const qkvW = own(() => {
      const w = rowsTimes(tf.concat(layer.qkv.map(merged), 1) as tf.Tensor2D, layer.inputNorm) // [D, (H + 2Hkv)·hd]
      return colScale === undefined ? w : (tf.mul(w, colScale) as tf.Tensor2D)
    })
    const qkvB =
      layer.qkv[0]!.b === undefined
        ? undefined
        : own(() => {
            const b = tf.concat(
              layer.qkv.map((p) => p.b!),
              0
            ) as tf.Tensor1D // [(H + 2Hkv)·hd]
            return colScale === undefined ? b : (tf.mul(b, colScale) as tf.Tensor1D)
          })
    const qkNorm =
      layer.qNorm === undefined
        ? undefined
        : own(
            () =>
              tf.concat([
                tf.tile(tf.reshape(tf.mul(layer.qNorm!, scale), [1, -1]), [c.numHeads, 1]),
                tf.tile(tf.reshape(layer.kNorm!, [1, -1]), [c.numKvHeads, 1])
              ]) as tf.Tensor2D
          ) // [H + Hkv, hd]
    return {
      inputNorm: undefined,
      postNorm: undefined,
      jointQk: qkNorm === undefined ? {} : { qkNorm },
      qkv: [{ w: qkvW, ...(qkvB !== undefined ? { b: qkvB } : {}) }],
      o: { w: layer.o.adapter === undefined ? layer.o.w : own(() => merged(layer.o)) },
      gateUp: [{ w: own(() => rowsTimes(tf.concat(layer.gateUp.map(merged), 1) as tf.Tensor2D, layer.postNorm)) }], // [D, 2I]
      down: { w: layer.down.adapter === undefined ? layer.down.w : own(() => merged(layer.down)) }
    }
  })
  const head = own(() => rowsTimes(base.head ?? (tf.transpose(base.embed) as tf.Tensor2D), base.finalNorm)) // [D, V]
  return { layers, embed: base.embed, finalNorm: undefined, head, owned, differentiable: false }
}

export const disposeView = (view: WeightView): void => {
  for (const t of view.owned) t.dispose()
}

type MatMul2D = (x: tf.Tensor2D, w: tf.Tensor2D) => tf.Tensor2D
const plainMatMul: MatMul2D = (x, w) => tf.matMul(x, w)

/**
 * `dropoutSeed` (training only) seeds the adapter's dropout mask, so an activation recompute draws the same mask;
 * undefined = no dropout (inference).
 */
const project = (
  x: tf.Tensor2D,
  p: Projection,
  dropoutSeed: string | undefined,
  mm: MatMul2D = linear
): tf.Tensor2D => {
  const adapter = p.adapter
  const withBias = (y: tf.Tensor2D) => (p.b === undefined ? y : (tf.add(y, p.b) as tf.Tensor2D)) // [N, out]
  if (adapter === undefined) return withBias(mm(x, p.w))
  const xLora =
    dropoutSeed !== undefined && adapter.dropout > 0
      ? (tf.dropout(x, adapter.dropout, undefined, dropoutSeed) as tf.Tensor2D)
      : x // [N, in]
  const [a, b] = [adapter.a as tf.Tensor2D, adapter.b as tf.Tensor2D]
  // a differentiable forward: one op, the frozen base taking no gradient
  if (mm === linear) return withBias(loraLinear(x, xLora, p.w, a, b, adapter.scale))
  return tf.add(withBias(mm(x, p.w)), tf.mul(mm(mm(xLora, a), b), adapter.scale)) as tf.Tensor2D
}

/** Apply each projection and split a fused one into `sizes`. Projection i's dropout seed is `<dropoutSeed>/<i>`. */
const projectAll = (
  x: tf.Tensor2D,
  ps: ReadonlyArray<Projection>,
  sizes: Array<number>,
  dropoutSeed: string | undefined,
  mm: MatMul2D
) => {
  const seed = (i: number) => (dropoutSeed === undefined ? undefined : `${dropoutSeed}/${i}`)
  return ps.length === 1
    ? tf.split(project(x, ps[0]!, seed(0), mm), sizes, 1)
    : ps.map((p, i) => project(x, p, seed(i), mm))
}

/**
 * RoPE's hd/2 inverse frequencies `θ^(−2i/hd)`, rescaled by Llama 3's `scaling` when given, in float32 as HF computes
 * them (`_compute_default_rope_parameters`, `_compute_llama3_parameters`). Each llama3 step is rounded to float32 as
 * torch's float32 ops round it (bit-identical to HF's code given the same base frequencies); the base is the float64
 * power rounded once, which can be 1 ulp from torch's float32 `pow`.
 */
export const ropeInvFreq = (headDim: number, theta: number, scaling?: RopeScaling): Float32Array => {
  const invFreq = Float32Array.from({ length: headDim / 2 }, (_, i) => 1 / theta ** ((2 * i) / headDim))
  if (scaling === undefined) return invFreq
  const f = Math.fround
  const { factor, lowFreqFactor: low, highFreqFactor: high, originalMaxPositionEmbeddings: oldCtx } = scaling
  const lowFreqWavelen = f(oldCtx / low) // wavelengths above this are scaled down by `factor`
  const highFreqWavelen = f(oldCtx / high) // wavelengths below this are kept
  return invFreq.map((inv) => {
    const wavelen = f(f(1 / inv) * f(2 * Math.PI)) // torch's `2π / t` is `t.reciprocal() * 2π`
    const llama = wavelen > lowFreqWavelen ? f(inv / f(factor)) : inv
    const medium = !(wavelen < highFreqWavelen) && !(wavelen > lowFreqWavelen)
    if (!medium) return llama
    const smooth = f(f(f(f(1 / wavelen) * f(oldCtx)) - f(low)) / f(high - low)) // 0 at lowFreqWavelen, 1 at high
    return f(f(f(f(1 - smooth) * llama) / f(factor)) + f(smooth * llama)) // (1 − s)·inv/factor + s·inv
  })
}

/**
 * RoPE tables for explicit positions: cos/sin of `pos · invFreq[i]` (`ropeInvFreq`), duplicated over both halves as
 * in HF.
 */
export const ropeTables = (
  positions: ArrayLike<number>,
  headDim: number,
  theta: number,
  scaling?: RopeScaling
): { readonly cos: Float32Array; readonly sin: Float32Array } => {
  const half = headDim / 2
  const cos = new Float32Array(positions.length * headDim)
  const sin = new Float32Array(positions.length * headDim)
  // HF computes inv_freq in float32; so do we, then the angle in float64.
  const invFreq = ropeInvFreq(headDim, theta, scaling)
  for (let n = 0; n < positions.length; n++) {
    const pos = positions[n]!
    for (let i = 0; i < half; i++) {
      const angle = pos * invFreq[i]!
      const c = Math.cos(angle)
      const s = Math.sin(angle)
      cos[n * headDim + i] = c
      cos[n * headDim + i + half] = c
      sin[n * headDim + i] = s
      sin[n * headDim + i + half] = s
    }
  }
  return { cos, sin }
}

/**
 * Per-layer cached keys and values, token-major `[B, C, Hkv, hd]`: the first L slots (the cache's length, kept beside
 * it) are tokens; the fused inference path keeps spare slots (C > L) and appends into them in place.
 */
export interface LayerCache {
  readonly keys: tf.Tensor4D // [B, C, Hkv, hd]
  readonly values: tf.Tensor4D // [B, C, Hkv, hd]
}

export interface StepInput {
  readonly ids: tf.Tensor2D // [B, T] int32
  /** Row-major [B, T]: the RoPE position of each new token. */
  readonly positions: ArrayLike<number>
  /** Row-major [B, L]: 1 where a key (cached or new) is a real token, 0 for padding. The new tokens are the last T. */
  readonly keyMask: ArrayLike<number>
  readonly past?: ReadonlyArray<LayerCache>
  /** Slots of `past` that hold tokens (default: all of them). The caller owns `past` and drops it after the step. */
  readonly pastLength?: number
  readonly training?: boolean // enables LoRA dropout
  /** Seeds LoRA dropout when training (default: a fresh seed per step); each adapter's mask is drawn from it. */
  readonly dropoutSeed?: string
  /**
   * Activation recompute (`trainer.gradient_checkpointing`): each decoder layer runs as one recomputed block
   * (Recompute.ts), so the tape keeps only each layer's input [B·T, D] and the backward pass runs each layer's forward
   * again. Differentiable views without `past` only; gradients then reach the trainable variables (and the inputs),
   * not frozen ones, and no cache is returned.
   */
  readonly checkpoint?: boolean
}

export interface StepOutput {
  readonly hidden: tf.Tensor2D // [B·T, D], after the final norm (without its weight for inference views: see logitsOf)
  /** keys/values including the new tokens (L = P + T of their slots); empty with `checkpoint` */
  readonly cache: ReadonlyArray<LayerCache>
}

/** Whether the fused inference path applies: an inference view whose layers are all fused (q|k|v, gate|up). */
const fusedInference = (view: WeightView): boolean =>
  !view.differentiable &&
  view.layers.every(
    (layer) =>
      layer.jointQk !== undefined &&
      layer.inputNorm === undefined &&
      layer.postNorm === undefined &&
      layer.qkv.length === 1 &&
      layer.qkv[0]!.adapter === undefined &&
      layer.gateUp.length === 1 &&
      layer.gateUp[0]!.b === undefined &&
      layer.gateUp[0]!.adapter === undefined &&
      layer.o.b === undefined &&
      layer.o.adapter === undefined &&
      layer.down.b === undefined &&
      layer.down.adapter === undefined
  )

/**
 * Run the decoder over T new tokens per row, attending to `past` (if any) and causally to each other. Pure tensor
 * code: call inside `tf.tidy` (the caller keeps what it returns). Query t of a row sits at key slot L − T + t and sees
 * key j when j ≤ L − T + t and keyMask[j] = 1.
 *
 * With the native fused kernels (see Fused.ts) an inference view runs 7 kernels per layer (norm+q|k|v matmul, q/k
 * norm + RoPE + cache append, attention, o matmul + residual, norm+gate|up matmul, SiLU gating, down matmul +
 * residual); training runs fused RMSNorm, RoPE, attention and SiLU gating with native gradients. Without them, the
 * same maths runs as tfjs compositions.
 */
export const step = (model: Transformer, view: WeightView, input: StepInput): StepOutput => {
  const c = model.config
  const [B, T] = input.ids.shape
  const H = c.numHeads
  const Hkv = c.numKvHeads
  const hd = c.headDim
  const P =
    input.past === undefined || input.past.length === 0 ? 0 : (input.pastLength ?? input.past[0]!.values.shape[1])
  const L = P + T
  const training = input.training === true
  const mm = view.differentiable ? linear : plainMatMul
  const eps = c.rmsNormEps
  if (input.keyMask.length !== B * L) throw new Error(`keyMask has ${input.keyMask.length} entries, expected ${B}×${L}`)

  // Additive attention bias [B, T, L]: 0 where visible, −1e9 where not.
  const bias = new Float32Array(B * T * L)
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      const row = (b * T + t) * L
      const last = P + t
      for (let j = 0; j < L; j++) bias[row + j] = j <= last && input.keyMask[b * L + j]! > 0 ? 0 : -1e9
    }
  }
  const maskBias = tf.tensor(bias, [B, T, L]) // [B, T, L]
  const { cos, sin } = ropeTables(input.positions, hd, c.ropeTheta, c.ropeScaling)
  const cosK = tf.tensor(cos, [B * T, 1, hd]) // [B·T, 1, hd]
  const sinK = tf.tensor(sin, [B * T, 1, hd]) // [B·T, 1, hd]
  const native = Fused.nativeAvailable()
  let x = tf.gather(view.embed, tf.reshape(input.ids, [B * T])) as tf.Tensor2D // [B·T, D]
  const cache: Array<LayerCache> = []

  if (native && fusedInference(view)) {
    const dims = { batch: B, heads: H, kvHeads: Hkv, headDim: hd }
    view.layers.forEach((layer, l) => {
      const qkvP = layer.qkv[0]!
      let qkv = Fused.linear(x, qkvP.w, { normEps: eps }) // [B·T, (H + 2Hkv)·hd]
      if (qkvP.b !== undefined) qkv = tf.add(qkv, qkvP.b)
      const past = input.past?.[l]
      const { q, keys, values } = Fused.qkvPrep(
        qkv,
        cosK,
        sinK,
        layer.jointQk!.qkNorm,
        past === undefined ? undefined : { ...past, length: P },
        dims,
        eps,
        true // room for the next tokens: appends in place
      )
      cache.push({ keys, values })
      const attended = Fused.attention(q, keys, values, maskBias, 1, L) // [B·T, H·hd]; 1/√hd is in the weights
      x = Fused.linear(attended, layer.o.w, { residual: x }) // [B·T, D]
      const gateUp = Fused.linear(x, layer.gateUp[0]!.w, { normEps: eps }) // [B·T, 2I]
      x = Fused.linear(Fused.swigluJoined(gateUp), layer.down.w, { residual: x }) // [B·T, D]
    })
    return { hidden: Fused.rmsNorm(x, view.finalNorm, eps) as tf.Tensor2D, cache }
  }

  const scale = 1 / Math.sqrt(hd)
  const joint = view.layers[0]?.jointQk !== undefined
  // Stock: 1/√hd folded into the query's RoPE tables (unless in the weights). Native: the attention kernel scales.
  const tables: Tables = {
    maskBias,
    cosQ: joint || native ? cosK : tf.mul(cosK, scale),
    sinQ: joint || native ? sinK : tf.mul(sinK, scale),
    cosK,
    sinK,
    ...(native ? {} : { rotate: tf.tensor2d(Fused.rotateHalfMatrix(hd), [hd, hd]) })
  }
  const ctx: LayerContext = { config: c, B, T, P, mm, attentionScale: native && !joint ? scale : 1, tables }
  const checkpoint = input.checkpoint === true && view.differentiable
  if (checkpoint && P > 0) throw new Error("Transformer.step: checkpoint is for full-sequence forwards (no past)")
  const dropoutSeed = training ? (input.dropoutSeed ?? `${Math.random()}`) : undefined
  view.layers.forEach((layer, l) => {
    const seed = dropoutSeed === undefined ? undefined : `${dropoutSeed}/${l}`
    if (checkpoint) {
      x = checkpointedLayer(layer, x, ctx, seed) // [B·T, D]
      return
    }
    // a layer's temporaries go with it (the tape keeps what the backward pass reads): a prefill holds one layer's
    // activations at a time, not all of them
    const out = tf.tidy(() => decoderLayer(layer, x, input.past?.[l], ctx, seed))
    cache.push({ keys: out.keys, values: out.values })
    x = out.x // [B·T, D]
  })
  const hidden = Fused.rmsNorm(x, view.finalNorm, eps) as tf.Tensor2D // [B·T, D]
  return { hidden, cache }
}

/** The tensors every layer of an unfused forward reads besides its weights. None needs a gradient. */
interface Tables {
  readonly maskBias: tf.Tensor // [B, T, L] additive attention bias
  readonly cosQ: tf.Tensor // [B·T, 1, hd] (stock: · 1/√hd)
  readonly sinQ: tf.Tensor // [B·T, 1, hd] (stock: · 1/√hd)
  readonly cosK: tf.Tensor // [B·T, 1, hd]
  readonly sinK: tf.Tensor // [B·T, 1, hd]
  readonly rotate?: tf.Tensor2D // [hd, hd] rotate_half as a matrix (stock); undefined: the fused RoPE
}

interface LayerContext {
  readonly config: TransformerConfig
  readonly B: number
  readonly T: number
  readonly P: number // cached tokens
  readonly mm: MatMul2D
  readonly attentionScale: number
  readonly tables: Tables
}

/**
 * One decoder layer of the unfused path: x [B·T, D] → x [B·T, D], and its keys/values [B, L, Hkv, hd] with the new
 * tokens. `dropoutSeed` (training only) seeds the adapters' dropout masks, per projection.
 */
const decoderLayer = (
  layer: LayerView,
  x: tf.Tensor2D,
  past: LayerCache | undefined,
  ctx: LayerContext,
  dropoutSeed: string | undefined
): { readonly x: tf.Tensor2D; readonly keys: tf.Tensor4D; readonly values: tf.Tensor4D } => {
  const { B, T, P, mm, tables } = ctx
  const { numHeads: H, numKvHeads: Hkv, headDim: hd, intermediateSize: I, rmsNormEps: eps } = ctx.config
  const seed = (part: string) => (dropoutSeed === undefined ? undefined : `${dropoutSeed}/${part}`)
  const rotate = tables.rotate
  const rope = (x: tf.Tensor, heads: number, cosT: tf.Tensor, sinT: tf.Tensor): tf.Tensor => {
    if (rotate === undefined) return Fused.rope(x, cosT, sinT)
    const rotated = mm(tf.reshape(x, [B * T * heads, hd]) as tf.Tensor2D, rotate) // rotate_half(x) [B·T·heads, hd]
    return tf.add(tf.mul(x, cosT), tf.mul(tf.reshape(rotated, [B * T, heads, hd]), sinT)) // [B·T, heads, hd]
  }
  // --- attention
  const h = Fused.rmsNorm(x, layer.inputNorm, eps) as tf.Tensor2D // [B·T, D]
  let q: tf.Tensor
  let k: tf.Tensor
  let v2: tf.Tensor2D
  if (layer.jointQk !== undefined) {
    const [qk2, v] = projectAll(h, layer.qkv, [(H + Hkv) * hd, Hkv * hd], seed("qkv"), mm) // [B·T, (H + Hkv)·hd], [B·T, Hkv·hd]
    let qk: tf.Tensor = tf.reshape(qk2!, [B * T, H + Hkv, hd]) // [B·T, H + Hkv, hd]
    if (layer.jointQk.qkNorm !== undefined)
      qk = Fused.rmsNorm(qk, layer.jointQk.qkNorm, eps) // [B·T, H + Hkv, hd]
    ;[q, k] = tf.split(rope(qk, H + Hkv, tables.cosK, tables.sinK), [H, Hkv], 1) as [tf.Tensor, tf.Tensor] // [B·T, H, hd], [B·T, Hkv, hd]
    v2 = v! as tf.Tensor2D
  } else {
    const [q2, k2, v] = projectAll(h, layer.qkv, [H * hd, Hkv * hd, Hkv * hd], seed("qkv"), mm) // [B·T, H·hd], [B·T, Hkv·hd] ×2
    q = tf.reshape(q2!, [B * T, H, hd]) // [B·T, H, hd]
    k = tf.reshape(k2!, [B * T, Hkv, hd]) // [B·T, Hkv, hd]
    if (layer.qNorm !== undefined) {
      q = Fused.rmsNorm(q, layer.qNorm, eps) // [B·T, H, hd]
      k = Fused.rmsNorm(k, layer.kNorm!, eps) // [B·T, Hkv, hd]
    }
    q = rope(q, H, tables.cosQ, tables.sinQ) // [B·T, H, hd] (stock: scaled by 1/√hd)
    k = rope(k, Hkv, tables.cosK, tables.sinK) // [B·T, Hkv, hd]
    v2 = v! as tf.Tensor2D
  }
  const kNew = tf.reshape(k, [B, T, Hkv, hd]) as tf.Tensor4D // [B, T, Hkv, hd]
  const vNew = tf.reshape(v2, [B, T, Hkv, hd]) as tf.Tensor4D // [B, T, Hkv, hd]
  const keys = past === undefined ? kNew : (tf.concat([Fused.validSlots(past.keys, P), kNew], 1) as tf.Tensor4D) // [B, L, Hkv, hd]
  const values = past === undefined ? vNew : (tf.concat([Fused.validSlots(past.values, P), vNew], 1) as tf.Tensor4D) // [B, L, Hkv, hd]
  const attended = Fused.attention(q, keys, values, tables.maskBias, ctx.attentionScale) // [B·T, H·hd]
  let out = residualAdd(x, project(attended, layer.o, seed("o"), mm)) // [B·T, D]
  // --- MLP: down(silu(gate) · up)
  const h2 = Fused.rmsNorm(out, layer.postNorm, eps) as tf.Tensor2D // [B·T, D]
  const [gate, up] = projectAll(h2, layer.gateUp, [I, I], seed("gateUp"), mm) // [B·T, I] ×2
  const act = Fused.swiglu(gate!, up!) as tf.Tensor2D // [B·T, I]
  out = residualAdd(out, project(act, layer.down, seed("down"), mm)) // [B·T, D]
  return { x: out, keys, values }
}

/** The layer with every tensor it reads replaced by `f(tensor)`, in a fixed order (norms, q|k|v, o, gate|up, down). */
const mapLayer = (layer: LayerView, f: (t: tf.Tensor) => tf.Tensor): LayerView => {
  const proj = (p: Projection): Projection => ({
    w: f(p.w) as tf.Tensor2D,
    ...(p.b !== undefined ? { b: f(p.b) as tf.Tensor1D } : {}),
    ...(p.adapter !== undefined ? { adapter: { ...p.adapter, a: f(p.adapter.a), b: f(p.adapter.b) } } : {})
  })
  return {
    inputNorm: layer.inputNorm === undefined ? undefined : (f(layer.inputNorm) as tf.Tensor1D),
    postNorm: layer.postNorm === undefined ? undefined : (f(layer.postNorm) as tf.Tensor1D),
    ...(layer.qNorm !== undefined ? { qNorm: f(layer.qNorm) as tf.Tensor1D } : {}),
    ...(layer.kNorm !== undefined ? { kNorm: f(layer.kNorm) as tf.Tensor1D } : {}),
    ...(layer.jointQk !== undefined
      ? {
          jointQk: layer.jointQk.qkNorm === undefined ? {} : { qkNorm: f(layer.jointQk.qkNorm) as tf.Tensor2D }
        }
      : {}),
    qkv: layer.qkv.map(proj),
    o: proj(layer.o),
    gateUp: layer.gateUp.map(proj),
    down: proj(layer.down)
  }
}

const isTrainable = (t: tf.Tensor): boolean => t instanceof tf.Variable && t.trainable

/**
 * `decoderLayer` as one recomputed block (Recompute.ts): the tape keeps its input x and references to the tensors it
 * reads, nothing it computes. Gradients flow to x and to the layer's trainable variables, which stand in as the
 * block's inputs; its other tensors (the frozen base under LoRA) and the tables are constants. The recompute draws
 * the same dropout masks (same seed).
 */
const checkpointedLayer = (
  layer: LayerView,
  x: tf.Tensor2D,
  ctx: LayerContext,
  dropoutSeed: string | undefined
): tf.Tensor2D => {
  const weights: Array<tf.Tensor> = []
  mapLayer(layer, (t) => {
    if (!weights.includes(t)) weights.push(t)
    return t
  })
  const trainable = weights.filter(isTrainable)
  const frozen = weights.filter((t) => !isTrainable(t))
  const { maskBias, cosQ, sinQ, cosK, sinK, rotate } = ctx.tables
  const tableList = [maskBias, cosQ, sinQ, cosK, sinK, ...(rotate === undefined ? [] : [rotate])]
  return Recompute.checkpointed(
    ([xIn, ...ws], constants) => {
      const standIns = new Map<tf.Tensor, tf.Tensor>([
        ...trainable.map((t, i) => [t, ws[i]!] as const),
        ...frozen.map((t, i) => [t, constants[i]!] as const)
      ])
      const [mb, cq, sq, ck, sk, rot] = constants.slice(frozen.length)
      const tables: Tables = {
        maskBias: mb!,
        cosQ: cq!,
        sinQ: sq!,
        cosK: ck!,
        sinK: sk!,
        ...(rot === undefined ? {} : { rotate: rot as tf.Tensor2D })
      }
      const view = mapLayer(layer, (t) => standIns.get(t) ?? t)
      return decoderLayer(view, xIn as tf.Tensor2D, undefined, { ...ctx, tables }, dropoutSeed).x // [B·T, D]
    },
    [x, ...trainable],
    [...frozen, ...tableList]
  )
}

/** LM head: `hidden @ Wᵀ_head` → logits [N, V]. */
export const logitsOf = (view: WeightView, hidden: tf.Tensor2D): tf.Tensor2D => {
  if (view.head === undefined && !view.differentiable && Fused.nativeAvailable()) {
    return tf.matMul(hidden, view.embed, false, true) // a tied head read in place: native matmuls take the flag
  }
  return (view.differentiable ? linear : plainMatMul)(hidden, view.head ?? (tf.transpose(view.embed) as tf.Tensor2D)) // [N, V]
}

/** Default RoPE positions for a (left-)padded batch: the count of real tokens before each slot (0 for padding). */
export const positionsFromMask = (mask: ArrayLike<number>, batch: number, length: number): Int32Array => {
  const positions = new Int32Array(batch * length)
  for (let b = 0; b < batch; b++) {
    let seen = 0
    for (let t = 0; t < length; t++) {
      const real = mask[b * length + t]! > 0
      positions[b * length + t] = real ? seen : 0
      if (real) seen++
    }
  }
  return positions
}

export interface ForwardInput {
  readonly ids: tf.Tensor2D | ReadonlyArray<ReadonlyArray<number>> // [B, T]
  /** [B, T], 1 = real token, 0 = padding (left or right). Default: all real. */
  readonly attentionMask?: tf.Tensor2D | ReadonlyArray<ReadonlyArray<number>>
  /** [B, T] RoPE positions. Default: `positionsFromMask`. */
  readonly positions?: tf.Tensor2D | ReadonlyArray<ReadonlyArray<number>>
  readonly training?: boolean // enables LoRA dropout
  readonly dropoutSeed?: string // see StepInput
  readonly checkpoint?: boolean // activation recompute per layer: see StepInput
}

const flat = (x: tf.Tensor2D | ReadonlyArray<ReadonlyArray<number>>): ArrayLike<number> =>
  x instanceof tf.Tensor ? x.dataSync() : x.flat()

/** A forward input as a step's input: ids tensor [B, T], key mask and positions as flat arrays. Call inside tidy. */
export const prepare = (input: ForwardInput): StepInput => {
  const ids =
    input.ids instanceof tf.Tensor
      ? tf.cast(input.ids, "int32")
      : tf.tensor2d(
          input.ids.map((r) => [...r]),
          undefined,
          "int32"
        )
  const [B, T] = ids.shape
  const keyMask = input.attentionMask === undefined ? new Float32Array(B * T).fill(1) : flat(input.attentionMask)
  const positions = input.positions === undefined ? positionsFromMask(keyMask, B, T) : flat(input.positions)
  return {
    ids,
    keyMask,
    positions,
    ...(input.training !== undefined ? { training: input.training } : {}),
    ...(input.dropoutSeed !== undefined ? { dropoutSeed: input.dropoutSeed } : {}),
    ...(input.checkpoint !== undefined ? { checkpoint: input.checkpoint } : {})
  }
}

/** Full-sequence forward (no cache): hidden states [B·T, D] after the final norm, on the live variables. */
export const hiddenStates = (model: Transformer, input: ForwardInput, view?: WeightView): tf.Tensor2D =>
  tf.tidy(() => step(model, view ?? trainingView(model), prepare(input)).hidden)

/** Full-sequence forward: logits [B, T, V]. Materialises every position's logits; `LogProbs` avoids that. */
export const forward = (model: Transformer, input: ForwardInput, view?: WeightView): tf.Tensor3D =>
  tf.tidy(() => {
    const w = view ?? trainingView(model)
    const hidden = hiddenStates(model, input, w) // [B·T, D]
    const [B, T] = input.ids instanceof tf.Tensor ? input.ids.shape : [input.ids.length, input.ids[0]?.length ?? 0]
    return tf.reshape(logitsOf(w, hidden), [B, T, model.config.vocabSize]) as tf.Tensor3D // [B, T, V]
  })
