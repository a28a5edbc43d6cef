/**
 * The safetensors format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of JSON
 * `{ name: { dtype, shape, data_offsets: [begin, end] }, "__metadata__": {...} }` (offsets relative to the end of the
 * header), then the raw little-endian tensor bytes. Pure: bytes in, bytes out (file I/O lives in Checkpoint.ts).
 *
 * Reading converts F32, BF16, F16 (and F64) to Float32Array (whole files with `decode`, or tensor by tensor from
 * their header entries with `parseHeader` + `widenInto`, which Checkpoint.ts streams from disk); writing emits F32 or BF16 (round-to-nearest-even, as
 * PyTorch's `.to(torch.bfloat16)`). Written headers are padded with spaces to 8 bytes and carry
 * `{"format": "pt"}` metadata, which HF transformers requires to load the file.
 */

export type ReadDType = "F32" | "BF16" | "F16" | "F64"
export type WriteDType = "F32" | "BF16"

export interface Tensor {
  readonly shape: ReadonlyArray<number>
  readonly data: Float32Array
  readonly dtype: ReadDType // as stored in the file
}

export interface NamedTensor {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly data: Float32Array
}

export class SafetensorsError extends Error {
  override readonly name = "SafetensorsError"
}

const bytesPer: Record<ReadDType, number> = { F32: 4, BF16: 2, F16: 2, F64: 8 }

/** IEEE half → float. */
const halfToFloat = (h: number): number => {
  const sign = h & 0x8000 ? -1 : 1
  const exp = (h >> 10) & 0x1f
  const frac = h & 0x3ff
  if (exp === 0) return sign * 2 ** -14 * (frac / 1024)
  if (exp === 0x1f) return frac === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN
  return sign * 2 ** (exp - 15) * (1 + frac / 1024)
}

const toFloat32 = (bytes: Uint8Array, dtype: ReadDType, count: number): Float32Array => {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const out = new Float32Array(count)
  switch (dtype) {
    case "F32":
      return new Float32Array(new Uint8Array(bytes).buffer, 0, count) // copy to an aligned buffer (Buffer#slice shares)
    case "F64":
      for (let i = 0; i < count; i++) out[i] = view.getFloat64(i * 8, true)
      break
    case "BF16": {
      const bits = new Uint32Array(out.buffer)
      for (let i = 0; i < count; i++) bits[i] = view.getUint16(i * 2, true) << 16
      break
    }
    case "F16":
      for (let i = 0; i < count; i++) out[i] = halfToFloat(view.getUint16(i * 2, true))
      break
  }
  return out
}

/** float32 → bfloat16 bits, round to nearest even; NaN stays NaN. */
export const floatToBf16 = (data: Float32Array): Uint16Array => {
  const bits = new Uint32Array(data.buffer, data.byteOffset, data.length)
  const out = new Uint16Array(data.length)
  for (let i = 0; i < data.length; i++) {
    const u = bits[i]!
    if ((u & 0x7f800000) === 0x7f800000 && (u & 0x007fffff) !== 0) {
      out[i] = (u >>> 16) | 0x40 // quiet NaN
    } else {
      out[i] = ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff
    }
  }
  return out
}

export interface Decoded {
  readonly tensors: ReadonlyMap<string, Tensor>
  readonly metadata: Readonly<Record<string, string>>
}

/** One tensor's entry in a safetensors header: where its bytes are, relative to the start of the file. */
export interface Entry {
  readonly name: string
  readonly dtype: ReadDType
  readonly shape: ReadonlyArray<number>
  readonly begin: number // byte offset in the file
  readonly end: number
}

/** Bytes per element of each dtype read. */
export const elementBytes = (dtype: ReadDType): number => bytesPer[dtype]

/**
 * The entries of a safetensors header (the JSON after the 8-byte length), checked against the file's size: each
 * tensor's byte range must match its dtype and shape and lie inside the file. Throws `SafetensorsError`.
 */
export const parseHeader = (
  headerBytes: Uint8Array,
  fileBytes: number,
  file = "<bytes>"
): { readonly entries: ReadonlyArray<Entry>; readonly metadata: Readonly<Record<string, string>> } => {
  let header: Record<string, unknown>
  try {
    header = JSON.parse(new TextDecoder().decode(headerBytes)) as Record<string, unknown>
  } catch (cause) {
    throw new SafetensorsError(`${file}: header is not JSON (${String(cause)})`)
  }
  const dataStart = 8 + headerBytes.byteLength
  const entries: Array<Entry> = []
  let metadata: Record<string, string> = {}
  for (const [name, entry] of Object.entries(header)) {
    if (name === "__metadata__") {
      metadata = (entry ?? {}) as Record<string, string>
      continue
    }
    const { dtype, shape, data_offsets } = entry as {
      dtype: string
      shape: Array<number>
      data_offsets: [number, number]
    }
    if (!(dtype in bytesPer)) {
      throw new SafetensorsError(`${file}: tensor ${name} has dtype ${dtype}; supported: F32, BF16, F16, F64`)
    }
    const d = dtype as ReadDType
    const count = shape.reduce((a, b) => a * b, 1)
    const [begin, end] = data_offsets
    if (end - begin !== count * bytesPer[d] || dataStart + end > fileBytes) {
      throw new SafetensorsError(
        `${file}: tensor ${name} has offsets [${begin}, ${end}] inconsistent with ${dtype}[${shape.join(", ")}]`
      )
    }
    entries.push({ name, dtype: d, shape, begin: dataStart + begin, end: dataStart + end })
  }
  return { entries, metadata }
}

