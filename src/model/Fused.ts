/**
 * Fused transformer ops: one kernel each where tfjs' composition runs 5–20 (RMSNorm, SiLU-gating, RoPE, attention over
 * a KV cache, and for inference the q|k|v preparation with the cache append and a linear with a folded RMSNorm and a
 * residual). The kernels are the native ones that src/native/NativeKernels.ts registers under `EffectRl*` names; when
 * they are not registered on the active backend (stock kernels, cpu backend, no addon) every op runs the plain tfjs
 * composition it replaces, so results agree to float32 rounding either way.
 *
 * Differentiable ops (`rmsNorm`, `swiglu`, `rope`, `attention`) carry hand-written gradients that run as one native
 * kernel too. Pure tensor code (no Effect): call inside `tf.tidy`.
 *
 * Layouts: tokens are rows, `N = B·T`. Attention takes q `[N, H, hd]` and keys/values `[B, L, Hkv, hd]` (the KV cache's
 * layout: appending a token is a copy of contiguous rows) and returns `[N, H·hd]`; query head h reads KV head
 * `h / (H / Hkv)` (HF `repeat_kv`).
 */
import * as tf from "../tensor/Tf.ts"

const has = (kernel: string): boolean => tf.getKernel(kernel, tf.getBackend()) !== undefined

/** True when the native fused kernels are registered on the active backend. */
export const nativeAvailable = (): boolean => has("EffectRlAttention")

const run = (kernel: string, inputs: tf.NamedTensorMap, attrs: Record<string, unknown> = {}): Array<tf.Tensor> => {
  const out = tf.engine().runKernel(kernel, inputs, attrs as tf.NamedAttrMap)
  return Array.isArray(out) ? out : [out as tf.Tensor]
}

const tapeOn = (): boolean => (tf.engine() as unknown as { isTapeOn(): boolean }).isTapeOn()

// biome-ignore lint/suspicious/noExplicitAny: tfjs' CustomGradientFunc types its inputs as a Tensor[] spread
type AnyGradFunc = any

// ---------------------------------------------------------------------------------------------------------------
// RMSNorm

/** The tfjs composition: x · rsqrt(mean(x²) + ε) (· w). */
const rmsNormStock = (x: tf.Tensor, w: tf.Tensor | undefined, eps: number): tf.Tensor => {
  const variance = tf.mean(tf.square(x), -1, true) // [..., 1]
  const normed = tf.mul(x, tf.rsqrt(tf.add(variance, eps))) // [..., n]
  return w === undefined ? normed : tf.mul(normed, w) // [..., n]
}

/**
 * x · rsqrt(mean(x²) + ε) · w over the last axis. `w` is `[n]`, or `[R, n]` with x `[..., R, n]` (a weight per row
 * group, e.g. per head); undefined when folded into the next matmul.
 */
export const rmsNorm = (x: tf.Tensor, w: tf.Tensor | undefined, eps: number): tf.Tensor => {
  if (!has("EffectRlRmsNorm")) return rmsNormStock(x, w, eps)
  if (w === undefined) {
    const op = tf.customGrad(((xIn: tf.Tensor, save: tf.GradSaveFunc) => {
      save([xIn])
      return {
        value: run("EffectRlRmsNorm", { x: xIn }, { eps })[0]!,
        gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) =>
          run("EffectRlRmsNormGrad", { x: saved[0]!, dy }, { eps })[0]!
      }
    }) as AnyGradFunc) as unknown as (x: tf.Tensor) => tf.Tensor
    return op(x)
  }
  const op = tf.customGrad(((xIn: tf.Tensor, wIn: tf.Tensor, save: tf.GradSaveFunc) => {
    save([xIn, wIn])
    return {
      value: run("EffectRlRmsNorm", { x: xIn, w: wIn }, { eps })[0]!,
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) =>
        run("EffectRlRmsNormGrad", { x: saved[0]!, w: saved[1]!, dy }, { eps })
    }
  }) as AnyGradFunc) as unknown as (x: tf.Tensor, w: tf.Tensor) => tf.Tensor
  return op(x, w)
}

// ---------------------------------------------------------------------------------------------------------------
// SiLU gating

