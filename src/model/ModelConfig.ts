/**
 * The transformer's architecture, read from (and written back to) a Hugging Face `config.json`. Qwen3, Qwen2 and
 * Llama share one decoder; they differ only in the switches below:
 * - Qwen3: RMSNorm over head_dim on q and k (`q_norm`/`k_norm`) before RoPE, no q/k/v bias, explicit `head_dim`.
 * - Qwen2: q/k/v bias (`attention_bias` is implied), no q/k norm.
 * - Llama: neither (`attention_bias` honoured when set). Llama 3.1+ also scales RoPE's frequencies
 *   (`rope_scaling.rope_type: "llama3"`, see `RopeScaling`); that is the only RoPE scaling we read.
 */

export type Architecture = "qwen3" | "qwen2" | "llama"

/**
 * Llama 3's RoPE frequency scaling (HF `_compute_llama3_parameters`): frequencies whose wavelength exceeds
 * `originalMaxPositionEmbeddings / lowFreqFactor` are divided by `factor`, those shorter than
 * `originalMaxPositionEmbeddings / highFreqFactor` are kept, and the band between is interpolated. No attention
 * scaling (HF's attention factor is 1 for llama3).
 */
export interface RopeScaling {
  readonly type: "llama3"
  readonly factor: number
  readonly lowFreqFactor: number
  readonly highFreqFactor: number
  readonly originalMaxPositionEmbeddings: number
}

/** `RopeScaling` in HF key names, as `config.json` carries it. */
export interface HfRopeScaling {
  readonly rope_type: "llama3"
  readonly factor: number
  readonly low_freq_factor: number
  readonly high_freq_factor: number
  readonly original_max_position_embeddings: number
}

export interface TransformerConfig {
  readonly architecture: Architecture
  readonly vocabSize: number
  readonly hiddenSize: number // D
  readonly intermediateSize: number // I, the SwiGLU width
  readonly numLayers: number
  readonly numHeads: number // H
  readonly numKvHeads: number // Hkv, divides H (grouped-query attention)
  readonly headDim: number // hd, may differ from D / H (Qwen3)
  readonly ropeTheta: number
  readonly ropeScaling?: RopeScaling // absent: plain RoPE
  readonly rmsNormEps: number
  readonly maxPositionEmbeddings: number
  readonly tieWordEmbeddings: boolean
  readonly attentionBias: boolean // q/k/v projections carry a bias
  readonly qkNorm: boolean // RMSNorm over head_dim on q and k before RoPE
  readonly bosTokenId?: number
  readonly eosTokenId?: number | ReadonlyArray<number>
}

/** The random-model description of the run config (`model.init`, HF key names), structurally. */
export interface ModelInitLike {
  readonly architecture: Architecture
  readonly vocab_size: number
  readonly hidden_size: number
  readonly intermediate_size: number
  readonly num_hidden_layers: number
  readonly num_attention_heads: number
  readonly num_key_value_heads: number
  readonly head_dim?: number
  readonly rope_theta: number
  readonly rope_scaling?: HfRopeScaling | null
  readonly rms_norm_eps: number
  readonly max_position_embeddings: number
  readonly tie_word_embeddings: boolean
}

const modelTypes: Record<Architecture, { modelType: string; hfClass: string }> = {
  qwen3: { modelType: "qwen3", hfClass: "Qwen3ForCausalLM" },
  qwen2: { modelType: "qwen2", hfClass: "Qwen2ForCausalLM" },
  llama: { modelType: "llama", hfClass: "LlamaForCausalLM" }
}

export class ModelConfigError extends Error {
  override readonly name = "ModelConfigError"
}

const check = (config: TransformerConfig): TransformerConfig => {
  const ints: Array<keyof TransformerConfig> = [
    "vocabSize",
    "hiddenSize",
    "intermediateSize",
    "numLayers",
    "numHeads",
    "numKvHeads",
    "headDim"
  ]
  for (const key of ints) {
    const v = config[key]
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) {
      throw new ModelConfigError(`${key} must be a positive integer, got ${String(v)}`)
    }
  }
  if (config.numHeads % config.numKvHeads !== 0) {
    throw new ModelConfigError(
      `num_attention_heads (${config.numHeads}) must be a multiple of num_key_value_heads (${config.numKvHeads})`
    )
  }
  if (config.headDim % 2 !== 0) throw new ModelConfigError(`head_dim must be even for RoPE, got ${config.headDim}`)
  const scaling = config.ropeScaling
  if (scaling !== undefined) {
    for (const key of ["factor", "lowFreqFactor", "highFreqFactor", "originalMaxPositionEmbeddings"] as const) {
      const v = scaling[key]
      if (typeof v !== "number" || !(v > 0)) {
        throw new ModelConfigError(`rope_scaling (llama3): ${key} must be a positive number, got ${String(v)}`)
      }
    }
    // the band between the two wavelengths is interpolated over high − low: it must not be empty or inverted
    if (!(scaling.highFreqFactor > scaling.lowFreqFactor)) {
      throw new ModelConfigError(
        `rope_scaling (llama3): high_freq_factor (${scaling.highFreqFactor}) must exceed low_freq_factor (${scaling.lowFreqFactor})`
      )
    }
  }
  return config
}

