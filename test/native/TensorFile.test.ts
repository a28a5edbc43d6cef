/**
 * The addon's checkpoint reader (src/native/TensorFile.ts) against the JS reader (Checkpoint.jsReader): the same
 * float32 values, bit for bit (a NaN may differ in payload: JS reads a float32 through a number), for F32, BF16 and F16
 * tensors, as stored and transposed, at shapes off its 64 × 64 tiles and at one that takes two 16 MB read blocks, read
 * in an order that grows and reuses its block buffer.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as NativeKernels from "../../src/native/NativeKernels.ts"
import * as TensorFile from "../../src/native/TensorFile.ts"

const available = NativeKernels.status().available

/** Raw bit patterns: every exponent and mantissa, NaNs and infinities included. */
const patterns = (n: number, bytes: 2 | 4, seed: number): Uint8Array => {
  const out = new Uint8Array(n * bytes)
  let s = seed
  for (let i = 0; i < out.length; i++) {
    s = (s * 1103515245 + 12345) >>> 0
    out[i] = s >>> 24
  }
  return out
}

/** A safetensors file holding `tensors` (name, dtype, shape, raw bytes) in order. */
const writeSafetensors = (
  file: string,
  tensors: ReadonlyArray<{ name: string; dtype: "F32" | "BF16" | "F16"; shape: [number, number]; data: Uint8Array }>
) => {
  const header: Record<string, unknown> = {}
  let offset = 0
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.data.length] }
    offset += t.data.length
  }
  const json = Buffer.from(JSON.stringify(header))
  const length = Buffer.alloc(8)
  length.writeBigUInt64LE(BigInt(json.length))
  fs.writeFileSync(file, Buffer.concat([length, json, ...tensors.map((t) => Buffer.from(t.data))]))
}

describe.skipIf(!available)("TensorFile (native checkpoint reader)", () => {
  it("reads F32, BF16 and F16 tensors bit for bit as the JS reader does, as stored and transposed", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tensor-file-"))
    try {
      const shapes: Array<[number, number]> = [
        [3, 5],
        [67, 133],
        [4100, 2049] // BF16: 16.8 MB, two read blocks
      ]
      const tensors = shapes.flatMap((shape, i) =>
        (["F32", "BF16", "F16"] as const)
          .filter((dtype) => i < 2 || dtype === "BF16")
          .map((dtype) => ({
            name: `t${i}.${dtype}`,
            dtype,
            shape,
            data: patterns(shape[0] * shape[1], dtype === "F32" ? 4 : 2, 7 * i + dtype.length)
          }))
      )
      writeSafetensors(path.join(dir, "model.safetensors"), tensors)
      const located = await Checkpoint.readEntries(dir)
      const native = TensorFile.reader()!
      for (const t of tensors) {
        for (const transpose of [false, true]) {
          const at = located.get(t.name)!
          const [ours, theirs] = [new Float32Array(t.shape[0] * t.shape[1]), new Float32Array(t.shape[0] * t.shape[1])]
          await native(at, ours, transpose)
          await Checkpoint.jsReader(at, theirs, transpose)
          const [a, b] = [new Uint32Array(ours.buffer), new Uint32Array(theirs.buffer)]
          const first = a.findIndex((x, i) => x !== b[i] && !(Number.isNaN(ours[i]) && Number.isNaN(theirs[i])))
          assert.strictEqual(first, -1, `${t.name} ${transpose ? "transposed" : "as stored"}: element ${first}`)
        }
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })
})
