/**
 * A LoRA adapter (PEFT tensors, `Lora.ts`) as a llama.cpp GGUF LoRA adapter: the file `llama-cli --lora`, Ollama's
 * `ADAPTER` and node-llama-cpp's `createContext({ lora })` load over a base model exported by `GgufExport.ts`.
 * Checked against ggml-org/llama.cpp `src/llama-adapter.cpp` (`llama_adapter_lora_init_impl`, commit 0650ea8c05bc),
 * `src/llama-graph.cpp` (`build_lora_mm`) and `convert_lora_to_gguf.py` (commit 0b03adaa632b):
 *
 * - Metadata: `general.type = "adapter"`, `general.architecture` = the base model's (llama.cpp refuses another),
 *   `adapter.type = "lora"`, `adapter.lora.alpha` (float32). llama.cpp scales each pair by user scale · α / r, r read
 *   from lora_b's `ne[0]`: our α / r (an α of 0 would mean "scale 1" there, so α must be positive).
 * - Tensors `<base tensor name>.lora_a` and `.lora_b`, e.g. `blk.3.attn_q.weight.lora_a`; each pair must name a
 *   tensor of the base. Shapes as llama.cpp checks them: lora_a `ne = [in, r]` (PEFT's A [r, in]), lora_b
 *   `ne = [r, out]` (PEFT's B [out, r]): the PEFT tensors' bytes, unchanged.
 * - Llama: the base's q/k rows are permuted to llama.cpp's interleaved RoPE pairs (`GgufExport.permuteRope`); ΔW = B·A
 *   has the rows of B, so B's rows get the same permutation (the converter's `LoraTorchTensor.permute` does exactly
 *   this) and A stays as it is.
 * - No other tensors: the converter never adds `rope_freqs` to an adapter, and our adapters carry no norms.
 * - Types F32, F16, BF16, Q8_0 as for the base; a tensor whose rows are not whole Q8_0 blocks (lora_b's rows are r
 *   long) falls back to F16, as the converter does on a quantisation error.
 */
import * as fs from "node:fs/promises"
import type { AdapterWeights } from "../domain/WeightSnapshot.ts"
import * as Gguf from "./Gguf.ts"
import * as GgufExport from "./GgufExport.ts"
import type { TransformerConfig } from "./ModelConfig.ts"

export interface AdapterOptions {
  /** The base model's config: its architecture and the shapes each adapter pair must have. */
  readonly config: TransformerConfig
  /** PEFT tensors (`base_model.model.<module>.lora_A.weight` [r, in], `.lora_B.weight` [out, r]), rank, α. */
  readonly adapter: AdapterWeights
  readonly type: GgufExport.ExportType
  /** `general.name`; default "lora". */
  readonly name?: string
  /** Where the adapter came from (a file or directory), named in errors. */
  readonly source?: string
}

const peftPattern = /^base_model\.model\.(model\.layers\.(\d+)\.(?:self_attn|mlp)\.([a-z]+_proj))\.lora_([AB])\.weight$/

/** [in, out] of a layer's linear module, from the base config. */
const moduleShape = (c: TransformerConfig, proj: string): readonly [number, number] | undefined => {
  const q = c.numHeads * c.headDim
  const kv = c.numKvHeads * c.headDim
  const shapes: Record<string, readonly [number, number]> = {
    q_proj: [c.hiddenSize, q],
    k_proj: [c.hiddenSize, kv],
    v_proj: [c.hiddenSize, kv],
    o_proj: [q, c.hiddenSize],
    gate_proj: [c.hiddenSize, c.intermediateSize],
    up_proj: [c.hiddenSize, c.intermediateSize],
    down_proj: [c.intermediateSize, c.hiddenSize]
  }
  return shapes[proj]
}

const takeable = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"

