/**
 * The inference engine: token ids in, token ids + behaviour log-probs + finish reason out. Implementations:
 * LocalEngine (in-process), WorkerEngine (worker thread), RemoteEngine (OpenAI-compatible HTTP). The trainer
 * publishes weights through `updateWeights`; engines apply them between decode steps, so one request may span
 * versions — each result says which versions produced its first and last token.
 */
import { Context, type Effect } from "effect"
import type { InferenceError } from "../domain/Errors.ts"
import type { PolicyVersion } from "../domain/PolicyVersion.ts"
import type { FinishReason } from "../domain/Trajectory.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"

export interface SamplingParams {
  readonly maxNewTokens: number
  readonly temperature: number // 0 = greedy
  readonly topK: number // 0 = off
  readonly topP: number // 1 = off
  readonly stopTokenIds: ReadonlyArray<number>
  readonly stopStrings: ReadonlyArray<string>
  readonly seed: number // per request: the same seed and weights give the same tokens
}

export interface GenerateRequest {
  readonly promptIds: ReadonlyArray<number>
  readonly sampling: SamplingParams
  /** The trajectory this call is a turn of: engines with several replicas keep a trajectory's turns on one. */
  readonly trajectoryId?: string
}

export interface GenerateResult {
  readonly tokens: ReadonlyArray<number> // generated ids, including the stop token when one ended the request
  readonly logprobs: ReadonlyArray<number> // log-prob of each token under the sampling distribution
  readonly finishReason: FinishReason
  readonly policyVersionFirst: PolicyVersion
  readonly policyVersionLast: PolicyVersion
  /** Each move of the call to another replica (one that failed or was taken out), with its reason; absent: none. */
  readonly retries?: ReadonlyArray<string>
}

export class InferenceEngine extends Context.Service<
  InferenceEngine,
  {
    /** Generate for a batch of requests. Results are in request order. */
    readonly generate: (
      requests: ReadonlyArray<GenerateRequest>
    ) => Effect.Effect<ReadonlyArray<GenerateResult>, InferenceError>
    /** Swap in new weights; requests in flight continue on them from their next decode step. */
    readonly updateWeights: (snapshot: WeightSnapshot) => Effect.Effect<void, InferenceError>
    /** Stop admitting decode steps (weight updates may still apply); `resume` lets them continue. */
    readonly pause: Effect.Effect<void>
    readonly resume: Effect.Effect<void>
    /** The version of the weights the next decode step will use. */
    readonly version: Effect.Effect<PolicyVersion>
  }
>()("rl/inference/InferenceEngine") {}
