/**
 * A GGUF writer: the single-file model format of ggml / llama.cpp, version 3
 * (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, "GGUF v3"). Layout, all little-endian:
 *
 *   header   magic "GGUF" · version u32 = 3 · tensor_count u64 · metadata_kv_count u64
 *   metadata kv_count × (key: string, value_type u32, value)          string = len u64 + UTF-8 bytes
 *   infos    tensor_count × (name: string, n_dims u32, ne u64[n_dims], ggml_type u32, offset u64)
 *   padding  0x00 to a multiple of `general.alignment` (32 unless the metadata says otherwise)
 *   data     each tensor at its offset (relative to the data start, a multiple of the alignment), padded
 *
 * `ne` lists dimensions fastest-varying first, the reverse of a row-major (numpy / HF) shape: a HF weight
 * `[out, in]` is written `ne = [in, out]` with the same bytes.
 *
 * Tensor types written (`ggml_type` numbers from the spec): F32 (0), F16 (1), Q8_0 (8) and BF16 (30). Q8_0 is
 * ggml's reference quantisation (`quantize_row_q8_0_ref`): blocks of 32 values along a row, each stored as an F16
 * scale d = max|x| / 127 and 32 int8 q = round(x / d) (half away from zero), 34 bytes a block; rows whose length
 * is not a multiple of 32 cannot be Q8_0.
 */

export type TensorType = "F32" | "F16" | "BF16" | "Q8_0"

const ggmlType: Record<TensorType, number> = { F32: 0, F16: 1, Q8_0: 8, BF16: 30 }

/** The GGUF version this writer implements. */
export const version = 3
export const defaultAlignment = 32
export const q8BlockSize = 32

/** A metadata value, with its GGUF value type. */
export type Value =
  | { readonly type: "u32"; readonly value: number }
  | { readonly type: "i32"; readonly value: number }
  | { readonly type: "f32"; readonly value: number }
  | { readonly type: "bool"; readonly value: boolean }
  | { readonly type: "string"; readonly value: string }
  | { readonly type: "strings"; readonly value: ReadonlyArray<string> }
  | { readonly type: "i32s"; readonly value: ReadonlyArray<number> }

export const u32 = (value: number): Value => ({ type: "u32", value })
export const i32 = (value: number): Value => ({ type: "i32", value })
export const f32 = (value: number): Value => ({ type: "f32", value })
export const bool = (value: boolean): Value => ({ type: "bool", value })
export const string = (value: string): Value => ({ type: "string", value })
export const strings = (value: ReadonlyArray<string>): Value => ({ type: "strings", value })
export const i32s = (value: ReadonlyArray<number>): Value => ({ type: "i32s", value })

const valueType = { u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9 } as const

export interface Tensor {
  readonly name: string
  readonly shape: ReadonlyArray<number> // row-major, e.g. HF [out, in]
  readonly type: TensorType
  readonly data: Float32Array
}

/** Bytes of one tensor of `type` with `count` values (Q8_0: count a multiple of 32). */
export const byteSize = (type: TensorType, count: number): number =>
  type === "F32" ? count * 4 : type === "Q8_0" ? (count / q8BlockSize) * 34 : count * 2

/** True when `type` can hold a tensor whose rows are `rowLength` long (Q8_0 needs whole blocks). */
export const fits = (type: TensorType, rowLength: number): boolean => type !== "Q8_0" || rowLength % q8BlockSize === 0

/** A growable little-endian byte buffer. */
class Writer {
  private buffer = new Uint8Array(1 << 16)
  private view = new DataView(this.buffer.buffer)
  length = 0