/** silu(gate) · up, element-wise. */
export const swiglu = (gate: tf.Tensor, up: tf.Tensor): tf.Tensor => {
  if (!has("EffectRlSwiGlu")) return tf.mul(tf.mul(gate, tf.sigmoid(gate)), up)
  const op = tf.customGrad(((g: tf.Tensor, u: tf.Tensor, save: tf.GradSaveFunc) => {
    save([g, u])
    return {
      value: run("EffectRlSwiGlu", { gate: g, up: u })[0]!,
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) =>
        run("EffectRlSwiGluGrad", { gate: saved[0]!, up: saved[1]!, dy })
    }
  }) as AnyGradFunc) as unknown as (g: tf.Tensor, u: tf.Tensor) => tf.Tensor
  return op(gate, up)
}

/** silu(x[:, :n]) · x[:, n:] of a joined gate|up tensor `[N, 2n]` → `[N, n]`. Not differentiable (inference). */
export const swigluJoined = (x: tf.Tensor2D): tf.Tensor2D => {
  if (has("EffectRlSwiGlu")) return run("EffectRlSwiGlu", { x })[0] as tf.Tensor2D
  const [gate, up] = tf.split(x, 2, 1)
  return tf.mul(tf.mul(gate!, tf.sigmoid(gate!)), up!) as tf.Tensor2D
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE

/** `rotate_half` as a matrix: `rotate_half(x) = x @ R`, R[j + h, j] = −1 and R[j, j + h] = 1 for j < h = hd/2. */
export const rotateHalfMatrix = (hd: number): Float32Array => {
  const h = hd / 2
  const r = new Float32Array(hd * hd)
  for (let j = 0; j < h; j++) {
    r[(j + h) * hd + j] = -1
    r[j * hd + j + h] = 1
  }
  return r
}

/** The tfjs composition: x · cos + rotate_half(x) · sin, rotate_half as a `[hd, hd]` matmul. */
export const ropeStock = (x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor): tf.Tensor => {
  const hd = x.shape.at(-1)!
  const N = cos.size / hd
  const heads = x.size / (N * hd)
  const rotated = tf.matMul(tf.reshape(x, [N * heads, hd]), tf.tensor2d(rotateHalfMatrix(hd), [hd, hd])) // [N·heads, hd]
  return tf.add(
    tf.mul(x, tf.reshape(cos, [N, 1, hd])),
    tf.mul(tf.reshape(rotated, [N, heads, hd]), tf.reshape(sin, [N, 1, hd]))
  ) // [N, heads, hd]
}

/** RoPE (HF rotate_half) of x `[N, heads, hd]` with per-token tables cos/sin `[N, hd]` (or `[N, 1, hd]`). */
export const rope = (x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor): tf.Tensor => {
  if (!has("EffectRlRope")) return ropeStock(x, cos, sin)
  const op = tf.customGrad(((xIn: tf.Tensor, save: tf.GradSaveFunc) => {
    save([cos, sin]) // kept for the backward pass (a tidy inside the forward would dispose them)
    return {
      value: run("EffectRlRope", { x: xIn, cos, sin }, { backward: false })[0]!,
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) =>
        run("EffectRlRope", { x: dy, cos: saved[0]!, sin: saved[1]! }, { backward: true })[0]!
    }
  }) as AnyGradFunc) as unknown as (x: tf.Tensor) => tf.Tensor
  return op(x)
}

// ---------------------------------------------------------------------------------------------------------------
// Attention

/**
 * How `attentionStock` runs its batched matmuls. `"batched"` (default) issues one BatchMatMul; `"split"` unstacks the
 * batch into 2-D matmuls. Measured on stock wasm for [32, 128, 64] @ [32, 64, 128]: batched 42–68 ms, split 53–104 ms
 * (wasm's Unpack alone costs 21–27 ms), so split only pays where unstacking is cheap.
 */
let attentionMatmulMode: "split" | "batched" = "batched"
export const setAttentionMatmul = (mode: "split" | "batched"): void => {
  attentionMatmulMode = mode
}

