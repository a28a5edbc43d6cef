/**
 * The transformer's forward pass (the model is Transformer.ts), numerically the HF forward: pre-norm blocks of RMSNorm
 * → grouped-query attention with RoPE (HF `rotate_half` convention) → residual, RMSNorm → SiLU-gated MLP → residual, a
 * final RMSNorm and a tied or untied LM head. It reads the weights through a view (WeightView.ts), the live variables
 * for training or a fused snapshot for inference, and differentiates through the custom-gradient layers of Linear.ts.
 *
 * Departures from the HF code, on purpose (none changes the maths):
 * 1. Grouped-query attention does not repeat K/V: the `rep = H / Hkv` query heads sharing one KV head are stacked
 *    along the query axis, `[B, Hkv, rep·T, hd]`, and meet their KV head in one batched matmul.
 * 2. RoPE's `rotate_half` is a fixed `[hd, hd]` signed permutation matmul, and the attention scale 1/√hd is folded into
 *    the query's cos/sin tables.
 * 3. Masked scores are −1e9, not −inf, so rows with no visible key (left padding) stay finite.
 * 4. With the native kernels registered (src/native/NativeKernels.ts), RMSNorm, RoPE, attention and SiLU gating run
 *    as fused kernels (Fused.ts, with native gradients), and an inference view runs 7 kernels per layer (~33 per decode
 *    step of the perf model); the KV cache (token-major `[B, C, Hkv, hd]`) then grows in place. Without them the same
 *    maths runs as tfjs compositions (points 1 and 2).
 *
 * Known cost on stock kernels: the two attention matmuls are batched ([B·Hkv] products), which stock wasm runs on its
 * slow loop — about 40% of a train step of the perf model (profiled). `setAttentionMatmul("split")` unstacks them into
 * 2-D matmuls, but wasm's Unpack/Slice make that slower still; the fused native attention is the fix.
 *
 * Legend: B batch, T new tokens, L cached + new tokens (keys), D hidden, H heads, Hkv KV heads, hd head dim, I MLP
 * width, V vocab.
 */
import * as tf from "../tensor/Tf.ts"
import * as Fused from "./Fused.ts"
import * as Linear from "./Linear.ts"
import type { RopeScaling, TransformerConfig } from "./ModelConfig.ts"
import * as Recompute from "./Recompute.ts"
import type * as Transformer from "./Transformer.ts"
import * as WeightView from "./WeightView.ts"

/**
 * How the stock (tfjs-composed) attention runs its batched matmuls: `"batched"` (default) or `"split"` into 2-D
 * matmuls. See `Fused.setAttentionMatmul`.
 */
export const setAttentionMatmul = Fused.setAttentionMatmul

type MatMul2D = (x: tf.Tensor2D, w: tf.Tensor2D) => tf.Tensor2D
const plainMatMul: MatMul2D = (x, w) => tf.matMul(x, w)

/**
 * `dropoutSeed` (training only) seeds the adapter's dropout mask, so an activation recompute draws the same mask;
 * undefined = no dropout (inference).
 */
const project = (
  x: tf.Tensor2D,
  p: WeightView.Projection,
  dropoutSeed: string | undefined,
  mm: MatMul2D = Linear.matMul
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
  if (mm === Linear.matMul) return withBias(Linear.lora(x, xLora, p.w, a, b, adapter.scale))
  return tf.add(withBias(mm(x, p.w)), tf.mul(mm(mm(xLora, a), b), adapter.scale)) as tf.Tensor2D
}

/** Apply each projection and split a fused one into `sizes`. Projection i's dropout seed is `<dropoutSeed>/<i>`. */
const projectAll = (
  x: tf.Tensor2D,
  ps: ReadonlyArray<WeightView.Projection>,
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
const fusedInference = (view: WeightView.WeightView): boolean =>
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
export const step = (model: Transformer.Transformer, view: WeightView.WeightView, input: StepInput): StepOutput => {
  const c = model.config
  const [B, T] = input.ids.shape
  const H = c.numHeads
  const Hkv = c.numKvHeads
  const hd = c.headDim
  const P =
    input.past === undefined || input.past.length === 0 ? 0 : (input.pastLength ?? input.past[0]!.values.shape[1])
  const L = P + T
  const training = input.training === true
  const mm = view.differentiable ? Linear.matMul : plainMatMul
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
  if (checkpoint && P > 0) throw new Error("Decoder.step: checkpoint is for full-sequence forwards (no past)")
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
  layer: WeightView.LayerView,
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
  let out = Linear.residualAdd(x, project(attended, layer.o, seed("o"), mm)) // [B·T, D]
  // --- MLP: down(silu(gate) · up)
  const h2 = Fused.rmsNorm(out, layer.postNorm, eps) as tf.Tensor2D // [B·T, D]
  const [gate, up] = projectAll(h2, layer.gateUp, [I, I], seed("gateUp"), mm) // [B·T, I] ×2
  const act = Fused.swiglu(gate!, up!) as tf.Tensor2D // [B·T, I]
  out = Linear.residualAdd(out, project(act, layer.down, seed("down"), mm)) // [B·T, D]
  return { x: out, keys, values }
}

/** The layer with every tensor it reads replaced by `f(tensor)`, in a fixed order (norms, q|k|v, o, gate|up, down). */
const mapLayer = (layer: WeightView.LayerView, f: (t: tf.Tensor) => tf.Tensor): WeightView.LayerView => {
  const proj = (p: WeightView.Projection): WeightView.Projection => ({
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
  layer: WeightView.LayerView,
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
export const logitsOf = (view: WeightView.WeightView, hidden: tf.Tensor2D): tf.Tensor2D => {
  if (view.head === undefined && !view.differentiable && Fused.nativeAvailable()) {
    return tf.matMul(hidden, view.embed, false, true) // a tied head read in place: native matmuls take the flag
  }
  return (view.differentiable ? Linear.matMul : plainMatMul)(
    hidden,
    view.head ?? (tf.transpose(view.embed) as tf.Tensor2D)
  ) // [N, V]
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
export const hiddenStates = (
  model: Transformer.Transformer,
  input: ForwardInput,
  view?: WeightView.WeightView
): tf.Tensor2D => tf.tidy(() => step(model, view ?? WeightView.training(model), prepare(input)).hidden)

/** Full-sequence forward: logits [B, T, V]. Materialises every position's logits; `LogProbs` avoids that. */
export const forward = (
  model: Transformer.Transformer,
  input: ForwardInput,
  view?: WeightView.WeightView
): tf.Tensor3D =>
  tf.tidy(() => {
    const w = view ?? WeightView.training(model)
    const hidden = hiddenStates(model, input, w) // [B·T, D]
    const [B, T] = input.ids instanceof tf.Tensor ? input.ids.shape : [input.ids.length, input.ids[0]?.length ?? 0]
    return tf.reshape(logitsOf(w, hidden), [B, T, model.config.vocabSize]) as tf.Tensor3D // [B, T, V]
  })
