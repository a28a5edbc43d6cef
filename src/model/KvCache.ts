/**
 * A key/value cache over a batch of left-padded rows, for incremental decoding. Each row's real tokens end at the
 * same slot (left padding), so one new token per row appends one column for the whole batch. Padding keys stay in
 * the cache, masked out by `keyMask`; RoPE positions count real tokens only, so a padded row decodes exactly as it
 * would alone.
 *
 * The cache owns its tensors: `extend` and `select` return a new cache and dispose the old one's tensors, `dispose`
 * frees the last one. The caller owns the `WeightView` it passes (rebuild it when the weights change: keys/values
 * already cached stay as the old weights computed them, which is what in-flight weight updates in vLLM do too).
 */
import * as tf from "../tensor/Tf.ts"
import * as Decoder from "./Decoder.ts"
import * as Fused from "./Fused.ts"
import type * as Transformer from "./Transformer.ts"
import type * as WeightView from "./WeightView.ts"

export interface KvCache {
  readonly layers: ReadonlyArray<Decoder.LayerCache> // per layer: keys, values [B, C ≥ L, Hkv, hd] (L slots used)
  readonly keyMask: Uint8Array // [B, L] row-major, 1 = real token
  readonly nextPosition: Int32Array // [B], RoPE position of each row's next token (= its real-token count)
  readonly batch: number // B
  readonly length: number // L
}

export interface Stepped {
  readonly cache: KvCache
  readonly logits: Float32Array // [B, V] row-major: each row's next-token logits
}

/**
 * Read outside the tidy: tidy walks whatever its function returns, and a Float32Array's every index is a key. The read
 * is async because the webgpu backend has no synchronous one in Node. Disposes `hidden`.
 */
const lastLogits = async (
  view: WeightView.WeightView,
  hidden: tf.Tensor2D,
  B: number,
  T: number
): Promise<Float32Array> => {
  const logits = tf.tidy(() => {
    const D = hidden.shape[1]
    const last =
      T === 1
        ? hidden
        : (tf.reshape(tf.slice(tf.reshape(hidden, [B, T, D]), [0, T - 1, 0], [B, 1, D]), [B, D]) as tf.Tensor2D) // [B, D]
    return Decoder.logitsOf(view, last) // [B, V]
  })
  hidden.dispose()
  return (await logits.data().finally(() => logits.dispose())) as Float32Array
}

/**
 * Run the prompts (ragged; left-padded here) and cache their keys/values. Every prompt must be non-empty. Identical
 * prompts (the n samples of a GRPO group) are run once and their cache rows copied.
 */
export const prefill = async (
  model: Transformer.Transformer,
  view: WeightView.WeightView,
  prompts: ReadonlyArray<ReadonlyArray<number>>
): Promise<Stepped> => {
  const firstIndex = new Map<string, number>()
  const unique: Array<ReadonlyArray<number>> = []
  const rowOf = prompts.map((p) => {
    const key = p.join(",")
    let u = firstIndex.get(key)
    if (u === undefined) {
      u = unique.length
      firstIndex.set(key, u)
      unique.push(p)
    }
    return u
  })
  if (unique.length === prompts.length) return prefillRows(model, view, prompts)
  const stepped = await prefillRows(model, view, unique)
  const V = stepped.logits.length / unique.length
  const logits = new Float32Array(prompts.length * V)
  rowOf.forEach((u, i) => logits.set(stepped.logits.subarray(u * V, (u + 1) * V), i * V))
  return { cache: select(stepped.cache, rowOf), logits }
}

const prefillRows = async (
  model: Transformer.Transformer,
  view: WeightView.WeightView,
  prompts: ReadonlyArray<ReadonlyArray<number>>
): Promise<Stepped> => {
  const B = prompts.length
  const P = Math.max(...prompts.map((p) => p.length))
  if (prompts.some((p) => p.length === 0)) throw new Error("KvCache.prefill: empty prompt")
  const ids = new Int32Array(B * P)
  const keyMask = new Uint8Array(B * P)
  prompts.forEach((prompt, b) => {
    const pad = P - prompt.length
    prompt.forEach((id, t) => {
      ids[b * P + pad + t] = id
      keyMask[b * P + pad + t] = 1
    })
  })
  const positions = Decoder.positionsFromMask(keyMask, B, P)
  const out = tf.tidy(() => {
    const step = Decoder.step(model, view, { ids: tf.tensor2d(ids, [B, P], "int32"), keyMask, positions })
    return { hidden: step.hidden, keys: step.cache.map((c) => c.keys), values: step.cache.map((c) => c.values) }
  })
  const logits = await lastLogits(view, out.hidden, B, P)
  return {
    cache: {
      layers: out.keys.map((keys, l) => ({ keys, values: out.values[l]! })),
      keyMask,
      nextPosition: Int32Array.from(prompts, (p) => p.length),
      batch: B,
      length: P
    },
    logits
  }
}