/** a [N, M, K] @ b [N, K, P] → [N, M, P]. */
const batchedMatmul = (a: tf.Tensor3D, b: tf.Tensor3D): tf.Tensor3D => {
  const N = a.shape[0]
  if (attentionMatmulMode === "batched" || N === 1) return tf.matMul(a, b) // [N, M, P]
  const as = tf.unstack(a) as Array<tf.Tensor2D> // N × [M, K]
  const bs = tf.unstack(b) as Array<tf.Tensor2D> // N × [K, P]
  return tf.stack(as.map((ai, i) => tf.matMul(ai, bs[i]!))) as tf.Tensor3D // [N, M, P]
}

/**
 * The tfjs composition: the `rep = H / Hkv` query heads sharing one KV head stacked along the query axis, two
 * batched matmuls and a softmax. q `[N, H, hd]`, keys/values `[B, L, Hkv, hd]`, bias `[B, T, L]` → `[N, H·hd]`.
 */
export const attentionStock = (
  q: tf.Tensor,
  keys: tf.Tensor4D,
  values: tf.Tensor4D,
  bias: tf.Tensor | undefined,
  scale: number
): tf.Tensor2D => {
  const [B, L, Hkv, hd] = keys.shape
  const H = q.shape[1]!
  const T = q.shape[0]! / B
  const rep = H / Hkv
  const qs = scale === 1 ? q : tf.mul(q, scale)
  const qg = tf.reshape(tf.transpose(tf.reshape(qs, [B, T, Hkv, rep, hd]), [0, 2, 3, 1, 4]), [B * Hkv, rep * T, hd]) // [B·Hkv, rep·T, hd]
  const kT = tf.reshape(tf.transpose(keys, [0, 2, 3, 1]), [B * Hkv, hd, L]) // [B·Hkv, hd, L]
  const v = tf.reshape(tf.transpose(values, [0, 2, 1, 3]), [B * Hkv, L, hd]) // [B·Hkv, L, hd]
  let scores = tf.reshape(batchedMatmul(qg as tf.Tensor3D, kT as tf.Tensor3D), [B, Hkv, rep, T, L]) // [B, Hkv, rep, T, L]
  if (bias !== undefined) scores = tf.add(scores, tf.reshape(bias, [B, 1, 1, T, L]))
  const probs = tf.reshape(tf.softmax(scores), [B * Hkv, rep * T, L]) // [B·Hkv, rep·T, L]
  const attended = tf.reshape(batchedMatmul(probs as tf.Tensor3D, v as tf.Tensor3D), [B, Hkv, rep, T, hd]) // [B, Hkv, rep, T, hd]
  return tf.reshape(tf.transpose(attended, [0, 3, 1, 2, 4]), [B * T, H * hd]) as tf.Tensor2D // [N, H·hd]
}

/**
 * softmax(scale · q kᵀ + bias) v per head. q `[N, H, hd]` (N = B·T), keys/values `[B, C, Hkv, hd]` of which the first
 * `length` (default C) slots count, bias `[B, T, length]` additive (constant: no gradient) → `[N, H·hd]`.
 * Differentiable in q, keys and values.
 */
export const attention = (
  q: tf.Tensor,
  keys: tf.Tensor4D,
  values: tf.Tensor4D,
  bias: tf.Tensor | undefined,
  scale: number,
  length: number = keys.shape[1]
): tf.Tensor2D => {
  if (!has("EffectRlAttention"))
    return attentionStock(q, validSlots(keys, length), validSlots(values, length), bias, scale)
  const extra = bias === undefined ? {} : { bias }
  if (!tapeOn())
    return run(
      "EffectRlAttention",
      { q, k: keys, v: values, ...extra },
      { scale, keepProbs: false, length }
    )[0] as tf.Tensor2D
  if (length !== keys.shape[1]) return attention(q, validSlots(keys, length), validSlots(values, length), bias, scale)
  const op = tf.customGrad(((qIn: tf.Tensor, kIn: tf.Tensor, vIn: tf.Tensor, save: tf.GradSaveFunc) => {
    const [out, probs] = run("EffectRlAttention", { q: qIn, k: kIn, v: vIn, ...extra }, { scale, keepProbs: true })
    save([qIn, kIn, vIn, probs!])
    return {
      value: out!,
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) =>
        run("EffectRlAttentionGrad", { q: saved[0]!, k: saved[1]!, v: saved[2]!, probs: saved[3]!, dy }, { scale })
    }
  }) as AnyGradFunc) as unknown as (q: tf.Tensor, k: tf.Tensor, v: tf.Tensor) => tf.Tensor2D
  return op(q, keys, values)
}

