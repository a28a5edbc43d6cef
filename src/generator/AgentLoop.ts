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
 *
 * Chat mode (`chat`, `generator.engine.chat`, a remote engine): each turn is the conversation so far as OpenAI
 * `messages` + the env's `tools`, sent to the server's `/v1/chat/completions`; the server renders the prompt with its
 * own chat template, samples, and reads the tool calls (vLLM's `--tool-call-parser hermes`), which the env runs as
 * given (`env.step(text, toolCalls)`). The server answers with the prompt ids it rendered and the ids and log-probs it
 * sampled, and the trajectory is built from those ids, never from a re-tokenisation:
 *   turn 0:       promptIds = the server's prompt ids
 *   turn k > 0:   the server's prompt ids must extend the row so far (prompt + responses + observations); the ids
 *                 past it (the observations as the server's template rendered them, and its generation prompt) are
 *                 appended with lossMask 0 and counted on turn k − 1 (`observationTokens`)
 *   otherwise:    the template rendered the history differently from what the row holds (it rewrote an earlier turn:
 *                 Qwen3's `<think>` stripping, tool calls printed in its own format), so one row cannot hold the
 *                 trajectory exactly. The trajectory is kept step-wise instead: every turn a row of its own whose
 *                 prompt is the server's prompt ids for that turn (`steps`; `responseIds` then holds only generated
 *                 tokens), as `stepWise` asks for from the start.
 * The context limit is checked before each call on the history rendered with our own tokenizer (the served model's),
 * and after it on the server's prompt: a server prompt that leaves no room ends the trajectory `overlong`.
 */
import { Clock, Effect, Exit, Schedule, Schema, type Tracer } from "effect"
import { type InferenceError, PolicyDivergedError } from "../domain/Errors.ts"
import type { Message } from "../domain/Message.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import * as Spans from "../domain/Spans.ts"
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
  /** each turn through the engine's chat path (`InferenceEngine.chat`): the server renders and parses */
  readonly chat?: boolean
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

/**
 * Run one trajectory of `row`. Infrastructure failures end it with stop reason `error`; it fails only when the policy
 * sampled a non-finite log-prob (PolicyDivergedError), which no trajectory can carry.
 */
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
  const chat = options.chat === true
  /** chat mode: the generated tokens alone, each turn's [start, end) in them, and whether the row broke (above) */
  const generated: Array<number> = []
  const generatedLogprobs: Array<number> = []
  const generatedSpans: Array<readonly [number, number]> = []
  let rewritten = false
  let stepContext: Array<number> = []
  let stopReason: StopReason = "max_turns"
  let error: string | undefined
  let envMetrics: Record<string, number> = {}

  // each turn's span (`agent.turn`), ended when the next turn starts or the episode ends; the env's tool calls are its
  // children
  let turnSpan: Tracer.Span | undefined
  const endTurn = Effect.suspend(() => {
    const span = turnSpan
    turnSpan = undefined
    return span === undefined ? Effect.void : Effect.map(Clock.currentTimeNanos, (now) => span.end(now, Exit.void))
  })

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

      const chatTurn = engine.chat
      if (chat && chatTurn === undefined) {
        return yield* Effect.die(
          new Error("AgentLoop: chat mode needs an engine with a chat path (engine.kind remote)")
        )
      }

      for (let turn = 0; turn < options.maxTurns; turn++) {
        yield* endTurn
        turnSpan = yield* Effect.makeSpan(Spans.names.turn, {
          attributes: { "trajectory.sample": sample, "turn.index": turn }
        })
        if (stepWise && !chat)
          stepContext = turn === 0 ? [...promptIds] : yield* tokenizer.applyChatTemplateIds(history, templateOptions)
        // chat: the history as our tokenizer renders it, to size the request (the server's own rendering is checked after)
        const context = chat
          ? turn === 0
            ? rendered.length
            : (yield* tokenizer.applyChatTemplateIds(history, templateOptions)).length
          : stepWise
            ? stepContext.length
            : promptIds.length + responseIds.length
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
        const trajectoryId = `${uid}/${sample}`
        const retrying = { schedule: inferenceRetry, while: (e: InferenceError) => e.isRetryable }
        const chatResult = chat
          ? yield* chatTurn!({
              messages: history,
              ...(tools === undefined ? {} : { tools }),
              sampling,
              trajectoryId
            }).pipe(Effect.retry(retrying))
          : undefined
        const [result] =
          chatResult !== undefined
            ? [chatResult]
            : yield* engine
                .generate([
                  { promptIds: stepWise ? stepContext : promptIds.concat(responseIds), sampling, trajectoryId }
                ])
                .pipe(Effect.retry(retrying))
        const llmMs = (yield* Clock.currentTimeMillis) - llmStart
        if (chatResult !== undefined) {
          const served = chatResult.promptIds
          if (served.length + chatResult.tokens.length > options.maxInputLength) {
            return yield* new OverlongError({
              length: served.length + chatResult.tokens.length,
              maxInputLength: options.maxInputLength
            })
          }
          if (turn === 0) {
            promptIds.length = 0
            append(promptIds, served)
          } else if (!rewritten) {
            const held = promptIds.length + responseIds.length
            let extends_ = served.length >= held
            for (let i = 0; extends_ && i < held; i++) {
              extends_ = served[i] === (i < promptIds.length ? promptIds[i] : responseIds[i - promptIds.length])
            }
            if (extends_) {
              // the observations (and the generation prompt) as the server's template rendered them
              for (let i = held; i < served.length; i++) {
                responseIds.push(served[i]!)
                lossMask.push(0)
                rolloutLogprobs.push(0)
              }
              const previous = turns[turns.length - 1]!
              turns[turns.length - 1] = { ...previous, observationTokens: served.length - held }
            } else rewritten = true
          }
          steps.push({ promptIds: served, responseIds: chatResult.tokens, rolloutLogprobs: chatResult.logprobs })
          generatedSpans.push([generated.length, generated.length + chatResult.tokens.length])
          append(generated, chatResult.tokens)
          append(generatedLogprobs, chatResult.logprobs)
        }
        const diverged = result!.logprobs.find((lp) => !Number.isFinite(lp))
        if (diverged !== undefined) {
          return yield* new PolicyDivergedError({
            version: result!.policyVersionLast,
            prompt: uid,
            logprob: String(diverged)
          })
        }
        const start = responseIds.length
        append(responseIds, result!.tokens)
        append(rolloutLogprobs, result!.logprobs)
        for (let i = 0; i < result!.tokens.length; i++) lossMask.push(1)
        const end = responseIds.length
        if (stepWise && !chat)
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
        const step = yield* env.step(text, chatResult?.toolCalls).pipe(Effect.withParentSpan(turnSpan))
        const envMs = (yield* Clock.currentTimeMillis) - envStart
        // chat: the assistant message as the server read it, which its template renders back next turn
        history.push(
          chatResult === undefined
            ? { role: "assistant", content: text }
            : {
                role: "assistant",
                content: chatResult.content ?? "",
                ...(chatResult.toolCalls.length === 0 ? {} : { tool_calls: chatResult.toolCalls })
              }
        )
        let observationTokens = 0
        let overflow: OverlongError | undefined
        if ((stepWise || chat) && !step.done) append(history, step.observations)
        if (!stepWise && !chat && !step.done && turn + 1 < options.maxTurns && step.observations.length > 0) {
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
    Effect.ensuring(endTurn),
    Effect.catchIf(
      (e): e is OverlongError | EnvError | InferenceError | TokenizerError | ChatTemplatePrefixError =>
        e._tag !== "PolicyDivergedError",
      (e) =>
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

  // chat mode kept step-wise (asked for, or the server's template rewrote the history): the generated tokens alone
  if (chat && (stepWise || rewritten)) {
    const stepTurns = turns.map((t, i) => ({
      ...t,
      start: generatedSpans[i]![0],
      end: generatedSpans[i]![1],
      observationTokens: 0
    }))
    return {
      id: `${uid}/${sample}`,
      promptUid: uid,
      sample,
      promptIds,
      responseIds: generated,
      lossMask: generated.map((): 0 | 1 => 1),
      rolloutLogprobs: generatedLogprobs,
      turns: stepTurns,
      reward: turns.reduce((sum, t) => sum + t.reward, 0),
      stopReason,
      ...(error === undefined ? {} : { error }),
      envMetrics,
      steps
    } satisfies Trajectory
  }
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
    ...(stepWise && !chat ? { steps } : {})
  }
  return trajectory
})
