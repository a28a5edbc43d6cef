/**
 * Checkpoint tensors read by the addon (`loadTensor`): blocks of rows read with pread and widened from BF16/F16 (and
 * transposed) by the thread pool straight into the model's array. Same result as Checkpoint.jsReader, several times
 * faster: the widening and the transpose are most of a large checkpoint's load time in JS.
 */
import * as Checkpoint from "../model/Checkpoint.ts"
import * as Addon from "./Addon.ts"

const dtypeCode = { F32: 0, BF16: 1, F16: 2 } as const

/** The native reader, or undefined when the addon is unavailable (Checkpoint.load then reads in JS). */
export const reader = (): Checkpoint.TensorReader | undefined => {
  const kernels = Addon.load().kernels
  if (kernels === undefined) return undefined
  return async (at, out, transpose) => {
    const { entry, file } = at
    const dtype = entry.dtype === "F64" ? undefined : dtypeCode[entry.dtype]
    const [rows, cols] = entry.shape.length === 2 ? [entry.shape[0]!, entry.shape[1]!] : [1, out.length]
    if (dtype === undefined || (transpose && entry.shape.length !== 2)) return Checkpoint.jsReader(at, out, transpose)
    kernels.loadTensor({ path: file, offset: entry.begin, dtype, rows, cols, transpose, out })
  }
}

/** `Checkpoint.load` with the native reader when there is one. */
export const load = (dir: string, options: Pick<Checkpoint.LoadOptions, "store"> = {}): Promise<Checkpoint.Loaded> => {
  const native = reader()
  return Checkpoint.load(dir, native === undefined ? options : { ...options, reader: native })
}