// ---------------------------------------------------------------------------------------------------------------
// LM head log-probs

/** True when the fused LM head kernel runs on the active backend (LogProbs then takes it for every size). */
export const headAvailable = (): boolean => has("EffectRlHeadLogProbs")

/** The tfjs composition, with the [N, V] logits held: z = h · W (or h · Wᵀ), then logp and H per row. */
const headLogProbsStock = (h: tf.Tensor2D, w: tf.Tensor2D, targets: tf.Tensor1D, transposed: boolean): tf.Tensor2D => {
  const z = tf.matMul(h, w, false, transposed) as tf.Tensor2D // [N, V]
  const V = z.shape[1]
  const lse = tf.logSumExp(z, 1) // [N]
  const picked = tf.sum(tf.mul(z, tf.cast(tf.oneHot(tf.cast(targets, "int32"), V), "float32")), 1) // z[n, y_n]  [N]
  const entropy = tf.sub(lse, tf.sum(tf.mul(tf.softmax(z), z), 1)) // H = lse − Σ p z  [N]
  return tf.stack([tf.sub(picked, lse), entropy], 1) as tf.Tensor2D // [N, 2]
}

/**
 * Per-row log-prob of the target and entropy under the LM head: z = h · W, `[N, 2]` = (z[n, y_n] − logsumexp(z_n),
 * logsumexp(z_n) − Σ_v p_v z_v). h `[N, D]`, targets int32 `[N]`; W `[D, V]` as held, or with `transposed` the tied
 * embedding `[V, D]` itself (no transposed copy). Differentiable in h and W; the gradient in W has W's layout.
 *
 * Natively no `[N, V]` tensor exists, forward or backward: the kernel tiles the vocabulary and recomputes the logits
 * in the gradient (native/head.cc). Without the kernel this is the plain composition (LogProbs.fusedHead is the
 * chunked one for large vocabularies).
 */
export const headLogProbs = (
  h: tf.Tensor2D,
  w: tf.Tensor2D,
  targets: tf.Tensor1D,
  options: { readonly transposed?: boolean; readonly trainW?: boolean } = {}
): tf.Tensor2D => {
  const transposed = options.transposed ?? false
  if (!headAvailable()) return headLogProbsStock(h, w, targets, transposed)
  const y = targets.dtype === "int32" ? targets : (tf.cast(targets, "int32") as tf.Tensor1D)
  if (!tapeOn()) {
    const [out, lse] = run("EffectRlHeadLogProbs", { h, w, targets: y }, { transposed })
    lse!.dispose()
    return out as tf.Tensor2D
  }
  // a frozen head (LoRA's base) is no input of the op: its gradient, as large as the vocabulary, is never computed
  const trainW = options.trainW ?? true
  const op = tf.customGrad(((...args: Array<tf.Tensor | tf.GradSaveFunc>) => {
    const hIn = args[0] as tf.Tensor
    const wIn = trainW ? (args[1] as tf.Tensor) : w
    const save = args[args.length - 1] as tf.GradSaveFunc
    const [out, lse] = run("EffectRlHeadLogProbs", { h: hIn, w: wIn, targets: y }, { transposed })
    save([hIn, y, out!, lse!, wIn])
    return {
      value: out!,
      gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) =>
        run(
          "EffectRlHeadLogProbsGrad",
          { h: saved[0]!, w: saved[4]!, targets: saved[1]!, out: saved[2]!, lse: saved[3]!, dy },
          { transposed, trainW }
        )
    }
  }) as AnyGradFunc) as unknown as (...inputs: Array<tf.Tensor>) => tf.Tensor2D
  return trainW ? op(h, w) : op(h)
}

// ---------------------------------------------------------------------------------------------------------------
// Inference-only fusions (no gradients)

/** A layer's cached keys/values `[B, C, Hkv, hd]`, of which the first `length` slots count (C ≥ length: room to grow). */
export interface CachedKv {
  readonly keys: tf.Tensor4D
  readonly values: tf.Tensor4D
  readonly length: number
}

/** The first `length` slots of a cache tensor `[B, C, Hkv, hd]` (itself when C = length). */
export const validSlots = (t: tf.Tensor4D, length: number): tf.Tensor4D =>
  t.shape[1] === length ? t : (tf.slice(t, [0, 0, 0, 0], [-1, length, -1, -1]) as tf.Tensor4D)

