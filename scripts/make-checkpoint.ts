/**
 * A random-init HF checkpoint with a real model's exact config (no model hub needed): `config.json` as the model
 * publishes it and BF16 `model.safetensors` (sharded above 4 GiB, with `model.safetensors.index.json`), for checks
 * and benchmarks at real size. Weights: N(0, 0.02²) for matrices, ones for norms, zeros for biases (HF's init).
 *
 *   node scripts/make-checkpoint.ts --preset PRESET --out DIR [--seed 0] [--layers N]
 *
 * Presets: qwen3-0.6b, qwen3-1.7b, qwen3-4b (Qwen3ForCausalLM), qwen2.5-1.5b (Qwen2ForCausalLM: q/k/v biases, no
 * q/k norm), llama-3.2-1b (LlamaForCausalLM: head_dim 64, llama3 RoPE scaling). The tensors' shapes do not depend on
 * RoPE scaling, so a config whose scaling this effect-rl cannot load is still written, with a note on stderr.
 *
 * `--layers N` keeps the preset's shapes with N layers (a cut-down model for quick runs). The last stdout line is
 * `{"dir", "parameters", "bytes", "seconds"}`. Tensors are generated and written one at a time, so memory stays at
 * the largest tensor (the 151,936 × 1,024 embedding for Qwen3-0.6B: 0.6 GB as float32).
 */
import * as fs from "node:fs"
import * as path from "node:path"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Prng from "../src/model/Prng.ts"
import * as Safetensors from "../src/model/Safetensors.ts"
import * as Transformer from "../src/model/Transformer.ts"

