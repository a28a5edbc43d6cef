/**
 * A Qwen3 / Qwen2 / Llama checkpoint as a llama.cpp GGUF file (Gguf.ts writes the format). Names, metadata keys and
 * conventions follow llama.cpp's `convert_hf_to_gguf.py` and `gguf-py/gguf/constants.py`:
 *
 * - Architecture `qwen3` / `qwen2` / `llama`; hyperparameters as `<arch>.block_count`, `.context_length`,
 *   `.embedding_length`, `.feed_forward_length`, `.attention.head_count(_kv)`, `.attention.key_length` /
 *   `.value_length` (head_dim), `.rope.dimension_count`, `.rope.freq_base`, `.attention.layer_norm_rms_epsilon`.
 * - Tensors `token_embd`, `output_norm`, `output` (absent when tied: llama.cpp then reads `token_embd`),
 *   `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up,
 *   ffn_down}` (+ `.bias` for q/k/v when the model has one).
 * - Llama only: llama.cpp rotates adjacent pairs (GPT-J style) where HF rotates halves (NeoX), so q/k rows are
 *   permuted per head as the converter's `LlamaModel.permute` does; Qwen runs NeoX RoPE in llama.cpp, unpermuted.
 *   Llama 3 RoPE scaling is the `rope_freqs.weight` tensor of per-frequency divisors the converter computes.
 * - 1-D tensors (norms, biases) stay F32, as the converter keeps them; a 2-D tensor whose rows are not whole Q8_0
 *   blocks falls back to F16 (the converter's fallback on a quantisation error).
 * - Tokenizer from the HF files: `tokenizer.ggml.model = "gpt2"` (byte-level BPE), `tokens` = the vocabulary by id
 *   (padded to the embedding's rows with `[PADk]`, type UNUSED), `token_type` NORMAL for the model's vocabulary,
 *   CONTROL for added tokens that are special or look it (`<|…|>`), USER_DEFINED for the others (`<tool_call>`:
 *   llama.cpp always matches them as one token and detokenises them as text, as our tokenizers do), `merges`
 *   (empty for our byte tokenizer, whose vocabulary is the 256 GPT-2 byte characters at their byte ids: every byte
 *   is one token, which is exactly llama.cpp's byte-level BPE with no merges), eos / pad / bos ids, and
 *   `add_bos_token = false` (rollouts are token ids in and out; nothing is prepended).
 *   `tokenizer.ggml.pre` selects llama.cpp's pre-tokenizer regex: `qwen2` for Qwen, `llama-bpe` for Llama 3, and
 *   `default` for a byte tokenizer (with no merges the split does not change the ids).
 */
import * as fs from "node:fs/promises"
import * as Gguf from "./Gguf.ts"
import type { TransformerConfig } from "./ModelConfig.ts"

export interface HfArray {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly data: Float32Array
}

/** The HF tokenizer files a checkpoint carries. */
export interface TokenizerFiles {
  readonly tokenizerJson: unknown
  readonly tokenizerConfig: unknown
  readonly chatTemplate?: string
}

/** Export tensor types: the type of every 2-D weight (1-D ones stay F32). */
export type ExportType = Gguf.TensorType

/** `general.file_type` (llama_ftype) of an export type. */
export const fileType: Record<ExportType, number> = { F32: 0, F16: 1, Q8_0: 7, BF16: 32 }

const hfLayer = /^model\.layers\.(\d+)\.(.+)$/
const layerNames: Record<string, string> = {
  "input_layernorm.weight": "attn_norm.weight",
  "self_attn.q_proj.weight": "attn_q.weight",
  "self_attn.q_proj.bias": "attn_q.bias",
  "self_attn.k_proj.weight": "attn_k.weight",
  "self_attn.k_proj.bias": "attn_k.bias",
  "self_attn.v_proj.weight": "attn_v.weight",
  "self_attn.v_proj.bias": "attn_v.bias",
  "self_attn.o_proj.weight": "attn_output.weight",
  "self_attn.q_norm.weight": "attn_q_norm.weight",
  "self_attn.k_norm.weight": "attn_k_norm.weight",
  "post_attention_layernorm.weight": "ffn_norm.weight",
  "mlp.gate_proj.weight": "ffn_gate.weight",
  "mlp.up_proj.weight": "ffn_up.weight",
  "mlp.down_proj.weight": "ffn_down.weight"
}

/** llama.cpp's name for a HF tensor name. */
export const ggufName = (hf: string): string => {
  if (hf === "model.embed_tokens.weight") return "token_embd.weight"
  if (hf === "model.norm.weight") return "output_norm.weight"
  if (hf === "lm_head.weight") return "output.weight"
  const m = hfLayer.exec(hf)
  const mapped = m === null ? undefined : layerNames[m[2]!]
  if (m === null || mapped === undefined) throw new Error(`no GGUF name for tensor ${hf}`)
  return `blk.${m[1]}.${mapped}`
}