/**
 * RoPE scaling from a `rope_scaling` (or newer transformers' `rope_parameters`) object: none for "default" (or no
 * object), llama3's parameters for "llama3", a `ModelConfigError` naming any other type (linear, dynamic, yarn, …).
 */
const ropeScalingOf = (object: object | null | undefined): RopeScaling | undefined => {
  const json = (object ?? {}) as Readonly<Record<string, unknown>>
  const ropeType = json["rope_type"] ?? json["type"]
  if (ropeType === undefined || ropeType === "default") return undefined
  if (ropeType !== "llama3") {
    throw new ModelConfigError(
      `config.json: rope scaling "${String(ropeType)}" is not supported (only default RoPE and llama3)`
    )
  }
  const field = (key: string): number => {
    const v = json[key]
    if (typeof v !== "number") throw new ModelConfigError(`config.json: rope_scaling (llama3) needs a number "${key}"`)
    return v
  }
  return {
    type: "llama3",
    factor: field("factor"),
    lowFreqFactor: field("low_freq_factor"),
    highFreqFactor: field("high_freq_factor"),
    originalMaxPositionEmbeddings: field("original_max_position_embeddings")
  }
}

const optionalScaling = (ropeScaling: RopeScaling | undefined) => (ropeScaling === undefined ? {} : { ropeScaling })

/** From a random-model description (`model.init`). */
export const fromInit = (init: ModelInitLike): TransformerConfig =>
  check({
    architecture: init.architecture,
    vocabSize: init.vocab_size,
    hiddenSize: init.hidden_size,
    intermediateSize: init.intermediate_size,
    numLayers: init.num_hidden_layers,
    numHeads: init.num_attention_heads,
    numKvHeads: init.num_key_value_heads,
    headDim: init.head_dim ?? init.hidden_size / init.num_attention_heads,
    ropeTheta: init.rope_theta,
    ...optionalScaling(ropeScalingOf(init.rope_scaling)),
    rmsNormEps: init.rms_norm_eps,
    maxPositionEmbeddings: init.max_position_embeddings,
    tieWordEmbeddings: init.tie_word_embeddings,
    attentionBias: init.architecture === "qwen2",
    qkNorm: init.architecture === "qwen3"
  })

const num = (json: Record<string, unknown>, key: string, fallback?: number): number => {
  const v = json[key]
  if (typeof v === "number") return v
  if (fallback !== undefined) return fallback
  throw new ModelConfigError(`config.json: "${key}" is missing or not a number`)
}

const architectureOf = (json: Record<string, unknown>): Architecture => {
  const modelType = String(json["model_type"] ?? "")
  if (modelType === "qwen3") return "qwen3"
  if (modelType === "qwen2") return "qwen2"
  if (modelType === "llama") return "llama"
  const archs = Array.isArray(json["architectures"]) ? json["architectures"].map(String) : []
  if (archs.some((a) => a.startsWith("Qwen3"))) return "qwen3"
  if (archs.some((a) => a.startsWith("Qwen2"))) return "qwen2"
  if (archs.some((a) => a.startsWith("Llama"))) return "llama"
  throw new ModelConfigError(`config.json: unsupported model_type "${modelType}" (expected qwen3, qwen2 or llama)`)
}

/**
 * From a parsed HF `config.json`. RoPE θ is read from `rope_theta` or `rope_parameters.rope_theta`, RoPE scaling from
 * `rope_scaling` or `rope_parameters` (default or llama3).
 */