/** Append one token per row; returns the next-token logits. Disposes the old cache's tensors. */
export const extend = async (
  model: Transformer.Transformer,
  view: WeightView.WeightView,
  cache: KvCache,
  tokens: ArrayLike<number>
): Promise<Stepped> => {
  const B = cache.batch
  const L = cache.length + 1
  const keyMask = new Uint8Array(B * L)
  for (let b = 0; b < B; b++) {
    keyMask.set(cache.keyMask.subarray(b * cache.length, (b + 1) * cache.length), b * L)
    keyMask[b * L + L - 1] = 1
  }
  const out = tf.tidy(() => {
    const step = Decoder.step(model, view, {
      ids: tf.tensor2d(Int32Array.from(tokens), [B, 1], "int32"),
      keyMask,
      positions: cache.nextPosition,
      past: cache.layers,
      pastLength: cache.length
    })
    return { hidden: step.hidden, keys: step.cache.map((c) => c.keys), values: step.cache.map((c) => c.values) }
  })
  dispose(cache)
  const logits = await lastLogits(view, out.hidden, B, 1)
  return {
    cache: {
      layers: out.keys.map((keys, l) => ({ keys, values: out.values[l]! })),
      keyMask,
      nextPosition: cache.nextPosition.map((p) => p + 1),
      batch: B,
      length: L
    },
    logits
  }
}

/** Keep only `rows` (in that order, repeats allowed), e.g. when some requests finished. Disposes the old tensors. */
export const select = (cache: KvCache, rows: ReadonlyArray<number>): KvCache => {
  const selected = copyRows(cache, rows)
  dispose(cache)
  return selected
}

/**
 * A new cache of these rows (in that order, repeats allowed); the input stays valid. Whole rows are gathered, spare
 * slots included, so the copy keeps the room to grow in place.
 */
export const copyRows = (cache: KvCache, rows: ReadonlyArray<number>): KvCache => {
  const L = cache.length
  const layers = tf.tidy(() => {
    const index = tf.tensor1d(Int32Array.from(rows), "int32")
    return cache.layers.map((c) => ({
      keys: tf.gather(c.keys, index) as tf.Tensor4D, // [B', C, Hkv, hd]
      values: tf.gather(c.values, index) as tf.Tensor4D // [B', C, Hkv, hd]
    }))
  })
  const keyMask = new Uint8Array(rows.length * L)
  rows.forEach((r, i) => keyMask.set(cache.keyMask.subarray(r * L, (r + 1) * L), i * L))
  return {
    layers,
    keyMask,
    nextPosition: Int32Array.from(rows, (r) => cache.nextPosition[r]!),
    batch: rows.length,
    length: L
  }
}

export const dispose = (cache: KvCache): void => {
  for (const c of cache.layers) {
    c.keys.dispose()
    c.values.dispose()
  }
}

/** Left-pad a cache to length L with masked-out zero keys/values (alignment of real tokens is kept on the right). */
const padTo = (cache: KvCache, L: number): { layers: Array<Decoder.LayerCache>; keyMask: Uint8Array } => {
  const pad = L - cache.length
  const valid = (c: Decoder.LayerCache) => ({
    keys: Fused.validSlots(c.keys, cache.length),
    values: Fused.validSlots(c.values, cache.length)
  })
  if (pad === 0) return { layers: cache.layers.map((c) => tf.tidy(() => valid(c))), keyMask: cache.keyMask }
  const keyMask = new Uint8Array(cache.batch * L)
  for (let b = 0; b < cache.batch; b++) {
    keyMask.set(cache.keyMask.subarray(b * cache.length, (b + 1) * cache.length), b * L + pad)
  }
  const layers = cache.layers.map((layer) =>
    tf.tidy(() => {
      const c = valid(layer)
      return {
        keys: tf.pad(c.keys, [
          [0, 0],
          [pad, 0],
          [0, 0],
          [0, 0]
        ]) as tf.Tensor4D, // [B, L, Hkv, hd]
        values: tf.pad(c.values, [
          [0, 0],
          [pad, 0],
          [0, 0],
          [0, 0]
        ]) as tf.Tensor4D // [B, L, Hkv, hd]
      }
    })
  )
  return { layers, keyMask }
}

/**
 * Stack two caches along the batch (rows of `a` first), left-padding the shorter one: how a continuous-batching
 * engine adds freshly prefilled requests to the running batch. Disposes both inputs' tensors.
 */
export const merge = (a: KvCache, b: KvCache): KvCache => {
  const L = Math.max(a.length, b.length)
  const pa = padTo(a, L)
  const pb = padTo(b, L)
  const layers = pa.layers.map((la, l) =>
    tf.tidy(() => ({
      keys: tf.concat([la.keys, pb.layers[l]!.keys], 0) as tf.Tensor4D, // [Ba + Bb, L, Hkv, hd]
      values: tf.concat([la.values, pb.layers[l]!.values], 0) as tf.Tensor4D // [Ba + Bb, L, Hkv, hd]
    }))
  )
  for (const p of [pa, pb]) {
    for (const c of p.layers) {
      c.keys.dispose()
      c.values.dispose()
    }
  }
  dispose(a) // (tensors padTo passed through are already disposed above: disposing twice is a no-op)
  dispose(b)
  const keyMask = new Uint8Array((a.batch + b.batch) * L)
  keyMask.set(pa.keyMask, 0)
  keyMask.set(pb.keyMask, a.batch * L)
  const nextPosition = new Int32Array(a.batch + b.batch)
  nextPosition.set(a.nextPosition, 0)
  nextPosition.set(b.nextPosition, a.batch)
  return { layers, keyMask, nextPosition, batch: a.batch + b.batch, length: L }
}