/**
 * q|k|v preparation for a decode or prefill step: qkv `[N, (H + 2Hkv)·hd]` → q `[N, H, hd]` and the keys/values with
 * the new tokens appended to `past` (length P + T). q and k heads are RMS-normed by `qkNorm` `[H + Hkv, hd]` (when
 * given) and rotated with cos/sin `[N, hd]`.
 *
 * Natively, keys/values may carry spare slots: when `past` has room, the new slots are written INTO its buffers and the
 * returned tensors share them, so the caller must own `past` and drop it (as KvCache.extend does); with `reserve`, a
 * reallocation leaves room for later steps (amortised appends instead of copying the whole cache every token).
 */
export const qkvPrep = (
  qkv: tf.Tensor2D,
  cos: tf.Tensor,
  sin: tf.Tensor,
  qkNorm: tf.Tensor2D | undefined,
  past: CachedKv | undefined,
  dims: { readonly batch: number; readonly heads: number; readonly kvHeads: number; readonly headDim: number },
  eps: number,
  reserve = false
): { readonly q: tf.Tensor3D; readonly keys: tf.Tensor4D; readonly values: tf.Tensor4D } => {
  const { batch: B, heads: H, kvHeads: Hkv, headDim: hd } = dims
  const N = qkv.shape[0]
  const T = N / B
  if (has("EffectRlQkvPrep")) {
    const inputs: tf.NamedTensorMap = { qkv, cos, sin }
    if (qkNorm !== undefined) inputs["norm"] = qkNorm
    if (past !== undefined && past.length > 0) {
      inputs["pastK"] = past.keys
      inputs["pastV"] = past.values
    }
    const [q, keys, values] = run("EffectRlQkvPrep", inputs, {
      batch: B,
      heads: H,
      kvHeads: Hkv,
      headDim: hd,
      eps,
      pastLength: past?.length ?? 0,
      reserve
    })
    return { q: q as tf.Tensor3D, keys: keys as tf.Tensor4D, values: values as tf.Tensor4D }
  }
  const [qk2, v2] = tf.split(qkv, [(H + Hkv) * hd, Hkv * hd], 1)
  let qk: tf.Tensor = tf.reshape(qk2!, [N, H + Hkv, hd])
  if (qkNorm !== undefined) qk = rmsNormStock(qk, qkNorm, eps)
  const [q, k] = tf.split(ropeStock(qk, cos, sin), [H, Hkv], 1)
  const kNew = tf.reshape(k!, [B, T, Hkv, hd]) as tf.Tensor4D
  const vNew = tf.reshape(v2!, [B, T, Hkv, hd]) as tf.Tensor4D
  if (past === undefined || past.length === 0) return { q: q as tf.Tensor3D, keys: kNew, values: vNew }
  return {
    q: q as tf.Tensor3D,
    keys: tf.concat([validSlots(past.keys, past.length), kNew], 1) as tf.Tensor4D,
    values: tf.concat([validSlots(past.values, past.length), vNew], 1) as tf.Tensor4D
  }
}

/**
 * `diag(r) · (a @ w) + residual` with r the rows' RMS-norm factors when `normEps` is given (the norm's weight folded
 * into w's rows), else 1. a `[M, K]`, w `[K, N]`, residual `[M, N]`. Not differentiable (inference).
 */
export const linear = (
  a: tf.Tensor2D,
  w: tf.Tensor2D,
  options: { readonly normEps?: number; readonly residual?: tf.Tensor2D } = {}
): tf.Tensor2D => {
  if (has("EffectRlLinear")) {
    const inputs: tf.NamedTensorMap = { a, b: w }
    if (options.residual !== undefined) inputs["residual"] = options.residual
    return run("EffectRlLinear", inputs, { normEps: options.normEps ?? -1 })[0] as tf.Tensor2D
  }
  const x = options.normEps === undefined ? a : (rmsNormStock(a, undefined, options.normEps) as tf.Tensor2D)
  const y = tf.matMul(x, w) as tf.Tensor2D
  return options.residual === undefined ? y : (tf.add(options.residual, y) as tf.Tensor2D)
}
