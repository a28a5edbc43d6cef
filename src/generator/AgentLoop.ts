/**
 * One trajectory, token in / token out (SkyRL's `agent_loop`, never re-tokenising what the policy produced):
 *
 *   prompt ids  = chat template applied once to the env's initial messages (+ generation prompt)
 *   per turn:     generate ≤ max_generate_length tokens (lossMask 1, behaviour log-probs kept)
 *                 env.step(decoded text) → observations, reward, done
 *                 append the observations' template tokens (lossMask 0) via ChatTemplate.continuation
 *   stop on:      done (`stop`, or `env_done` for an env-defined end), max_turns, generation cut by length
 *                 (`length`), the context reaching max_input_length (`overlong`), or an infrastructure error
 *                 (`error`, recorded with its message: nothing is dropped).
 *
 * Context overflow, as SkyRL's agent loop handles it (it ends the trajectory once the context passes
 * max_input_length, stop reason `length`, and cuts the response to a maximum length), but with a tighter bound and our
 * own name: prompt + response never exceed max_input_length. A prompt longer than that ends `overlong` before any
 * generation, its ids cut at the limit; an observation that would push the context past it is cut at the limit and
 * ends the trajectory `overlong` (the turn's `observationTokens` counts what was kept).
 * Token arrays are appended in loops, never spread into a call: a 150K-token prompt would overflow the stack.
 * Each call names its trajectory (`trajectoryId` `<uid>/<sample>`), so an engine with several replicas keeps the
 * trajectory's turns on one; a turn whose call moved to another replica records each move and its reason (`retries`).
 *
 * Each turn's reward sits on its last generated token. Each turn records the policy versions that produced its first
 * and last token (weights may be swapped mid-turn by an async trainer).
 *
 * Step-wise mode (`stepWise`), for chat templates whose rendering of a conversation is not an extension of its
 * rendering one turn earlier (Qwen3 strips earlier `<think>` blocks): every turn re-renders the whole history as its
 * prompt, and each turn becomes its own training row (`Trajectory.steps`); the trajectory's advantage is copied to
 * every row. `responseIds` then holds only the generated tokens.
 */
import { Clock, Effect, Schedule, Schema } from "effect"
import type { InferenceError } from "../domain/Errors.ts"
import type { Message } from "../domain/Message.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { Step, StopReason, Trajectory, Turn } from "../domain/Trajectory.ts"
import type { EnvError, FunctionTool } from "../env/Env.ts"
import { EnvRegistry } from "../env/EnvRegistry.ts"
import { InferenceEngine, type SamplingParams } from "../inference/InferenceEngine.ts"
import { type ChatTemplatePrefixError, Tokenizer, type TokenizerError } from "../tokenizer/Tokenizer.ts"

/** The context (prompt + history) reached `maxInputLength` before the episode ended. */
export class OverlongError extends Schema.TaggedError<OverlongError>()("OverlongError", {
  length: Schema.Int,
  maxInputLength: Schema.Int
}) {}

export interface Options {
  readonly maxTurns: number
  readonly maxGenerateLength: number
  readonly maxInputLength: number
  readonly temperature: number
  readonly topP: number
  readonly topK: number
  readonly stopStrings: ReadonlyArray<string>
  /** base seed; each request's seed is derived from it, the prompt uid, the sample index and the turn */
  readonly seed: number
  /** one training row per turn, each turn's context re-rendered from the whole history */
  readonly stepWise?: boolean
}

/** FNV-1a over a string, mixed with numbers: a deterministic per-request seed. */
export const requestSeed = (base: number, uid: string, sample: number, turn: number): number => {
  let h = 0x811c9dc5 ^ base
  const mix = (x: number) => {
    h ^= x & 0xff
    h = Math.imul(h, 0x01000193) >>> 0
  }
  for (let i = 0; i < uid.length; i++) mix(uid.charCodeAt(i))
  for (const n of [sample, turn, sample >>> 8, turn >>> 8]) mix(n)
  return h >>> 0
}

const inferenceRetry = Schedule.max([Schedule.exponential("200 millis"), Schedule.recurs(3)])

/** Appends at most `limit` items of `source` to `target` and returns how many; a loop, as `push(...source)` overflows
 * the stack on long arrays. */
const append = <A>(target: Array<A>, source: ReadonlyArray<A>, limit = source.length): number => {
  const n = Math.max(0, Math.min(limit, source.length))
  for (let i = 0; i < n; i++) target.push(source[i]!)
  return n
}