  private reserve(n: number): void {
    if (this.length + n <= this.buffer.length) return
    let size = this.buffer.length * 2
    while (size < this.length + n) size *= 2
    const next = new Uint8Array(size)
    next.set(this.buffer.subarray(0, this.length))
    this.buffer = next
    this.view = new DataView(next.buffer)
  }
  u32(v: number): void {
    this.reserve(4)
    this.view.setUint32(this.length, v, true)
    this.length += 4
  }
  i32(v: number): void {
    this.reserve(4)
    this.view.setInt32(this.length, v, true)
    this.length += 4
  }
  u64(v: number): void {
    this.reserve(8)
    this.view.setBigUint64(this.length, BigInt(v), true)
    this.length += 8
  }
  f32(v: number): void {
    this.reserve(4)
    this.view.setFloat32(this.length, v, true)
    this.length += 4
  }
  u8(v: number): void {
    this.reserve(1)
    this.buffer[this.length++] = v
  }
  bytes(b: Uint8Array): void {
    this.reserve(b.length)
    this.buffer.set(b, this.length)
    this.length += b.length
  }
  string(s: string): void {
    const b = utf8.encode(s)
    this.u64(b.length)
    this.bytes(b)
  }
  pad(alignment: number): void {
    const n = (alignment - (this.length % alignment)) % alignment
    this.reserve(n)
    this.buffer.fill(0, this.length, this.length + n)
    this.length += n
  }
  result(): Uint8Array {
    return this.buffer.subarray(0, this.length)
  }
}
const utf8 = new TextEncoder()

const writeValue = (w: Writer, value: Value): void => {
  switch (value.type) {
    case "u32":
      w.u32(value.value)
      break
    case "i32":
      w.i32(value.value)
      break
    case "f32":
      w.f32(value.value)
      break
    case "bool":
      w.u8(value.value ? 1 : 0)
      break
    case "string":
      w.string(value.value)
      break
    case "strings":
      w.u32(valueType.string)
      w.u64(value.value.length)
      for (const s of value.value) w.string(s)
      break
    case "i32s":
      w.u32(valueType.i32)
      w.u64(value.value.length)
      for (const v of value.value) w.i32(v)
      break
  }
}

const typeOf = (value: Value): number =>
  value.type === "strings" || value.type === "i32s" ? valueType.array : valueType[value.type]

/**
 * The file's header, metadata and tensor infos, padded to the alignment: the bytes before the tensor data. Tensor
 * offsets are laid out in the given order.
 */
export const header = (metadata: ReadonlyArray<readonly [string, Value]>, tensors: ReadonlyArray<Tensor>) => {
  const alignmentEntry = metadata.find(([key]) => key === "general.alignment")
  const alignment = alignmentEntry === undefined ? defaultAlignment : Number(alignmentEntry[1].value)
  const w = new Writer()
  w.bytes(utf8.encode("GGUF"))
  w.u32(version)
  w.u64(tensors.length)
  w.u64(metadata.length)
  for (const [key, value] of metadata) {
    w.string(key)
    w.u32(typeOf(value))
    writeValue(w, value)
  }
  let offset = 0
  const offsets: Array<number> = []
  for (const t of tensors) {
    const rowLength = t.shape[t.shape.length - 1] ?? 1
    if (!fits(t.type, rowLength)) throw new Error(`${t.name}: rows of ${rowLength} cannot be ${t.type}`)
    w.string(t.name)
    w.u32(t.shape.length)
    for (const d of [...t.shape].reverse()) w.u64(d)
    w.u32(ggmlType[t.type])
    w.u64(offset)
    offsets.push(offset)
    offset += Math.ceil(byteSize(t.type, t.data.length) / alignment) * alignment
  }
  w.pad(alignment)
  return { bytes: w.result(), alignment, offsets }
}

/** One tensor's data in its type, zero-padded to the alignment. */
export const tensorBytes = (t: Tensor, alignment: number): Uint8Array => {
  const size = byteSize(t.type, t.data.length)
  const out = new Uint8Array(Math.ceil(size / alignment) * alignment)
  const view = new DataView(out.buffer)
  switch (t.type) {
    case "F32":
      for (let i = 0; i < t.data.length; i++) view.setFloat32(i * 4, t.data[i]!, true)
      break
    case "F16":
      for (let i = 0; i < t.data.length; i++) view.setUint16(i * 2, toF16(t.data[i]!), true)
      break
    case "BF16":
      for (let i = 0; i < t.data.length; i++) view.setUint16(i * 2, toBf16(t.data[i]!), true)
      break
    case "Q8_0":
      quantizeQ8(t.data, view)
      break
  }
  return out
}

