import { Schema } from "effect"
import { NonNegative, NonNegativeInt, PositiveInt, Probability, SecretRef, withDefault } from "./Field.ts"

export const SamplingConfig = Schema.Struct({
  temperature: NonNegative.pipe(withDefault(1)), // 0 = greedy
  top_p: Probability.pipe(withDefault(1)), // nucleus sampling: 1 = off
  top_k: NonNegativeInt.pipe(withDefault(0)), // 0 = off
  stop: Schema.Array(Schema.String).pipe(withDefault([])) // stop strings, besides the tokenizer's end tokens
})
export type SamplingConfig = typeof SamplingConfig.Type

/**
 * Where generation runs: in-process, in a worker thread, on OpenAI-compatible servers (ours, vLLM or SGLang;
 * inference/RemoteEngine.ts), or on llama.cpp (inference/LlamaCppEngine.ts).
 */
export const EngineConfig = Schema.Struct({
  // local: in this process; worker: a worker thread; remote: OpenAI-compatible servers at url / urls;
  // llamacpp: llama.cpp
  kind: Schema.Literals(["local", "worker", "remote", "llamacpp"]).pipe(withDefault("local")),
  // llamacpp (inference/LlamaCppEngine.ts): each version exported as GGUF with this tensor type and sampled by
  // llama.cpp; files under gguf_dir (default RUN_DIR/weights-gguf). f16 / bf16 / q8_0 behaviour log-probs differ from
  // the trainer's (policy/rollout_logprob_abs_diff); use trainer.algorithm.off_policy_correction with them
  gguf_type: Schema.Literals(["f32", "f16", "bf16", "q8_0"]).pipe(withDefault("f32")),
  // llamacpp: where each version's GGUF file goes (default RUN_DIR/weights-gguf)
  gguf_dir: Schema.optionalKey(Schema.NonEmptyString),
  // llamacpp: llama.cpp's CPU threads. 1 by default: on a small box the trainer and the tool servers need the other
  // cores, and with more threads than it can have to itself llama.cpp's threads wait on each other (2 threads on
  // 2 cores: 15.7 ms per token of the quickstart policy; node-llama-cpp's default: 420 ms; 1 thread: 0.7 ms)
  llamacpp_threads: PositiveInt.pipe(withDefault(1)),
  // remote: the server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
  url: Schema.optionalKey(Schema.NonEmptyString),
  // remote: several replicas (with or instead of url); a trajectory's turns stay on one, a replica that fails is
  // taken out and its calls go on at another, and it is let back in on the current weights when healthy
  urls: Schema.optionalKey(Schema.Array(Schema.NonEmptyString).check(Schema.isMinLength(1))),
  // remote with http sync: how full weights reach the servers (weights/WeightDialect.ts): effect-rl uploads to
  // serve's /v1/weights (weight_token); vllm and sglang write a HF directory per version under weights_dir and drive
  // the servers' reload endpoints
  dialect: Schema.Literals(["effect-rl", "vllm", "sglang"]).pipe(withDefault("effect-rl")),
  weights_dir: Schema.optionalKey(Schema.NonEmptyString), // default RUN_DIR/weights-hf; the servers read the same path
  request_timeout_seconds: PositiveInt.pipe(withDefault(600)), // remote: a call with no answer by then fails over
  // remote: the `model` sent with each request; default: the first of the server's /v1/models
  model_name: Schema.optionalKey(Schema.String),
  api_key: Schema.optionalKey(SecretRef), // remote: sent as `Authorization: Bearer` (vLLM's --api-key)
  weight_token: Schema.optionalKey(SecretRef), // remote: the env var holding `serve`'s /v1/weights token (http sync)
  // remote with LoRA and http sync: adapters are written here (default RUN_DIR/adapters; the server must read the
  // same path) and loaded through the server's runtime LoRA API as `<lora_name_prefix>-v<version>`
  lora_dir: Schema.optionalKey(Schema.NonEmptyString),
  // remote with LoRA: adapters are loaded as <lora_name_prefix>-v<version>
  lora_name_prefix: Schema.NonEmptyString.pipe(withDefault("policy")),
  max_batch_size: PositiveInt.pipe(withDefault(16)), // local, worker and llamacpp engines: rows decoded together
  // remote: each turn goes to /v1/chat/completions as messages + tools and the server reads the tool calls (vLLM's
  // --enable-auto-tool-choice --tool-call-parser hermes); token ids and log-probs stay exact (return_token_ids)
  chat: Schema.Boolean.pipe(withDefault(false))
})
export type EngineConfig = typeof EngineConfig.Type

/**
 * An agent program as the rollout (generator/AgentProgram.ts): each sample of a prompt is one run of `command`, whose
 * SDK client talks to the policy through the agent gateway (generator/AgentGateway.ts), every call recorded.
 */
export const AgentConfig = Schema.Struct({
  // the program and its arguments, e.g. [node, examples/agents/ai-sdk-agent.mjs]; `node` is the trainer's own Node
  command: Schema.Array(Schema.NonEmptyString).check(Schema.isMinLength(1)),
  // a run longer than this is killed (its process group) and its trajectory ends `error`
  timeout_seconds: PositiveInt.pipe(withDefault(300)),
  env: Schema.Record(Schema.String, Schema.String).pipe(withDefault({})), // more environment variables
  cwd: Schema.optionalKey(Schema.NonEmptyString) // default: the trainer's working directory
})
export type AgentConfig = typeof AgentConfig.Type

/** How rollouts are generated: the group size, turn and length limits, sampling, and the engine that samples. */
export const GeneratorConfig = Schema.Struct({
  n_samples_per_prompt: PositiveInt.pipe(withDefault(4)), // the GRPO group size
  max_turns: PositiveInt.pipe(withDefault(4)), // assistant turns per trajectory
  max_generate_length: PositiveInt.pipe(withDefault(128)), // new tokens per turn
  max_input_length: PositiveInt.pipe(withDefault(2048)), // prompt + history (cut at it): beyond it `overlong`
  // prompts rolled out at once by the sync pipeline (async: num_generation_workers); a cluster runner's slots
  max_concurrent_groups: PositiveInt.pipe(withDefault(4)),
  sampling: SamplingConfig.pipe(withDefault({})), // sampling of training rollouts
  // sampling of held-out evaluations (greedy by default)
  eval_sampling: SamplingConfig.pipe(withDefault({ temperature: 0 })),
  eval_n_samples_per_prompt: PositiveInt.pipe(withDefault(1)), // samples per held-out prompt (the n of pass_at_n)
  step_wise: Schema.Boolean.pipe(withDefault(false)), // one training row per turn (templates that rewrite history)
  seed: NonNegativeInt.pipe(withDefault(0)), // the base of every group's sampling seed
  engine: EngineConfig.pipe(withDefault({})),
  // an agent program per sample instead of the built-in loop (max_turns then bounds its model calls)
  agent: Schema.optionalKey(AgentConfig)
})
export type GeneratorConfig = typeof GeneratorConfig.Type