/** The GGUF tensors (`<base name>.lora_a` / `.lora_b` pairs) of `adapter` over a base with `config`. */
export const adapterTensors = (options: AdapterOptions): Array<Gguf.Tensor> => {
  const { config: c, adapter, type } = options
  const from = options.source ?? "adapter"
  if (!(Number.isInteger(adapter.rank) && adapter.rank > 0) || !(adapter.alpha > 0) || !Number.isFinite(adapter.alpha))
    throw new Error(`${from}: r (${adapter.rank}) and lora_alpha (${adapter.alpha}) must be positive`)
  const pairs = new Map<string, { a?: number; b?: number; proj: string }>()
  adapter.names.forEach((name, i) => {
    const m = peftPattern.exec(name)
    if (m === null)
      throw new Error(
        `${from}: tensor ${name} is no LoRA pair on a decoder layer's linear module; llama.cpp adapters here take ` +
          `${takeable}: export the model merged instead (model export --format gguf --merge)`
      )
    const [, module, layer, proj, which] = m as unknown as [string, string, string, string, "A" | "B"]
    if (moduleShape(c, proj) === undefined || Number(layer) >= c.numLayers)
      throw new Error(
        `${from}: tensor ${name} targets ${module}, which the ${c.architecture} base (${c.numLayers} layers) has no ` +
          `adapter slot for (llama.cpp adapters here take ${takeable}): export the model merged instead (--merge)`
      )
    const pair = pairs.get(module) ?? { proj }
    pairs.set(module, which === "A" ? { ...pair, a: i } : { ...pair, b: i })
  })
  if (pairs.size === 0) throw new Error(`${from}: the adapter holds no lora_A / lora_B tensors`)
  const r = adapter.rank
  const out: Array<Gguf.Tensor> = []
  for (const [module, { a, b, proj }] of pairs) {
    if (a === undefined || b === undefined)
      throw new Error(`${from}: ${module} has lora_${a === undefined ? "A" : "B"}.weight missing: re-save the adapter`)
    const [inDim, outDim] = moduleShape(c, proj)!
    const shapeA = adapter.shapes[a]!
    const shapeB = adapter.shapes[b]!
    if (shapeA[0] !== r || shapeA[1] !== inDim || shapeB[0] !== outDim || shapeB[1] !== r)
      throw new Error(
        `${from}: ${module} is lora_A [${shapeA.join(", ")}] / lora_B [${shapeB.join(", ")}], the base takes ` +
          `[${r}, ${inDim}] / [${outDim}, ${r}] (r = ${r}): is --base the model this adapter was trained over?`
      )
    let dataB = adapter.data[b]!
    if (c.architecture === "llama" && proj === "q_proj") dataB = GgufExport.permuteRope(dataB, outDim, c.numHeads)
    if (c.architecture === "llama" && proj === "k_proj") dataB = GgufExport.permuteRope(dataB, outDim, c.numKvHeads)
    const base = GgufExport.ggufName(`${module}.weight`)
    const typed = (rowLength: number): Gguf.TensorType => (Gguf.fits(type, rowLength) ? type : "F16")
    out.push(
      { name: `${base}.lora_a`, shape: [r, inDim], type: typed(inDim), data: adapter.data[a]! },
      { name: `${base}.lora_b`, shape: [outDim, r], type: typed(r), data: dataB }
    )
  }
  return out
}

/** The adapter file's metadata: what llama.cpp checks before it reads a tensor. */
export const adapterMetadata = (options: AdapterOptions): Array<readonly [string, Gguf.Value]> => [
  ["general.architecture", Gguf.string(options.config.architecture)],
  ["general.type", Gguf.string("adapter")],
  ["general.name", Gguf.string(options.name ?? "lora")],
  ["general.file_type", Gguf.u32(GgufExport.fileType[options.type])],
  ["general.quantization_version", Gguf.u32(2)],
  ["adapter.type", Gguf.string("lora")],
  ["adapter.lora.alpha", Gguf.f32(options.adapter.alpha)]
]

/** The whole adapter file in memory (adapters are small: r · (in + out) values a module). */
export const encodeAdapter = (options: AdapterOptions): Uint8Array =>
  Gguf.encode(adapterMetadata(options), adapterTensors(options))

/**
 * Write the GGUF LoRA adapter at `file` (through `file.tmp` and a rename, so a reader never sees half a file);
 * returns its size in bytes. Throws, naming `options.source`, for an adapter llama.cpp could not apply to the base.
 */
export const writeAdapter = async (file: string, options: AdapterOptions): Promise<number> => {
  const bytes = encodeAdapter(options)
  const partial = `${file}.tmp`
  try {
    await fs.writeFile(partial, bytes)
    await fs.rename(partial, file)
  } catch (error) {
    await fs.rm(partial, { force: true }) // a full disk leaves nothing behind
    throw error
  }
  return bytes.byteLength
}