/** The whole file in memory (small models and tests; `GgufExport` streams tensors to disk instead). */
export const encode = (metadata: ReadonlyArray<readonly [string, Value]>, tensors: ReadonlyArray<Tensor>) => {
  const head = header(metadata, tensors)
  const parts = [head.bytes, ...tensors.map((t) => tensorBytes(t, head.alignment))]
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const p of parts) {
    out.set(p, at)
    at += p.length
  }
  return out
}

const f32Bits = new DataView(new ArrayBuffer(4))

/** float32 → bfloat16 bits, round to nearest even (NaN stays a quiet NaN). */
export const toBf16 = (x: number): number => {
  f32Bits.setFloat32(0, x)
  const bits = f32Bits.getUint32(0)
  if ((bits & 0x7fffffff) > 0x7f800000) return ((bits >>> 16) | 0x40) & 0xffff
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff
}

/** float32 → IEEE half bits, round to nearest even; overflow → ±inf, underflow → subnormals / ±0. */
export const toF16 = (x: number): number => {
  f32Bits.setFloat32(0, x)
  const bits = f32Bits.getUint32(0)
  const sign = (bits >>> 16) & 0x8000
  const exp = (bits >>> 23) & 0xff
  let mant = bits & 0x7fffff
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0)
  let e = exp - 127 + 15
  if (e >= 0x1f) return sign | 0x7c00
  if (e <= 0) {
    if (e < -10) return sign
    mant |= 0x800000
    const shift = 14 - e
    const half = 1 << (shift - 1)
    const rest = mant & ((1 << shift) - 1)
    let m = mant >>> shift
    if (rest > half || (rest === half && (m & 1) === 1)) m++
    return sign | m
  }
  const rest = mant & 0x1fff
  let m = mant >>> 13
  if (rest > 0x1000 || (rest === 0x1000 && (m & 1) === 1)) {
    m++
    if (m === 0x400) {
      m = 0
      e++
      if (e >= 0x1f) return sign | 0x7c00
    }
  }
  return sign | (e << 10) | m
}

/** IEEE half bits → number. */
export const fromF16 = (h: number): number => {
  const sign = h & 0x8000 ? -1 : 1
  const exp = (h >>> 10) & 0x1f
  const mant = h & 0x3ff
  if (exp === 0) return sign * mant * 2 ** -24
  if (exp === 0x1f) return mant === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN
  return sign * (1 + mant / 1024) * 2 ** (exp - 15)
}

/** ggml's `quantize_row_q8_0_ref` over `x` (length a multiple of 32), written into `out`. */
const quantizeQ8 = (x: Float32Array, out: DataView): void => {
  for (let block = 0; block < x.length / q8BlockSize; block++) {
    const base = block * q8BlockSize
    let amax = 0
    for (let j = 0; j < q8BlockSize; j++) amax = Math.max(amax, Math.abs(x[base + j]!))
    const d = Math.fround(amax / 127)
    const id = d !== 0 ? Math.fround(1 / d) : 0
    const at = block * 34
    out.setUint16(at, toF16(d), true)
    for (let j = 0; j < q8BlockSize; j++) {
      const v = Math.fround(x[base + j]! * id)
      out.setInt8(at + 2 + j, Math.sign(v) * Math.round(Math.abs(v))) // roundf: half away from zero
    }
  }
}

/** Dequantise Q8_0 blocks (what llama.cpp computes with): for tests and for the mismatch a quantised export makes. */
export const dequantizeQ8 = (bytes: Uint8Array, count: number): Float32Array => {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const out = new Float32Array(count)
  for (let block = 0; block < count / q8BlockSize; block++) {
    const d = fromF16(view.getUint16(block * 34, true))
    for (let j = 0; j < q8BlockSize; j++) out[block * q8BlockSize + j] = d * view.getInt8(block * 34 + 2 + j)
  }
  return out
}