const qwen3 = (hidden: number, intermediate: number, layers: number, heads: number) => ({
  architectures: ["Qwen3ForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 151643,
  eos_token_id: 151645,
  head_dim: 128,
  hidden_act: "silu",
  hidden_size: hidden,
  initializer_range: 0.02,
  intermediate_size: intermediate,
  max_position_embeddings: 40960,
  max_window_layers: layers,
  model_type: "qwen3",
  num_attention_heads: heads,
  num_hidden_layers: layers,
  num_key_value_heads: 8,
  rms_norm_eps: 1e-6,
  rope_scaling: null,
  rope_theta: 1000000,
  sliding_window: null,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  use_cache: true,
  use_sliding_window: false,
  vocab_size: 151936
})

/** Qwen/Qwen2.5-1.5B. Qwen2 has q/k/v biases without saying so: there is no `attention_bias` key. */
const qwen25_1_5b = {
  architectures: ["Qwen2ForCausalLM"],
  attention_dropout: 0.0,
  bos_token_id: 151643,
  eos_token_id: 151643,
  hidden_act: "silu",
  hidden_size: 1536,
  initializer_range: 0.02,
  intermediate_size: 8960,
  max_position_embeddings: 32768,
  max_window_layers: 28,
  model_type: "qwen2",
  num_attention_heads: 12,
  num_hidden_layers: 28,
  num_key_value_heads: 2,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  sliding_window: 32768,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.40.1",
  use_cache: true,
  use_mrope: false,
  use_sliding_window: false,
  vocab_size: 151936
}

/** meta-llama/Llama-3.2-1B: head_dim 64, llama3 RoPE scaling (θ 500000, factor 32 from an 8192 context). */
const llama32_1b = {
  architectures: ["LlamaForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 128000,
  eos_token_id: 128001,
  head_dim: 64,
  hidden_act: "silu",
  hidden_size: 2048,
  initializer_range: 0.02,
  intermediate_size: 8192,
  max_position_embeddings: 131072,
  mlp_bias: false,
  model_type: "llama",
  num_attention_heads: 32,
  num_hidden_layers: 16,
  num_key_value_heads: 8,
  pretraining_tp: 1,
  rms_norm_eps: 1e-5,
  rope_scaling: {
    factor: 32.0,
    high_freq_factor: 4.0,
    low_freq_factor: 1.0,
    original_max_position_embeddings: 8192,
    rope_type: "llama3"
  },
  rope_theta: 500000,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.45.0.dev0",
  use_cache: true,
  vocab_size: 128256
}

/** config.json of each model as published on the Hugging Face hub. */
export const presets: Record<string, Record<string, unknown>> = {
  "qwen3-0.6b": qwen3(1024, 3072, 28, 16),
  "qwen3-1.7b": qwen3(2048, 6144, 28, 16),
  "qwen3-4b": { ...qwen3(2560, 9728, 36, 32), max_window_layers: 36 },
  "qwen2.5-1.5b": qwen25_1_5b,
  "llama-3.2-1b": llama32_1b
}

const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 ? process.argv[i + 1] : undefined
}

/** N(0, σ²) by Box–Muller from the project's seeded PRNG. */
const normal = (prng: Prng.Prng, count: number, std: number): Float32Array => {
  const out = new Float32Array(count)
  for (let i = 0; i < count; i += 2) {
    const u = Math.max(prng.next(), 1e-12)
    const r = std * Math.sqrt(-2 * Math.log(u))
    const theta = 2 * Math.PI * prng.next()
    out[i] = r * Math.cos(theta)
    if (i + 1 < count) out[i + 1] = r * Math.sin(theta)
  }
  return out
}

export const make = (options: {
  readonly preset: string
  readonly out: string
  readonly seed?: number
  readonly layers?: number
}): { dir: string; parameters: number; bytes: number; seconds: number } => {
  const start = performance.now()
  const base = presets[options.preset]
  if (base === undefined) {
    throw new Error(`unknown preset ${options.preset}; one of ${Object.keys(presets).join(", ")}`)
  }
  const hf =
    options.layers === undefined
      ? base
      : {
          ...base,
          num_hidden_layers: options.layers,
          ...("max_window_layers" in base ? { max_window_layers: options.layers } : {})
        }
  // RoPE scaling changes no tensor's shape: the shapes come from the config without it, so a preset whose scaling
  // effect-rl cannot load is still written
  const specs = Transformer.parameterSpecs(ModelConfig.fromHf({ ...hf, rope_scaling: null }))
  try {
    ModelConfig.fromHf(hf)
  } catch (error) {
    process.stderr.write(`make-checkpoint: note: effect-rl cannot load this config yet: ${(error as Error).message}\n`)
  }
  const std = (hf["initializer_range"] as number | undefined) ?? 0.02
  const prng = Prng.make(options.seed ?? 0)
  fs.mkdirSync(options.out, { recursive: true })
  fs.writeFileSync(path.join(options.out, "config.json"), `${JSON.stringify(hf, null, 2)}\n`)
  // shards of at most 4 GiB (BF16: 2 bytes a value), as save_pretrained's default of 5 GB would roughly give
  const shardLimit = 4 * 2 ** 30
  const shards: Array<Array<Transformer.ParameterSpec>> = [[]]
  let shardBytes = 0
  for (const spec of specs) {
    const bytes = spec.hfShape.reduce((a, b) => a * b, 1) * 2
    if (shardBytes + bytes > shardLimit && shards[shards.length - 1]!.length > 0) {
      shards.push([])
      shardBytes = 0
    }
    shards[shards.length - 1]!.push(spec)
    shardBytes += bytes
  }
  const weightMap: Record<string, string> = {}
  let total = 0
  let parameters = 0
  for (const [i, shard] of shards.entries()) {
    const file =
      shards.length === 1
        ? "model.safetensors"
        : `model-${String(i + 1).padStart(5, "0")}-of-${String(shards.length).padStart(5, "0")}.safetensors`
    // the header first (offsets follow from the shapes), then each tensor as it is drawn
    const header: Record<string, unknown> = { __metadata__: { format: "pt" } }
    let offset = 0
    for (const spec of shard) {
      const count = spec.hfShape.reduce((a, b) => a * b, 1)
      header[spec.name] = { dtype: "BF16", shape: [...spec.hfShape], data_offsets: [offset, offset + count * 2] }
      offset += count * 2
      weightMap[spec.name] = file
    }
    let json = JSON.stringify(header)
    json += " ".repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8) // data starts 8-aligned
    const fd = fs.openSync(path.join(options.out, file), "w")
    try {
      const prefix = Buffer.alloc(8)
      prefix.writeBigUInt64LE(BigInt(Buffer.byteLength(json)))
      fs.writeSync(fd, prefix)
      fs.writeSync(fd, Buffer.from(json))
      for (const spec of shard) {
        const count = spec.hfShape.reduce((a, b) => a * b, 1)
        const values =
          spec.init === "normal" ? normal(prng, count, std) : new Float32Array(count).fill(spec.init === "ones" ? 1 : 0)
        const bf16 = Safetensors.floatToBf16(values)
        fs.writeSync(fd, new Uint8Array(bf16.buffer, bf16.byteOffset, bf16.byteLength))
        parameters += count
      }
      fs.fsyncSync(fd)
    } finally {
      fs.closeSync(fd)
    }
    total += 8 + Buffer.byteLength(json) + offset
    process.stderr.write(`make-checkpoint: wrote ${file} (${(offset / 2 ** 20).toFixed(0)} MiB)\n`)
  }
  if (shards.length > 1) {
    fs.rmSync(path.join(options.out, "model.safetensors"), { force: true })
    const index = { metadata: { total_size: parameters * 2 }, weight_map: weightMap }
    fs.writeFileSync(path.join(options.out, "model.safetensors.index.json"), `${JSON.stringify(index, null, 2)}\n`)
  } else {
    fs.rmSync(path.join(options.out, "model.safetensors.index.json"), { force: true })
  }
  return { dir: options.out, parameters, bytes: total, seconds: (performance.now() - start) / 1000 }
}

if (import.meta.main) {
  const preset = arg("preset")
  const out = arg("out")
  if (preset === undefined || out === undefined) {
    console.error(
      `usage: node scripts/make-checkpoint.ts --preset ${Object.keys(presets).join("|")} --out DIR [--seed N] [--layers N]`
    )
    process.exit(2)
  }
  const seed = arg("seed")
  const layers = arg("layers")
  const result = make({
    preset,
    out,
    ...(seed !== undefined ? { seed: Number(seed) } : {}),
    ...(layers !== undefined ? { layers: Number(layers) } : {})
  })
  console.log(JSON.stringify(result))
}
