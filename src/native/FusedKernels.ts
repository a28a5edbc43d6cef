/**
 * Fused transformer kernels, registered under `EffectRl*` names that src/model/Fused.ts runs when they exist (else it
 * runs the same maths as tfjs compositions; there is no stock kernel to fall back to). Each turns its tensors' shapes
 * and attributes into one addon call; the maths is in native/fused.cc and native/attention.cc.
 */
import type * as tf from "../tensor/Tf.ts"
import { sizeOf } from "./Layout.ts"
import { type OwnKernel, offsetOf, optionalOffset } from "./WasmKernel.ts"

export const kernels: Readonly<Record<string, OwnKernel>> = {
  // x [..., n], w [n] or [wRows, n] (row r of x uses w[r mod wRows]) or absent
  EffectRlRmsNorm: (kernels, { inputs, backend, attrs }) => {
    const { x, w } = inputs as { x: tf.TensorInfo; w?: tf.TensorInfo }
    const n = x.shape.at(-1)!
    const out = backend.makeOutput([...x.shape], "float32")
    const rows = sizeOf(x.shape) / n
    if (rows > 0) {
      kernels.rmsNorm({
        heap: backend.wasm.HEAPU8,
        x: offsetOf(backend, x),
        w: optionalOffset(backend, w),
        out: offsetOf(backend, out),
        rows,
        n,
        wRows: w === undefined ? 1 : sizeOf(w.shape) / n,
        eps: (attrs as { eps: number }).eps
      })
    }
    return out
  },
  EffectRlRmsNormGrad: (kernels, { inputs, backend, attrs }) => {
    const { x, w, dy } = inputs as { x: tf.TensorInfo; w?: tf.TensorInfo; dy: tf.TensorInfo }
    const n = x.shape.at(-1)!
    const dx = backend.makeOutput([...x.shape], "float32")
    const dw = w === undefined ? undefined : backend.makeOutput([...w.shape], "float32")
    kernels.rmsNormGrad({
      heap: backend.wasm.HEAPU8,
      x: offsetOf(backend, x),
      w: optionalOffset(backend, w),
      dy: offsetOf(backend, dy),
      dx: offsetOf(backend, dx),
      dw: optionalOffset(backend, dw),
      rows: sizeOf(x.shape) / n,
      n,
      wRows: w === undefined ? 1 : sizeOf(w.shape) / n,
      eps: (attrs as { eps: number }).eps
    })
    return dw === undefined ? [dx] : [dx, dw]
  },
  // {gate, up} [..., n] each, or {x} [..., 2n] holding gate|up
  EffectRlSwiGlu: (kernels, { inputs, backend }) => {
    const { gate, up, x } = inputs as { gate?: tf.TensorInfo; up?: tf.TensorInfo; x?: tf.TensorInfo }
    const joined = x !== undefined
    const source = (joined ? x : gate)!
    const width = source.shape.at(-1)!
    const n = joined ? width / 2 : width
    const outShape = [...source.shape.slice(0, -1), n]
    const out = backend.makeOutput(outShape, "float32")
    const g = offsetOf(backend, source)
    kernels.swiglu({
      heap: backend.wasm.HEAPU8,
      gate: g,
      up: joined ? g + 4 * n : offsetOf(backend, up!),
      out: offsetOf(backend, out),
      rows: sizeOf(outShape) / Math.max(1, n),
      n,
      gateStride: width,
      upStride: joined ? width : n
    })
    return out
  },
  EffectRlSwiGluGrad: (kernels, { inputs, backend }) => {
    const { gate, up, dy } = inputs as Record<"gate" | "up" | "dy", tf.TensorInfo>
    const n = gate.shape.at(-1)!
    const dgate = backend.makeOutput([...gate.shape], "float32")
    const dup = backend.makeOutput([...up.shape], "float32")
    kernels.swigluGrad({
      heap: backend.wasm.HEAPU8,
      gate: offsetOf(backend, gate),
      up: offsetOf(backend, up),
      dy: offsetOf(backend, dy),
      dgate: offsetOf(backend, dgate),
      dup: offsetOf(backend, dup),
      rows: sizeOf(gate.shape) / n,
      n
    })
    return [dgate, dup]
  },
  // x [N, heads, hd], cos/sin [N, hd]
  EffectRlRope: (kernels, { inputs, backend, attrs }) => {
    const { x, cos, sin } = inputs as Record<"x" | "cos" | "sin", tf.TensorInfo>
    const hd = x.shape.at(-1)!
    const N = sizeOf(cos.shape) / hd
    const out = backend.makeOutput([...x.shape], "float32")
    kernels.rope({
      heap: backend.wasm.HEAPU8,
      x: offsetOf(backend, x),
      cos: offsetOf(backend, cos),
      sin: offsetOf(backend, sin),
      out: offsetOf(backend, out),
      n: N,
      heads: sizeOf(x.shape) / (N * hd),
      headDim: hd,
      backward: (attrs as { backward: boolean }).backward
    })
    return out
  },
  // qkv [B·T, (H + 2Hkv)·hd], cos/sin [B·T, hd], norm? [H + Hkv, hd], pastK/pastV? [B, C, Hkv, hd] holding P = pastLength
  // slots → q [B·T, H, hd], keys/values [B, C', Hkv, hd] holding P + T. When the past has room (C ≥ P + T) the new
  // slots are written into it in place and keys/values share its buffers (the cache owns them and drops the old
  // tensors); else, with `reserve`, C' leaves room for later steps.
  EffectRlQkvPrep: (kernels, { inputs, backend, attrs }) => {
    const { qkv, cos, sin, norm, pastK, pastV } = inputs as Record<"qkv" | "cos" | "sin", tf.TensorInfo> & {
      norm?: tf.TensorInfo
      pastK?: tf.TensorInfo
      pastV?: tf.TensorInfo
    }
    const a = attrs as unknown as Record<"batch" | "heads" | "kvHeads" | "headDim" | "eps" | "pastLength", number> & {
      reserve: boolean
    }
    const N = qkv.shape[0]!
    const B = a.batch
    const T = N / B
    const P = pastK === undefined ? 0 : a.pastLength
    const pastCap = pastK === undefined ? 0 : pastK.shape[1]!
    const inPlace = pastK !== undefined && pastV !== undefined && pastCap >= P + T
    const q = backend.makeOutput([N, a.heads, a.headDim], "float32")
    let keys: tf.TensorInfo
    let values: tf.TensorInfo
    if (inPlace) {
      backend.incRef(pastK.dataId)
      backend.incRef(pastV.dataId)
      keys = { dataId: pastK.dataId, shape: pastK.shape, dtype: "float32" }
      values = { dataId: pastV.dataId, shape: pastV.shape, dtype: "float32" }
    } else {
      const slots = a.reserve ? P + T + Math.max(16, Math.ceil((P + T) / 2)) : P + T
      keys = backend.makeOutput([B, slots, a.kvHeads, a.headDim], "float32")
      values = backend.makeOutput([B, slots, a.kvHeads, a.headDim], "float32")
    }
    kernels.qkvPrep({
      heap: backend.wasm.HEAPU8,
      qkv: offsetOf(backend, qkv),
      cos: offsetOf(backend, cos),
      sin: offsetOf(backend, sin),
      norm: optionalOffset(backend, norm),
      eps: a.eps,
      pastK: optionalOffset(backend, pastK),
      pastV: optionalOffset(backend, pastV),
      q: offsetOf(backend, q),
      keys: offsetOf(backend, keys),
      values: offsetOf(backend, values),
      batch: B,
      tokens: T,
      pastLength: P,
      heads: a.heads,
      kvHeads: a.kvHeads,
      headDim: a.headDim,
      pastCapacity: pastCap,
      capacity: keys.shape[1]!
    })
    return [q, keys, values]
  },
  // q [B·T, H, hd], k/v [B, C, Hkv, hd] of which the first `length` (default C) slots count, bias? [B, T, length]
  // → out [B·T, H·hd] (+ probs [B, H, T, length] when keepProbs)
  EffectRlAttention: (kernels, { inputs, backend, attrs }) => {
    const { q, k, v, bias } = inputs as Record<"q" | "k" | "v", tf.TensorInfo> & { bias?: tf.TensorInfo }
    const a = attrs as unknown as { scale: number; keepProbs: boolean; length?: number }
    const [B, C, Hkv, hd] = k.shape as [number, number, number, number]
    const L = a.length ?? C
    const H = q.shape[1]!
    const T = q.shape[0]! / B
    const out = backend.makeOutput([B * T, H * hd], "float32")
    const probs = a.keepProbs ? backend.makeOutput([B, H, T, L], "float32") : undefined
    kernels.attention({
      heap: backend.wasm.HEAPU8,
      q: offsetOf(backend, q),
      k: offsetOf(backend, k),
      v: offsetOf(backend, v),
      bias: optionalOffset(backend, bias),
      out: offsetOf(backend, out),
      probs: optionalOffset(backend, probs),
      batch: B,
      tokens: T,
      length: L,
      heads: H,
      kvHeads: Hkv,
      headDim: hd,
      scale: a.scale,
      capacity: C
    })
    return probs === undefined ? [out] : [out, probs]
  },
  EffectRlAttentionGrad: (kernels, { inputs, backend, attrs }) => {
    const { q, k, v, probs, dy } = inputs as Record<"q" | "k" | "v" | "probs" | "dy", tf.TensorInfo>
    const [B, L, Hkv, hd] = k.shape as [number, number, number, number]
    const H = q.shape[1]!
    const T = q.shape[0]! / B
    const dq = backend.makeOutput([...q.shape], "float32")
    const dk = backend.makeOutput([...k.shape], "float32")
    const dv = backend.makeOutput([...v.shape], "float32")
    kernels.attentionGrad({
      heap: backend.wasm.HEAPU8,
      q: offsetOf(backend, q),
      k: offsetOf(backend, k),
      v: offsetOf(backend, v),
      probs: offsetOf(backend, probs),
      dOut: offsetOf(backend, dy),
      dq: offsetOf(backend, dq),
      dk: offsetOf(backend, dk),
      dv: offsetOf(backend, dv),
      batch: B,
      tokens: T,
      length: L,
      heads: H,
      kvHeads: Hkv,
      headDim: hd,
      scale: (attrs as { scale: number }).scale
    })
    return [dq, dk, dv]
  },
  // h [N, D], w [D, V] (or the embedding [V, D] when transposed), targets int32 [N] → out [N, 2] (logp, entropy),
  // lse [N] (for the gradient)
  EffectRlHeadLogProbs: (kernels, { inputs, backend, attrs }) => {
    const { h, w, targets } = inputs as Record<"h" | "w" | "targets", tf.TensorInfo>
    const transposed = (attrs as { transposed: boolean }).transposed
    const [N, D] = h.shape as [number, number]
    const out = backend.makeOutput([N, 2], "float32")
    const lse = backend.makeOutput([N], "float32")
    if (N === 0) return [out, lse]
    const ok = kernels.headLogProbs({
      heap: backend.wasm.HEAPU8,
      h: offsetOf(backend, h),
      w: offsetOf(backend, w),
      targets: offsetOf(backend, targets),
      out: offsetOf(backend, out),
      lse: offsetOf(backend, lse),
      n: N,
      d: D,
      v: transposed ? w.shape[0]! : w.shape[1]!,
      transposed
    })
    if (!ok) {
      backend.disposeData(out.dataId)
      backend.disposeData(lse.dataId)
      throw new Error("EffectRlHeadLogProbs: a target is outside [0, vocabulary size)")
    }
    return [out, lse]
  },
  EffectRlHeadLogProbsGrad: (kernels, { inputs, backend, attrs }) => {
    const { h, w, targets, out, lse, dy } = inputs as Record<
      "h" | "w" | "targets" | "out" | "lse" | "dy",
      tf.TensorInfo
    >
    const { transposed, trainW } = attrs as { transposed: boolean; trainW: boolean }
    const [N, D] = h.shape as [number, number]
    const dh = backend.makeOutput([N, D], "float32")
    const dw = trainW ? backend.makeOutput([...w.shape], "float32") : undefined
    kernels.headLogProbsGrad({
      heap: backend.wasm.HEAPU8,
      h: offsetOf(backend, h),
      w: offsetOf(backend, w),
      targets: offsetOf(backend, targets),
      out: offsetOf(backend, out),
      lse: offsetOf(backend, lse),
      dy: offsetOf(backend, dy),
      dh: offsetOf(backend, dh),
      dw: dw === undefined ? 0 : offsetOf(backend, dw),
      n: N,
      d: D,
      v: transposed ? w.shape[0]! : w.shape[1]!,
      transposed,
      trainW
    })
    return dw === undefined ? [dh] : [dh, dw]
  },
  // a [M, K] @ b [K, N] (rows of a RMS-normed first when normEps ≥ 0) + residual? [M, N]
  EffectRlLinear: (kernels, { inputs, backend, attrs }) => {
    const { a, b, residual } = inputs as { a: tf.TensorInfo; b: tf.TensorInfo; residual?: tf.TensorInfo }
    const [M, K] = a.shape as [number, number]
    const N = b.shape[1]!
    const out = backend.makeOutput([M, N], "float32")
    kernels.linear({
      heap: backend.wasm.HEAPU8,
      a: offsetOf(backend, a),
      b: offsetOf(backend, b),
      out: offsetOf(backend, out),
      m: M,
      n: N,
      k: K,
      residual: optionalOffset(backend, residual),
      normEps: (attrs as { normEps: number }).normEps
    })
    return out
  }
}