/**
 * HF's q/k rows (per head: the first half of the rotary dims, then the second) reordered to llama.cpp's interleaved
 * pairs: rows viewed as [heads, 2, hd/2, …] → [heads, hd/2, 2, …] (the converter's `LlamaModel.permute`).
 */
export const permuteRope = (data: Float32Array, rows: number, heads: number): Float32Array => {
  const cols = data.length / rows
  const half = rows / heads / 2
  const out = new Float32Array(data.length)
  for (let h = 0; h < heads; h++) {
    for (let two = 0; two < 2; two++) {
      for (let i = 0; i < half; i++) {
        const from = (h * 2 * half + two * half + i) * cols
        const to = (h * 2 * half + i * 2 + two) * cols
        out.set(data.subarray(from, from + cols), to)
      }
    }
  }
  return out
}

/** Llama 3's per-frequency RoPE divisors (`rope_freqs.weight`), as the converter computes them. */
const ropeFreqs = (c: TransformerConfig): Float32Array | undefined => {
  const s = c.ropeScaling
  if (s === undefined) return undefined
  const lowWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor
  const highWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor
  return Float32Array.from({ length: c.headDim / 2 }, (_, i) => {
    const freq = 1 / c.ropeTheta ** ((2 * i) / c.headDim)
    const wavelen = (2 * Math.PI) / freq
    if (wavelen < highWavelen) return 1
    if (wavelen > lowWavelen) return s.factor
    const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor)
    return 1 / ((1 - smooth) / s.factor + smooth)
  })
}

/** The GGUF tensors of a model's HF arrays. */
export const tensors = (config: TransformerConfig, arrays: ReadonlyArray<HfArray>, type: ExportType) => {
  const out: Array<Gguf.Tensor> = arrays.map((a) => {
    let data = a.data
    if (config.architecture === "llama") {
      if (/\.q_proj\.(weight|bias)$/.test(a.name)) data = permuteRope(data, a.shape[0]!, config.numHeads)
      if (/\.k_proj\.(weight|bias)$/.test(a.name)) data = permuteRope(data, a.shape[0]!, config.numKvHeads)
    }
    const wanted: Gguf.TensorType = a.shape.length === 1 ? "F32" : type
    const rowLength = a.shape[a.shape.length - 1]!
    return {
      name: ggufName(a.name),
      shape: a.shape,
      type: Gguf.fits(wanted, rowLength) ? wanted : "F16",
      data
    }
  })
  const freqs = ropeFreqs(config)
  if (freqs !== undefined) out.push({ name: "rope_freqs.weight", shape: [freqs.length], type: "F32", data: freqs })
  return out
}

/** The architecture's hyperparameters as llama.cpp reads them. */
export const modelMetadata = (c: TransformerConfig, type: ExportType, name: string) => {
  const a = c.architecture
  const entries: Array<readonly [string, Gguf.Value]> = [
    ["general.architecture", Gguf.string(a)],
    ["general.name", Gguf.string(name)],
    ["general.file_type", Gguf.u32(fileType[type])],
    ["general.quantization_version", Gguf.u32(2)],
    [`${a}.vocab_size`, Gguf.u32(c.vocabSize)],
    [`${a}.context_length`, Gguf.u32(c.maxPositionEmbeddings)],
    [`${a}.embedding_length`, Gguf.u32(c.hiddenSize)],
    [`${a}.block_count`, Gguf.u32(c.numLayers)],
    [`${a}.feed_forward_length`, Gguf.u32(c.intermediateSize)],
    [`${a}.attention.head_count`, Gguf.u32(c.numHeads)],
    [`${a}.attention.head_count_kv`, Gguf.u32(c.numKvHeads)],
    [`${a}.attention.key_length`, Gguf.u32(c.headDim)],
    [`${a}.attention.value_length`, Gguf.u32(c.headDim)],
    [`${a}.rope.dimension_count`, Gguf.u32(c.headDim)],
    [`${a}.rope.freq_base`, Gguf.f32(c.ropeTheta)],
    [`${a}.attention.layer_norm_rms_epsilon`, Gguf.f32(c.rmsNormEps)]
  ]
  return entries
}

// llama_token_type
const tokenType = { normal: 1, control: 3, userDefined: 4, unused: 5 } as const

interface AddedTokenJson {
  readonly id: number
  readonly content: string
  readonly special?: boolean
}

const looksSpecial = (token: string) => token.startsWith("<|") && token.endsWith("|>")