export const fromHf = (json: Record<string, unknown>): TransformerConfig => {
  const architecture = architectureOf(json)
  const hiddenSize = num(json, "hidden_size")
  const numHeads = num(json, "num_attention_heads")
  const ropeParameters = json["rope_parameters"] as Record<string, unknown> | undefined
  const ropeScaling = ropeScalingOf((json["rope_scaling"] ?? ropeParameters) as Record<string, unknown> | undefined)
  const ropeTheta =
    typeof json["rope_theta"] === "number"
      ? json["rope_theta"]
      : typeof ropeParameters?.["rope_theta"] === "number"
        ? ropeParameters["rope_theta"]
        : 10000
  const headDim = typeof json["head_dim"] === "number" ? json["head_dim"] : hiddenSize / numHeads
  const bos = json["bos_token_id"]
  const eos = json["eos_token_id"]
  return check({
    architecture,
    vocabSize: num(json, "vocab_size"),
    hiddenSize,
    intermediateSize: num(json, "intermediate_size"),
    numLayers: num(json, "num_hidden_layers"),
    numHeads,
    numKvHeads: num(json, "num_key_value_heads", numHeads),
    headDim,
    ropeTheta,
    ...optionalScaling(ropeScaling),
    rmsNormEps: num(json, "rms_norm_eps", 1e-6),
    maxPositionEmbeddings: num(json, "max_position_embeddings", 2048),
    tieWordEmbeddings: json["tie_word_embeddings"] === true,
    attentionBias: architecture === "qwen2" || json["attention_bias"] === true,
    qkNorm: architecture === "qwen3",
    ...(typeof bos === "number" ? { bosTokenId: bos } : {}),
    ...(typeof eos === "number" || Array.isArray(eos) ? { eosTokenId: eos as number | ReadonlyArray<number> } : {})
  })
}

const toHfRopeScaling = (s: RopeScaling): HfRopeScaling => ({
  rope_type: s.type,
  factor: s.factor,
  low_freq_factor: s.lowFreqFactor,
  high_freq_factor: s.highFreqFactor,
  original_max_position_embeddings: s.originalMaxPositionEmbeddings
})

/** To a HF `config.json` that transformers and vLLM load (`torch_dtype` names the dtype the weights are saved in). */
export const toHf = (config: TransformerConfig, dtype: "float32" | "bfloat16" = "float32"): Record<string, unknown> => {
  const { modelType, hfClass } = modelTypes[config.architecture]
  return {
    architectures: [hfClass],
    model_type: modelType,
    vocab_size: config.vocabSize,
    hidden_size: config.hiddenSize,
    intermediate_size: config.intermediateSize,
    num_hidden_layers: config.numLayers,
    num_attention_heads: config.numHeads,
    num_key_value_heads: config.numKvHeads,
    head_dim: config.headDim,
    hidden_act: "silu",
    max_position_embeddings: config.maxPositionEmbeddings,
    rms_norm_eps: config.rmsNormEps,
    rope_theta: config.ropeTheta,
    rope_scaling: config.ropeScaling === undefined ? null : toHfRopeScaling(config.ropeScaling),
    tie_word_embeddings: config.tieWordEmbeddings,
    attention_bias: config.attentionBias,
    attention_dropout: 0,
    initializer_range: 0.02,
    use_cache: true,
    ...(config.architecture === "llama" ? { mlp_bias: false } : {}),
    ...(config.architecture !== "llama"
      ? { use_sliding_window: false, sliding_window: null, max_window_layers: config.numLayers }
      : {}),
    ...(config.bosTokenId !== undefined ? { bos_token_id: config.bosTokenId } : {}),
    ...(config.eosTokenId !== undefined ? { eos_token_id: config.eosTokenId } : {}),
    torch_dtype: dtype,
    transformers_version: "4.51.0"
  }
}

/** Number of parameters (tied embeddings counted once). */
export const parameterCount = (c: TransformerConfig): number => {
  const qkv = c.hiddenSize * (c.numHeads + 2 * c.numKvHeads) * c.headDim
  const bias = c.attentionBias ? (c.numHeads + 2 * c.numKvHeads) * c.headDim : 0
  const o = c.numHeads * c.headDim * c.hiddenSize
  const mlp = 3 * c.hiddenSize * c.intermediateSize
  const norms = 2 * c.hiddenSize + (c.qkNorm ? 2 * c.headDim : 0)
  const layer = qkv + bias + o + mlp + norms
  const embed = c.vocabSize * c.hiddenSize
  return embed + c.numLayers * layer + c.hiddenSize + (c.tieWordEmbeddings ? 0 : embed)
}
