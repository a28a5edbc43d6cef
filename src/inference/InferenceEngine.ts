/**
 * The inference engine: token ids in, token ids + behaviour log-probs + finish reason out. Implementations:
 * LocalEngine (in-process), WorkerEngine (worker thread), RemoteEngine (OpenAI-compatible HTTP). The trainer
 * publishes weights through `updateWeights`; engines apply them between decode steps, so one request may span
 * versions — each result says which versions produced its first and last token.
 *
 * `chat` (RemoteEngine only, `generator.engine.chat`): one turn as OpenAI `messages` + `tools` to a server's
 * `/v1/chat/completions`; the server renders the prompt and reads the tool calls, and answers with the prompt ids it
 * rendered and the ids and log-probs it sampled, so a trajectory still holds exactly what the policy saw and produced.
 */
import { Context, type Effect } from "effect"
import type { InferenceError } from "../domain/Errors.ts"
import type { Message, ToolCallWire } from "../domain/Message.ts"
import type { PolicyVersion } from "../domain/PolicyVersion.ts"
import type { FinishReason } from "../domain/Trajectory.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"
import type { Constraint } from "../model/Sampling.ts"
import type { ToolDefinition } from "../tokenizer/ChatTemplate.ts"

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
  /**
   * Constrained decoding (model/Sampling.ts `Constraint`, e.g. a JSON schema): in-process engines (LocalEngine) only;
   * one object per request, as it holds the request's state.
   */
  readonly constraint?: Constraint
  /**
   * Called with each token as it is sampled (LocalEngine; `finishReason` set on the token that ended the request), so
   * a server can stream before the generation ends. Engines that return whole completions do not call it.
   */
  readonly onToken?: (event: TokenEvent) => void
}

/** One sampled token, as `onToken` sees it. */
export interface TokenEvent {
  readonly token: number
  readonly logprob: number
  /** The weights' version that produced it. */
  readonly version: number
  /** Set on the request's last token. */
  readonly finishReason?: FinishReason
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

export interface ChatRequest {
  readonly messages: ReadonlyArray<Message>
  /** Offered to the model (rendered by the server's chat template) and read back as `toolCalls`; absent: none. */
  readonly tools?: ReadonlyArray<ToolDefinition>
  readonly sampling: SamplingParams
  readonly trajectoryId?: string
}

export interface ChatResult extends GenerateResult {
  /** The prompt as the server rendered and tokenised it: what the sampled tokens were conditioned on. */
  readonly promptIds: ReadonlyArray<number>
  /** The assistant message as the server's tool parser read it (content before the calls, null when none). */
  readonly content: string | null
  readonly toolCalls: ReadonlyArray<ToolCallWire>
}

export class InferenceEngine extends Context.Service<
  InferenceEngine,
  {
    /** Generate for a batch of requests. Results are in request order. */
    readonly generate: (
      requests: ReadonlyArray<GenerateRequest>
    ) => Effect.Effect<ReadonlyArray<GenerateResult>, InferenceError>
    /** One chat turn through the server's chat template and tool parser; absent: the engine has no chat path. */
    readonly chat?: (request: ChatRequest) => Effect.Effect<ChatResult, InferenceError>
    /** Swap in new weights; requests in flight continue on them from their next decode step. */
    readonly updateWeights: (snapshot: WeightSnapshot) => Effect.Effect<void, InferenceError>
    /** Stop admitting decode steps (weight updates may still apply); `resume` lets them continue. */
    readonly pause: Effect.Effect<void>
    readonly resume: Effect.Effect<void>
    /** The version of the weights the next decode step will use. */
    readonly version: Effect.Effect<PolicyVersion>
  }
>()("rl/inference/InferenceEngine") {}