/** `tokenizer.*` metadata from HF tokenizer files, for a model with `vocabSize` embedding rows. */
export const tokenizerMetadata = (files: TokenizerFiles, config: TransformerConfig, isByteTokenizer: boolean) => {
  const json = files.tokenizerJson as {
    readonly model?: { readonly type?: string; readonly vocab?: Record<string, number>; readonly merges?: unknown }
    readonly added_tokens?: ReadonlyArray<AddedTokenJson>
  }
  if (json.model?.type !== "BPE" || json.model.vocab === undefined) {
    throw new Error(`tokenizer.json: only byte-level BPE tokenizers export to GGUF (got ${json.model?.type})`)
  }
  const added = json.added_tokens ?? []
  // a loop, not Math.max(...ids): a real vocabulary (151 K ids) overflows the call stack as spread arguments
  let size = config.vocabSize
  for (const id of Object.values(json.model.vocab)) size = Math.max(size, id + 1)
  for (const t of added) size = Math.max(size, t.id + 1)
  if (size > config.vocabSize) {
    throw new Error(`tokenizer has ${size} tokens, more than the model's ${config.vocabSize} embedding rows`)
  }
  const tokens: Array<string> = Array.from({ length: size }, (_, i) => `[PAD${i}]`)
  const types: Array<number> = Array.from({ length: size }, () => tokenType.unused)
  for (const [token, id] of Object.entries(json.model.vocab)) {
    tokens[id] = token
    types[id] = tokenType.normal
  }
  for (const t of added) {
    tokens[t.id] = t.content
    types[t.id] = t.special === true || looksSpecial(t.content) ? tokenType.control : tokenType.userDefined
  }
  const merges = (Array.isArray(json.model.merges) ? json.model.merges : []).map((m: unknown) =>
    Array.isArray(m) ? m.join(" ") : String(m)
  )
  const tc = (files.tokenizerConfig ?? {}) as Record<string, unknown>
  const idOf = (field: string): number | undefined => {
    const v = tc[field]
    const content = typeof v === "string" ? v : (v as { content?: unknown } | null)?.content
    if (typeof content !== "string") return undefined
    const i = tokens.indexOf(content)
    return i < 0 ? undefined : i
  }
  const eos = idOf("eos_token")
  const pad = idOf("pad_token")
  const endOfText = tokens.indexOf("<|endoftext|>")
  const bos = idOf("bos_token") ?? (endOfText >= 0 ? endOfText : undefined)
  const template = files.chatTemplate ?? (typeof tc["chat_template"] === "string" ? tc["chat_template"] : undefined)
  const pre = isByteTokenizer ? "default" : config.architecture === "llama" ? "llama-bpe" : "qwen2"
  const entries: Array<readonly [string, Gguf.Value]> = [
    ["tokenizer.ggml.model", Gguf.string("gpt2")],
    ["tokenizer.ggml.pre", Gguf.string(pre)],
    ["tokenizer.ggml.tokens", Gguf.strings(tokens)],
    ["tokenizer.ggml.token_type", Gguf.i32s(types)],
    ["tokenizer.ggml.merges", Gguf.strings(merges)],
    ...(eos === undefined ? [] : [["tokenizer.ggml.eos_token_id", Gguf.u32(eos)] as const]),
    ...(pad === undefined ? [] : [["tokenizer.ggml.padding_token_id", Gguf.u32(pad)] as const]),
    ...(bos === undefined ? [] : [["tokenizer.ggml.bos_token_id", Gguf.u32(bos)] as const]),
    ["tokenizer.ggml.add_bos_token", Gguf.bool(false)],
    ["tokenizer.ggml.add_eos_token", Gguf.bool(false)],
    ...(template === undefined ? [] : [["tokenizer.chat_template", Gguf.string(template)] as const])
  ]
  return entries
}

/** A byte tokenizer's tokenizer.json: byte-level BPE with no merges and the 256 byte characters as its vocabulary. */
const isByteVocab = (files: TokenizerFiles): boolean => {
  const model = (files.tokenizerJson as { model?: { vocab?: object; merges?: unknown } }).model
  return (
    model?.vocab !== undefined &&
    Object.keys(model.vocab).length === 256 &&
    Array.isArray(model.merges) &&
    model.merges.length === 0
  )
}

export interface WriteOptions {
  readonly config: TransformerConfig
  readonly arrays: ReadonlyArray<HfArray>
  readonly tokenizer: TokenizerFiles
  readonly type: ExportType
  readonly name?: string
}

/**
 * Write the GGUF file at `file`, tensor by tensor, through `file.tmp` and a rename (a reader never sees half a file, and
 * a write that fails, a full disk say, leaves nothing behind); returns its size in bytes.
 */
export const write = async (file: string, options: WriteOptions): Promise<number> => {
  const metadata = [
    ...modelMetadata(options.config, options.type, options.name ?? options.config.architecture),
    ...tokenizerMetadata(options.tokenizer, options.config, isByteVocab(options.tokenizer))
  ]
  const ts = tensors(options.config, options.arrays, options.type)
  const head = Gguf.header(metadata, ts)
  const partial = `${file}.tmp`
  const handle = await fs.open(partial, "w")
  let size = 0
  try {
    try {
      await handle.write(head.bytes)
      size += head.bytes.length
      for (const t of ts) {
        const bytes = Gguf.tensorBytes(t, head.alignment)
        await handle.write(bytes)
        size += bytes.length
      }
    } finally {
      await handle.close()
    }
    await fs.rename(partial, file)
  } catch (error) {
    await fs.rm(partial, { force: true })
    throw error
  }
  return size
}
