import { Schema } from "effect"
import { NonNegativeInt, Positive, PositiveInt, Probability, withDefault } from "./Field.ts"

/** A randomly initialised model in HF config.json terms (tests, the tiny models we train ourselves). */
export const ModelInit = Schema.Struct({
  // the transformer family, as HF's model_type
  architecture: Schema.Literals(["qwen3", "qwen2", "llama"]).pipe(withDefault("qwen3")),
  vocab_size: PositiveInt.pipe(withDefault(512)), // tokens in the vocabulary
  hidden_size: PositiveInt.pipe(withDefault(256)), // the width of the residual stream
  intermediate_size: PositiveInt.pipe(withDefault(1024)), // the MLP's inner width
  num_hidden_layers: PositiveInt.pipe(withDefault(4)), // decoder layers
  num_attention_heads: PositiveInt.pipe(withDefault(4)), // query heads
  // key/value heads; fewer than num_attention_heads: grouped-query attention
  num_key_value_heads: PositiveInt.pipe(withDefault(4)),
  head_dim: Schema.optionalKey(PositiveInt), // default hidden_size / num_attention_heads
  rope_theta: Positive.pipe(withDefault(10000)), // RoPE's base
  rms_norm_eps: Positive.pipe(withDefault(1e-6)), // ε of every RMSNorm
  max_position_embeddings: PositiveInt.pipe(withDefault(2048)), // the longest sequence the model is configured for
  tie_word_embeddings: Schema.Boolean.pipe(withDefault(true)), // the LM head reuses the token embedding matrix
  seed: NonNegativeInt.pipe(withDefault(0)) // of the random initialisation
})
export type ModelInit = typeof ModelInit.Type

export const LoraConfig = Schema.Struct({
  rank: NonNegativeInt.pipe(withDefault(0)), // 0 = full fine-tuning, no adapters
  alpha: Positive.pipe(withDefault(16)), // the update is scaled by alpha / rank
  dropout: Probability.pipe(withDefault(0)), // on the adapter's input, in training only
  // PEFT's names, matched by a module's last name component; the MLP's are gate_proj, up_proj, down_proj
  target_modules: Schema.Array(Schema.String).pipe(withDefault(["q_proj", "k_proj", "v_proj", "o_proj"])),
  // the frozen base in memory: bfloat16 halves it (native backend only; exact for a BF16 checkpoint, a rounding of
  // an F32 one), float32 keeps it as loaded
  base_dtype: Schema.Literals(["float32", "bfloat16"]).pipe(withDefault("float32"))
})
export type LoraConfig = typeof LoraConfig.Type

/** The policy: a HF-layout checkpoint directory (`path`), or a fresh random model (`init`). */
export const ModelConfig = Schema.Struct({
  // a checkpoint directory (HF layout), or a Hugging Face name `org/name[@revision]` read from the local hub cache
  path: Schema.optionalKey(Schema.NonEmptyString),
  init: Schema.optionalKey(ModelInit),
  lora: LoraConfig.pipe(withDefault({})) // LoRA adapters over a frozen base (rank 0: none, the whole model trains)
}).check(
  Schema.makeFilter(
    (m) =>
      (m.path === undefined) !== (m.init === undefined) || {
        path: ["path"],
        issue: "set exactly one of model.path (a checkpoint directory) or model.init (a random model)"
      }
  )
)
export type ModelConfig = typeof ModelConfig.Type