/** The header length a safetensors file starts with, checked against the file's size. */
export const headerLength = (first8: Uint8Array, fileBytes: number, file = "<bytes>"): number => {
  if (first8.byteLength < 8 || fileBytes < 8) throw new SafetensorsError(`${file}: too short for a safetensors header`)
  const length = Number(new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true))
  if (8 + length > fileBytes) throw new SafetensorsError(`${file}: header length ${length} exceeds the file`)
  return length
}

/**
 * Widen `count` elements of `dtype` from `bytes` into `out` (float32) starting at element `at`; with `transpose`
 * (a `[rows, cols]` tensor whose rows `firstRow …` these bytes are), write them at their transposed places in
 * `out` `[cols, rows]`. Reading a tensor in blocks of whole rows through this keeps one copy of it in memory.
 */
export const widenInto = (
  bytes: Uint8Array,
  dtype: ReadDType,
  out: Float32Array,
  layout: { readonly at: number } | { readonly firstRow: number; readonly rows: number; readonly cols: number }
): void => {
  const count = bytes.byteLength / bytesPer[dtype]
  const block = toFloat32(bytes, dtype, count)
  if ("at" in layout) {
    out.set(block, layout.at)
    return
  }
  const { firstRow, rows, cols } = layout
  const blockRows = count / cols
  for (let c0 = 0; c0 < cols; c0 += 64) {
    const c1 = Math.min(cols, c0 + 64)
    for (let r = 0; r < blockRows; r++) {
      const src = r * cols
      for (let c = c0; c < c1; c++) out[c * rows + firstRow + r] = block[src + c]!
    }
  }
}

/** Parse a safetensors file. Throws `SafetensorsError` on a malformed header or an unsupported dtype. */
export const decode = (bytes: Uint8Array, file = "<bytes>"): Decoded => {
  const length = headerLength(bytes, bytes.byteLength, file)
  const { entries, metadata } = parseHeader(bytes.subarray(8, 8 + length), bytes.byteLength, file)
  const tensors = new Map<string, Tensor>()
  for (const e of entries) {
    const count = e.shape.reduce((a, b) => a * b, 1)
    tensors.set(e.name, {
      shape: e.shape,
      dtype: e.dtype,
      data: toFloat32(bytes.subarray(e.begin, e.end), e.dtype, count)
    })
  }
  return { tensors, metadata }
}

/** Serialise tensors (in the given order) as one safetensors file. */
export const encode = (
  tensors: ReadonlyArray<NamedTensor>,
  dtype: WriteDType = "F32",
  metadata: Readonly<Record<string, string>> = { format: "pt" }
): Uint8Array => {
  const width = dtype === "F32" ? 4 : 2
  const header: Record<string, unknown> = { __metadata__: metadata }
  let offset = 0
  for (const t of tensors) {
    const count = t.shape.reduce((a, b) => a * b, 1)
    if (count !== t.data.length)
      throw new SafetensorsError(`tensor ${t.name}: ${t.data.length} values for shape [${t.shape.join(", ")}]`)
    header[t.name] = { dtype, shape: [...t.shape], data_offsets: [offset, offset + count * width] }
    offset += count * width
  }
  let json = JSON.stringify(header)
  const encoder = new TextEncoder()
  const headerBytesRaw = encoder.encode(json).byteLength
  json += " ".repeat((8 - ((8 + headerBytesRaw) % 8)) % 8) // data starts 8-aligned
  const headerBytes = encoder.encode(json)
  const out = new Uint8Array(8 + headerBytes.byteLength + offset)
  new DataView(out.buffer).setBigUint64(0, BigInt(headerBytes.byteLength), true)
  out.set(headerBytes, 8)
  let at = 8 + headerBytes.byteLength
  for (const t of tensors) {
    const raw = dtype === "F32" ? new Float32Array(t.data) : floatToBf16(t.data) // copies: little-endian host
    const b = new Uint8Array(raw.buffer, raw.byteOffset, raw.byteLength)
    out.set(b, at)
    at += b.byteLength
  }
  return out
}