/** Run one trajectory of `row`. Never fails: infrastructure failures end it with stop reason `error`. */
export const run = Effect.fn("AgentLoop.run")(function* (row: PromptRow, sample: number, options: Options) {
  const engine = yield* InferenceEngine
  const tokenizer = yield* Tokenizer
  const registry = yield* EnvRegistry
  const uid = row.uid ?? "prompt"

  const promptIds: Array<number> = []
  const responseIds: Array<number> = []
  const lossMask: Array<0 | 1> = []
  const rolloutLogprobs: Array<number> = []
  const turns: Array<Turn> = []
  const steps: Array<Step> = []
  const stepWise = options.stepWise === true
  let stepContext: Array<number> = []
  let stopReason: StopReason = "max_turns"
  let error: string | undefined
  let envMetrics: Record<string, number> = {}

  const episode = Effect.scoped(
    Effect.gen(function* () {
      const env = yield* registry.make(row.env_class, row)
      const init = yield* env.init(row.prompt)
      const tools: ReadonlyArray<FunctionTool> | undefined = init.metadata.tools
      const templateOptions = { addGenerationPrompt: true, ...(tools === undefined ? {} : { tools }) }
      const history: Array<Message> = [...init.messages]
      const rendered = yield* tokenizer.applyChatTemplateIds(history, templateOptions)
      append(promptIds, rendered, options.maxInputLength)
      if (rendered.length > options.maxInputLength) {
        return yield* new OverlongError({ length: rendered.length, maxInputLength: options.maxInputLength })
      }

      for (let turn = 0; turn < options.maxTurns; turn++) {
        if (stepWise)
          stepContext = turn === 0 ? [...promptIds] : yield* tokenizer.applyChatTemplateIds(history, templateOptions)
        const context = stepWise ? stepContext.length : promptIds.length + responseIds.length
        const room = options.maxInputLength - context
        if (room <= 0) return yield* new OverlongError({ length: context, maxInputLength: options.maxInputLength })
        const sampling: SamplingParams = {
          maxNewTokens: Math.min(options.maxGenerateLength, room),
          temperature: options.temperature,
          topK: options.topK,
          topP: options.topP,
          stopTokenIds: tokenizer.eosIds,
          stopStrings: options.stopStrings,
          seed: requestSeed(options.seed, uid, sample, turn)
        }
        const llmStart = yield* Clock.currentTimeMillis
        const [result] = yield* engine
          .generate([
            {
              promptIds: stepWise ? stepContext : promptIds.concat(responseIds),
              sampling,
              trajectoryId: `${uid}/${sample}`
            }
          ])
          .pipe(Effect.retry({ schedule: inferenceRetry, while: (e: InferenceError) => e.isRetryable }))
        const llmMs = (yield* Clock.currentTimeMillis) - llmStart
        const start = responseIds.length
        append(responseIds, result!.tokens)
        append(rolloutLogprobs, result!.logprobs)
        for (let i = 0; i < result!.tokens.length; i++) lossMask.push(1)
        const end = responseIds.length
        if (stepWise)
          steps.push({ promptIds: stepContext, responseIds: result!.tokens, rolloutLogprobs: result!.logprobs })
        const text = tokenizer.decode(result!.tokens, { skipSpecialTokens: true })
        const turnBase = {
          start,
          end,
          finishReason: result!.finishReason,
          policyVersionFirst: result!.policyVersionFirst,
          policyVersionLast: result!.policyVersionLast,
          ...(result!.retries === undefined ? {} : { retries: result!.retries }),
          llmMs
        }

        if (
          result!.finishReason === "length" &&
          end - start >= sampling.maxNewTokens &&
          sampling.maxNewTokens < options.maxGenerateLength
        ) {
          // cut by the context limit, not by max_generate_length: the context is full
          turns.push({ ...turnBase, reward: 0, toolCalls: [], observationTokens: 0, envMs: 0 })
          return yield* new OverlongError({ length: context + (end - start), maxInputLength: options.maxInputLength })
        }
        if (result!.finishReason === "length") {
          turns.push({ ...turnBase, reward: 0, toolCalls: [], observationTokens: 0, envMs: 0 })
          stopReason = "length"
          return
        }

        const envStart = yield* Clock.currentTimeMillis
        const step = yield* env.step(text)
        const envMs = (yield* Clock.currentTimeMillis) - envStart
        history.push({ role: "assistant", content: text })
        let observationTokens = 0
        let overflow: OverlongError | undefined
        if (stepWise && !step.done) append(history, step.observations)
        if (!stepWise && !step.done && turn + 1 < options.maxTurns && step.observations.length > 0) {
          const next = yield* tokenizer.continuation(history, step.observations, templateOptions, {
            onHistoryRewrite: "alignByEndOfTurn"
          })
          append(history, step.observations)
          // cut at the context limit: the rest could never be read by a next turn
          const before = promptIds.length + responseIds.length
          observationTokens = append(responseIds, next.ids, options.maxInputLength - before)
          for (let i = 0; i < observationTokens; i++) {
            lossMask.push(0)
            rolloutLogprobs.push(0)
          }
          if (observationTokens < next.ids.length) {
            overflow = new OverlongError({ length: before + next.ids.length, maxInputLength: options.maxInputLength })
          }
        }
        turns.push({
          ...turnBase,
          reward: step.reward,
          toolCalls: step.metadata.toolCalls,
          ...(step.metadata.parseError === undefined ? {} : { parseError: step.metadata.parseError }),
          observationTokens,
          envMs
        })
        if (overflow !== undefined) return yield* overflow
        if (step.done) {
          const reason = step.metadata.stopReason
          stopReason =
            reason === undefined || reason === "answer" ? "stop" : reason === "max_turns" ? "max_turns" : "env_done"
          envMetrics = yield* env.metrics
          return
        }
      }
      stopReason = "max_turns"
      envMetrics = yield* env.metrics
    })
  )

  yield* episode.pipe(
    Effect.catch((e: OverlongError | EnvError | InferenceError | TokenizerError | ChatTemplatePrefixError) =>
      Effect.sync(() => {
        if (e._tag === "OverlongError") {
          stopReason = "overlong"
          return
        }
        stopReason = "error"
        error = `${e._tag}: ${e.message}`
      })
    )
  )

  const trajectory: Trajectory = {
    id: `${uid}/${sample}`,
    promptUid: uid,
    sample,
    promptIds,
    responseIds,
    lossMask,
    rolloutLogprobs,
    turns,
    reward: turns.reduce((sum, t) => sum + t.reward, 0),
    stopReason,
    ...(error === undefined ? {} : { error }),
    envMetrics,
    ...(stepWise ? { steps } : {})
  }
  return trajectory
})
