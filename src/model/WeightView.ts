/**
 * The weights one forward reads (Decoder.ts), gathered from a model (Transformer.ts): the training view, the live
 * variables unfused (what training differentiates through), or an inference view, a snapshot laid out for fast
 * decoding.
 *
 * Departure from the HF code, on purpose (it does not change the maths): an inference view fuses q/k/v into one
 * `[D, (H+2Hkv)·hd]` matmul and gate/up into one `[D, 2I]` (LoRA adapters merged), folds each RMSNorm weight into the
 * rows of the matmul after it and 1/√hd into q, and norms + rotates q and k as one tensor: 239 kernels per decode step
 * of the perf model instead of ~320. A lean inference view reads the live weights in place instead, where the fused
 * copies would cost too much memory.
 *
 * Legend: D hidden, H heads, Hkv KV heads, hd head dim, I MLP width, V vocab.
 */
import * as tf from "../tensor/Tf.ts"
import * as Transformer from "./Transformer.ts"

/** One projection: `x @ W (+ b) (+ dropout(x) @ A @ B · scale)`. */
export interface Projection {
  readonly w: tf.Tensor2D // [in, out]
  readonly b?: tf.Tensor1D // [out]
  /**
   * A `Transformer.Adapter`'s weights: the variables, or (in an activation recompute) the tensors standing in for
   * them.
   */
  readonly adapter?: {
    readonly a: tf.Tensor // Aᵀ [in, r]
    readonly b: tf.Tensor // Bᵀ [r, out]
    readonly scale: number
    readonly dropout: number
  }
}

export interface LayerView {
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

const param = (model: Transformer.Transformer, name: string): tf.Variable => {
  const v = model.params.get(name)
  if (v === undefined) throw new Error(`model has no weight ${name}`)
  return v
}

const projection = (model: Transformer.Transformer, module: string, withBias: boolean): Projection => {
  const adapter = model.adapters.get(module)
  return {
    w: param(model, `${module}.weight`) as tf.Tensor2D,
    ...(withBias ? { b: param(model, `${module}.bias`) as tf.Tensor1D } : {}),
    ...(adapter !== undefined ? { adapter } : {})
  }
}

/** The live variables, unfused: what training differentiates through. Owns nothing. */
export const training = (model: Transformer.Transformer): WeightView => {
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

export interface InferenceOptions {
  /**
   * Read the live weights in place instead of fusing copies (q|k|v, gate|up, the head with the final norm folded in),
   * which cost about 75% of the weights again. Default: lean above `leanAboveBytes` of weights, where the copies
   * would matter (Qwen3-1.7B and larger), and when frozen weights are stored compactly (`Transformer.storeFrozen`);
   * fused otherwise, where a decode step's kernel count matters more.
   */
  readonly lean?: boolean
}

/** Weights (float32 bytes) above which inference views are lean by default: 4 GiB, about 1B parameters. */
export const leanAboveBytes = 4 * 2 ** 30

const leanByDefault = (model: Transformer.Transformer): boolean => {
  if (Transformer.isFrozenStored(model)) return true
  let bytes = 0
  for (const v of model.params.values()) bytes += v.size * 4
  return bytes > leanAboveBytes
}

/**
 * A snapshot of the current weights fused for fast inference (q|k|v and gate|up concatenated, adapters merged, tied
 * head transposed). Copies: rebuild it after the variables change, and `dispose` it.
 */
export const inference = (model: Transformer.Transformer, options: InferenceOptions = {}): WeightView => {
  const base = training(model)
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

export const dispose = (view: WeightView): void => {
  for (const t of view.owned) t.dispose()
}