/** Drop leading key slots that are padding in every row (left after long rows finish). Disposes the old tensors. */
export const trim = (cache: KvCache): KvCache => {
  const L = cache.length
  let drop = 0
  while (drop < L - 1) {
    let allPad = true
    for (let b = 0; b < cache.batch && allPad; b++) if (cache.keyMask[b * L + drop]! > 0) allPad = false
    if (!allPad) break
    drop++
  }
  if (drop === 0) return cache
  const keep = L - drop
  const layers = cache.layers.map((c) =>
    tf.tidy(() => ({
      keys: tf.slice(c.keys, [0, drop, 0, 0], [-1, keep, -1, -1]) as tf.Tensor4D,
      values: tf.slice(c.values, [0, drop, 0, 0], [-1, keep, -1, -1]) as tf.Tensor4D
    }))
  )
  const keyMask = new Uint8Array(cache.batch * keep)
  for (let b = 0; b < cache.batch; b++) keyMask.set(cache.keyMask.subarray(b * L + drop, (b + 1) * L), b * keep)
  dispose(cache)
  return { layers, keyMask, nextPosition: cache.nextPosition, batch: cache.batch, length: keep }
}

/**
 * A copy of a one-row cache holding only its first `tokens` real tokens (leading padding dropped): the reusable part
 * of a cached prefix. The input stays valid.
 */
export const prefixOf = (cache: KvCache, tokens: number): KvCache => {
  if (cache.batch !== 1) throw new Error("KvCache.prefixOf: expects one row")
  let seen = 0
  let first = -1
  let end = 0
  for (let j = 0; j < cache.length && seen < tokens; j++) {
    if (cache.keyMask[j]! > 0) {
      if (first < 0) first = j
      seen++
      end = j + 1
    }
  }
  if (seen < tokens) throw new Error(`KvCache.prefixOf: the cache holds ${seen} tokens, asked for ${tokens}`)
  const length = end - first
  const layers = cache.layers.map((c) =>
    tf.tidy(() => ({
      keys: tf.slice(c.keys, [0, first, 0, 0], [-1, length, -1, -1]) as tf.Tensor4D,
      values: tf.slice(c.values, [0, first, 0, 0], [-1, length, -1, -1]) as tf.Tensor4D
    }))
  )
  return { layers, keyMask: cache.keyMask.slice(first, end), nextPosition: Int32Array.of(tokens), batch: 1, length }
}

/**
 * Append a ragged block of tokens per row (each non-empty; left-padded here, the padding masked out) and return the
 * logits after each row's last token: how a cached prefix is continued with the rest of a new prompt. Disposes the old
 * cache's tensors.
 */
export const append = async (
  model: Transformer.Transformer,
  view: WeightView.WeightView,
  cache: KvCache,
  suffixes: ReadonlyArray<ReadonlyArray<number>>
): Promise<Stepped> => {
  const B = cache.batch
  if (suffixes.length !== B || suffixes.some((s) => s.length === 0))
    throw new Error("KvCache.append: one non-empty block per row")
  const S = Math.max(...suffixes.map((s) => s.length))
  const L = cache.length + S
  const ids = new Int32Array(B * S)
  const positions = new Int32Array(B * S)
  const keyMask = new Uint8Array(B * L)
  suffixes.forEach((suffix, b) => {
    keyMask.set(cache.keyMask.subarray(b * cache.length, (b + 1) * cache.length), b * L)
    const pad = S - suffix.length
    suffix.forEach((id, t) => {
      ids[b * S + pad + t] = id
      positions[b * S + pad + t] = cache.nextPosition[b]! + t
      keyMask[b * L + cache.length + pad + t] = 1
    })
  })
  const out = tf.tidy(() => {
    const step = Decoder.step(model, view, {
      ids: tf.tensor2d(ids, [B, S], "int32"),
      keyMask,
      positions,
      past: cache.layers,
      pastLength: cache.length
    })
    return { hidden: step.hidden, keys: step.cache.map((c) => c.keys), values: step.cache.map((c) => c.values) }
  })
  dispose(cache)
  const logits = await lastLogits(view, out.hidden, B, S)
  return {
    cache: {
      layers: out.keys.map((keys, l) => ({ keys, values: out.values[l]! })),
      keyMask,
      nextPosition: cache.nextPosition.map((p, b) => p + suffixes[b]!.length),
      batch: B,
      length: L
    },
    logits
  }
}

/** Bytes of the cache's tokens (its L slots; spare slots a growing cache reserves are not counted). */
export const byteSize = (cache: KvCache): number =>
  cache.layers.reduce((n, c) => n + (4 * (c.keys.size + c.values.size) * cache.length) / c.keys.shape[1], 0)
