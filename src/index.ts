/**
 * effect-rl's library API: `import { ... } from "effect-rl"`. Services, layers, schemas and the pure model/algo
 * functions, each as a namespace named after its module, so another Effect app can load a config, read a dataset,
 * run one rollout, one train step or a whole run inside its own runtime.
 *
 *   import { RunConfigLoader, Generator, PolicyTrainer, Advantages } from "effect-rl"
 */

export * from "./algo/index.ts"
// tensors, model, tokenizer (model/ and algo/ are pure tfjs, no Effect)
export * as TensorBackend from "./backend/TensorBackend.ts"
// config
export * as RunConfig from "./config/RunConfig.ts"
export * as RunConfigLoader from "./config/RunConfigLoader.ts"
// data
export * as Dataset from "./data/Dataset.ts"
export * as SftDataset from "./data/SftDataset.ts"
export * as TauBenchConverter from "./data/TauBenchConverter.ts"
export * as ToolboxTasks from "./data/ToolboxTasks.ts"
// domain: the token-exact data plane
export * as Errors from "./domain/Errors.ts"
export * as Message from "./domain/Message.ts"
export * as PolicyVersion from "./domain/PolicyVersion.ts"
export * as PromptRow from "./domain/PromptRow.ts"
export * as ToolCall from "./domain/ToolCall.ts"
export * as Trajectory from "./domain/Trajectory.ts"
export * as WeightSnapshot from "./domain/WeightSnapshot.ts"
export * as Env from "./env/Env.ts"
export * as EnvRegistry from "./env/EnvRegistry.ts"
export * as McpClient from "./env/McpClient.ts"
export * as McpToolEnv from "./env/McpToolEnv.ts"
export * as MathEnv from "./env/MathEnv.ts"
export * as Rewards from "./env/Rewards.ts"
export * as TauEnv from "./env/tau/TauEnv.ts"
export * as TauReward from "./env/tau/Reward.ts"
export * as TauUserSimulator from "./env/tau/UserSimulator.ts"
export * as ToolCallParser from "./env/ToolCallParser.ts"
export * as ToolIo from "./env/ToolIo.ts"
export * as AgentLoop from "./generator/AgentLoop.ts"
export * as Generator from "./generator/Generator.ts"
// services
export * as InferenceEngine from "./inference/InferenceEngine.ts"
export * as LocalEngine from "./inference/LocalEngine.ts"
export * as Metrics from "./metrics/Metrics.ts"
export * as Report from "./metrics/Report.ts"
export * from "./model/index.ts"
export * as Evaluator from "./pipeline/Evaluator.ts"
export * as ReplayPipeline from "./pipeline/ReplayPipeline.ts"
export * as SyncPipeline from "./pipeline/SyncPipeline.ts"
export * as Checkpointer from "./store/Checkpointer.ts"
export * as EpisodeLog from "./store/EpisodeLog.ts"
export * as InProcessWeightSync from "./sync/InProcessWeightSync.ts"
export * as WeightSync from "./sync/WeightSync.ts"
export * from "./tokenizer/index.ts"
export * as Optimizer from "./trainer/Optimizer.ts"
export * as PolicyModel from "./trainer/PolicyModel.ts"
export * as Critic from "./trainer/Critic.ts"
export * as PolicyTrainer from "./trainer/PolicyTrainer.ts"
export * as SftTrainer from "./trainer/SftTrainer.ts"
export * as Trainer from "./trainer/Trainer.ts"
export * as TrainingBatch from "./trainer/TrainingBatch.ts"
