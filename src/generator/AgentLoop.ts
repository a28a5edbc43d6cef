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
import type { Message, ToolCallWire } from "../domain/Message.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import * as Spans from "../domain/Spans.ts"
import type { Step, StopReason, Trajectory, Turn } from "../domain/Trajectory.ts"
import type { Env, EnvError, FunctionTool, StepResult } from "../env/Env.ts"
import { EnvRegistry } from "../env/EnvRegistry.ts"
import {
  type ChatResult,
  type GenerateResult,
  InferenceEngine,
  type SamplingParams
} from "../inference/InferenceEngine.ts"
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

/** Whether a served prompt starts with the row so far (`promptIds` then `responseIds`): it extends the row. */
export const extendsRow = (
  served: ReadonlyArray<number>,
  promptIds: ReadonlyArray<number>,
  responseIds: ReadonlyArray<number>
): boolean => {
  const held = promptIds.length + responseIds.length
  if (served.length < held) return false
  for (let i = 0; i < held; i++) {
    if (served[i] !== (i < promptIds.length ? promptIds[i] : responseIds[i - promptIds.length])) return false
  }
  return true
}

/** The trajectory under construction: what the phases below append to, turn by turn. */
interface Rollout {
  readonly promptIds: Array<number>
  readonly responseIds: Array<number>
  readonly lossMask: Array<0 | 1>
  readonly rolloutLogprobs: Array<number>
  readonly turns: Array<Turn>
  readonly steps: Array<Step>
  /** chat mode: the generated tokens alone, each turn's [start, end) in them, and whether the row broke (above) */
  readonly generated: Array<number>
  readonly generatedLogprobs: Array<number>
  readonly generatedSpans: Array<readonly [number, number]>
  rewritten: boolean
  /** step-wise mode: this turn's context, the whole history re-rendered */
  stepContext: Array<number>
  stopReason: StopReason
  error: string | undefined
  envMetrics: Record<string, number>
  /** each turn's span (`agent.turn`), ended when the next turn starts or the episode ends; the env's tool calls are its
   * children */
  turnSpan: Tracer.Span | undefined
}

const emptyRollout = (): Rollout => ({
  promptIds: [],
  responseIds: [],
  lossMask: [],
  rolloutLogprobs: [],
  turns: [],
  steps: [],
  generated: [],
  generatedLogprobs: [],
  generatedSpans: [],
  rewritten: false,
  stepContext: [],
  stopReason: "max_turns",
  error: undefined,
  envMetrics: {},
  turnSpan: undefined
})

/** What every phase of one episode reads: the services, the options, the env and the conversation so far. */
interface Episode {
  readonly engine: InferenceEngine["Service"]
  readonly tokenizer: Tokenizer["Service"]
  readonly options: Options
  readonly uid: string
  readonly sample: number
  readonly stepWise: boolean
  readonly chat: boolean
  readonly env: Env
  readonly tools: ReadonlyArray<FunctionTool> | undefined
  readonly templateOptions: { readonly addGenerationPrompt: true; readonly tools?: ReadonlyArray<FunctionTool> }
  readonly history: Array<Message>
  /** the env's initial messages rendered with our tokenizer (turn 0's context) */
  readonly rendered: ReadonlyArray<number>
  readonly rollout: Rollout
}

/** One turn's engine call and what it gave: `chatResult` set in chat mode (then `result` is the same object). */
interface Sampled {
  readonly result: GenerateResult
  readonly chatResult: ChatResult | undefined
  readonly llmMs: number
}

/** The policy's reply as the env reads it (`toolCalls`: read out by the server, chat) and as the history keeps it. */
interface Reply {
  readonly text: string
  readonly toolCalls: ReadonlyArray<ToolCallWire> | undefined
  readonly message: Message
}

/** A turn's record before the env has answered. */
type TurnBase = Omit<Turn, "reward" | "toolCalls" | "parseError" | "observationTokens" | "envMs">

/**
 * Run one trajectory of `row`. Infrastructure failures end it with stop reason `error`; it fails only when the policy
 * sampled a non-finite log-prob (PolicyDivergedError), which no trajectory can carry.
 */
export const run = Effect.fn("AgentLoop.run")(function* (row: PromptRow, sample: number, options: Options) {
  const engine = yield* InferenceEngine
  const tokenizer = yield* Tokenizer
  const registry = yield* EnvRegistry
  const uid = row.uid ?? "prompt"
  const rollout = emptyRollout()

  const episode = Effect.scoped(
    Effect.gen(function* () {
      const env = yield* registry.make(row.env_class, row)
      const ep = yield* open({ engine, tokenizer, options, uid, sample, env, rollout }, row)
      for (let turn = 0; turn < options.maxTurns; turn++) {
        if ((yield* takeTurn(ep, turn)) === "ended") return
      }
      rollout.stopReason = "max_turns"
      rollout.envMetrics = yield* env.metrics
    })
  )

  yield* episode.pipe(
    Effect.ensuring(endTurn(rollout)),
    Effect.catchIf(
      (e): e is OverlongError | EnvError | InferenceError | TokenizerError | ChatTemplatePrefixError =>
        e._tag !== "PolicyDivergedError",
      (e) =>
        Effect.sync(() => {
          if (e._tag === "OverlongError") {
            rollout.stopReason = "overlong"
            return
          }
          rollout.stopReason = "error"
          rollout.error = `${e._tag}: ${e.message}`
        })
    )
  )
  return trajectory(rollout, uid, sample, options)
})

/** Ends the current turn's span, if one is open. */
const endTurn = (rollout: Rollout) =>
  Effect.suspend(() => {
    const span = rollout.turnSpan
    rollout.turnSpan = undefined
    return span === undefined ? Effect.void : Effect.map(Clock.currentTimeNanos, (now) => span.end(now, Exit.void))
  })

/** Starts the env's conversation and renders the prompt once; a prompt past the context limit is kept cut at it. */
const open = (
  base: Pick<Episode, "engine" | "tokenizer" | "options" | "uid" | "sample" | "env" | "rollout">,
  row: PromptRow
) =>
  Effect.gen(function* () {
    const { options, rollout } = base
    const init = yield* base.env.init(row.prompt)
    const tools: ReadonlyArray<FunctionTool> | undefined = init.metadata.tools
    const templateOptions = { addGenerationPrompt: true as const, ...(tools === undefined ? {} : { tools }) }
    const history: Array<Message> = [...init.messages]
    const rendered = yield* base.tokenizer.applyChatTemplateIds(history, templateOptions)
    append(rollout.promptIds, rendered, options.maxInputLength)
    if (rendered.length > options.maxInputLength) {
      return yield* new OverlongError({ length: rendered.length, maxInputLength: options.maxInputLength })
    }
    const chat = options.chat === true
    if (chat && base.engine.chat === undefined) {
      return yield* Effect.die(new Error("AgentLoop: chat mode needs an engine with a chat path (engine.kind remote)"))
    }
    const episode: Episode = {
      ...base,
      stepWise: options.stepWise === true,
      chat,
      tools,
      templateOptions,
      history,
      rendered
    }
    return episode
  })

/** One turn: render the context, sample, record the reply, cut at the context limit, step the env. */
const takeTurn = (ep: Episode, turn: number) =>
  Effect.gen(function* () {
    const rollout = ep.rollout
    yield* endTurn(rollout)
    const span = yield* Effect.makeSpan(Spans.names.turn, {
      attributes: { "trajectory.sample": ep.sample, "turn.index": turn }
    })
    rollout.turnSpan = span
    const { context, sampling } = yield* render(ep, turn)
    const sampled = yield* sampleTurn(ep, sampling)
    if (sampled.chatResult !== undefined) yield* spliceServedPrompt(ep, turn, sampled.chatResult)
    const turnBase = yield* record(ep, sampled)
    const reply = parse(ep, sampled)
    if (yield* cutByLength(ep, turnBase, sampling, context)) return "ended" as const
    return yield* stepEnv(ep, turn, reply, turnBase, span)
  })

/**
 * The next turn's context and its sampling parameters; no room left under the context limit ends the episode
 * `overlong`. Step-wise, the context is the whole history re-rendered.
 */
const render = (ep: Episode, turn: number) =>
  Effect.gen(function* () {
    const { options, rollout, tokenizer } = ep
    if (ep.stepWise && !ep.chat)
      rollout.stepContext =
        turn === 0 ? [...rollout.promptIds] : yield* tokenizer.applyChatTemplateIds(ep.history, ep.templateOptions)
    // chat: the history as our tokenizer renders it, to size the request (the server's own rendering is checked after)
    const context = ep.chat
      ? turn === 0
        ? ep.rendered.length
        : (yield* tokenizer.applyChatTemplateIds(ep.history, ep.templateOptions)).length
      : ep.stepWise
        ? rollout.stepContext.length
        : rollout.promptIds.length + rollout.responseIds.length
    const room = options.maxInputLength - context
    if (room <= 0) return yield* new OverlongError({ length: context, maxInputLength: options.maxInputLength })
    const sampling: SamplingParams = {
      maxNewTokens: Math.min(options.maxGenerateLength, room),
      temperature: options.temperature,
      topK: options.topK,
      topP: options.topP,
      stopTokenIds: tokenizer.eosIds,
      stopStrings: options.stopStrings,
      seed: requestSeed(options.seed, ep.uid, ep.sample, turn)
    }
    return { context, sampling }
  })

/** One engine call for the turn (the chat path in chat mode), retried while the failure is retryable. */
const sampleTurn = (ep: Episode, sampling: SamplingParams) =>
  Effect.gen(function* () {
    const { engine, rollout } = ep
    const llmStart = yield* Clock.currentTimeMillis
    const trajectoryId = `${ep.uid}/${ep.sample}`
    const retrying = { schedule: inferenceRetry, while: (e: InferenceError) => e.isRetryable }
    const chatResult = ep.chat
      ? yield* engine.chat!({
          messages: ep.history,
          ...(ep.tools === undefined ? {} : { tools: ep.tools }),
          sampling,
          trajectoryId
        }).pipe(Effect.retry(retrying))
      : undefined
    const [result] =
      chatResult !== undefined
        ? [chatResult]
        : yield* engine
            .generate([
              {
                promptIds: ep.stepWise ? rollout.stepContext : rollout.promptIds.concat(rollout.responseIds),
                sampling,
                trajectoryId
              }
            ])
            .pipe(Effect.retry(retrying))
    const llmMs = (yield* Clock.currentTimeMillis) - llmStart
    const sampled: Sampled = { result: result!, chatResult, llmMs }
    return sampled
  })

/**
 * Chat mode: the server's prompt ids into the trajectory. Turn 0 takes them as the prompt; a later turn's must extend
 * the row so far, and the ids past it are appended with lossMask 0; otherwise the row is `rewritten` (kept step-wise).
 * A server prompt that leaves no room for what it sampled ends the episode `overlong`.
 */
const spliceServedPrompt = (ep: Episode, turn: number, chatResult: ChatResult) =>
  Effect.gen(function* () {
    const { options, rollout } = ep
    const { promptIds, responseIds } = rollout
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
    } else if (!rollout.rewritten) {
      const held = promptIds.length + responseIds.length
      if (extendsRow(served, promptIds, responseIds)) {
        // the observations (and the generation prompt) as the server's template rendered them
        for (let i = held; i < served.length; i++) {
          responseIds.push(served[i]!)
          rollout.lossMask.push(0)
          rollout.rolloutLogprobs.push(0)
        }
        const previous = rollout.turns[rollout.turns.length - 1]!
        rollout.turns[rollout.turns.length - 1] = { ...previous, observationTokens: served.length - held }
      } else rollout.rewritten = true
    }
    rollout.steps.push({ promptIds: served, responseIds: chatResult.tokens, rolloutLogprobs: chatResult.logprobs })
    rollout.generatedSpans.push([rollout.generated.length, rollout.generated.length + chatResult.tokens.length])
    append(rollout.generated, chatResult.tokens)
    append(rollout.generatedLogprobs, chatResult.logprobs)
  })

/** The sampled tokens into the row (lossMask 1, behaviour log-probs kept); a non-finite log-prob fails the run. */
const record = (ep: Episode, { result, llmMs }: Sampled) =>
  Effect.gen(function* () {
    const { rollout } = ep
    const diverged = result.logprobs.find((lp) => !Number.isFinite(lp))
    if (diverged !== undefined) {
      return yield* new PolicyDivergedError({
        version: result.policyVersionLast,
        prompt: ep.uid,
        logprob: String(diverged)
      })
    }
    const start = rollout.responseIds.length
    append(rollout.responseIds, result.tokens)
    append(rollout.rolloutLogprobs, result.logprobs)
    for (let i = 0; i < result.tokens.length; i++) rollout.lossMask.push(1)
    const end = rollout.responseIds.length
    if (ep.stepWise && !ep.chat)
      rollout.steps.push({
        promptIds: rollout.stepContext,
        responseIds: result.tokens,
        rolloutLogprobs: result.logprobs
      })
    const turnBase: TurnBase = {
      start,
      end,
      finishReason: result.finishReason,
      policyVersionFirst: result.policyVersionFirst,
      policyVersionLast: result.policyVersionLast,
      ...(result.retries === undefined ? {} : { retries: result.retries }),
      llmMs
    }
    return turnBase
  })

/**
 * The reply as the env and the history read it: its text, the tool calls a server already read out of it (chat),
 * and the assistant message (chat: as the server read it, which its template renders back next turn).
 */
const parse = (ep: Episode, { result, chatResult }: Sampled): Reply => {
  const text = ep.tokenizer.decode(result.tokens, { skipSpecialTokens: true })
  const message: Message =
    chatResult === undefined
      ? { role: "assistant", content: text }
      : {
          role: "assistant",
          content: chatResult.content ?? "",
          ...(chatResult.toolCalls.length === 0 ? {} : { tool_calls: chatResult.toolCalls })
        }
  return { text, toolCalls: chatResult?.toolCalls, message }
}

/**
 * A reply cut by length ends the episode: `length` when max_generate_length cut it, `overlong` (a failure) when the
 * context limit did. True when it ended.
 */
const cutByLength = (ep: Episode, turnBase: TurnBase, sampling: SamplingParams, context: number) =>
  Effect.gen(function* () {
    const { options, rollout } = ep
    const { start, end } = turnBase
    if (
      turnBase.finishReason === "length" &&
      end - start >= sampling.maxNewTokens &&
      sampling.maxNewTokens < options.maxGenerateLength
    ) {
      // cut by the context limit, not by max_generate_length: the context is full
      rollout.turns.push({ ...turnBase, reward: 0, toolCalls: [], observationTokens: 0, envMs: 0 })
      return yield* new OverlongError({ length: context + (end - start), maxInputLength: options.maxInputLength })
    }
    if (turnBase.finishReason === "length") {
      rollout.turns.push({ ...turnBase, reward: 0, toolCalls: [], observationTokens: 0, envMs: 0 })
      rollout.stopReason = "length"
      return true
    }
    return false
  })

/** The env's answer to the reply: the history and row grow by its observations, and the turn is recorded. */
const stepEnv = (ep: Episode, turn: number, reply: Reply, turnBase: TurnBase, turnSpan: Tracer.Span) =>
  Effect.gen(function* () {
    const { env, rollout } = ep
    const envStart = yield* Clock.currentTimeMillis
    const step = yield* env.step(reply.text, reply.toolCalls).pipe(Effect.withParentSpan(turnSpan))
    const envMs = (yield* Clock.currentTimeMillis) - envStart
    ep.history.push(reply.message)
    if ((ep.stepWise || ep.chat) && !step.done) append(ep.history, step.observations)
    const { observationTokens, overflow } =
      !ep.stepWise && !ep.chat && !step.done && turn + 1 < ep.options.maxTurns && step.observations.length > 0
        ? yield* appendObservations(ep, step)
        : { observationTokens: 0, overflow: undefined }
    rollout.turns.push({
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
      rollout.stopReason =
        reason === undefined || reason === "answer" ? "stop" : reason === "max_turns" ? "max_turns" : "env_done"
      rollout.envMetrics = yield* env.metrics
      return "ended" as const
    }
    return "continue" as const
  })

/**
 * The observations' template tokens appended to the row (lossMask 0), cut at the context limit: the rest could never
 * be read by a next turn, and a cut (`overflow`) ends the episode `overlong` once the turn is recorded.
 */
const appendObservations = (ep: Episode, step: StepResult) =>
  Effect.gen(function* () {
    const { options, rollout } = ep
    const next = yield* ep.tokenizer.continuation(ep.history, step.observations, ep.templateOptions, {
      onHistoryRewrite: "alignByEndOfTurn"
    })
    append(ep.history, step.observations)
    const before = rollout.promptIds.length + rollout.responseIds.length
    const observationTokens = append(rollout.responseIds, next.ids, options.maxInputLength - before)
    for (let i = 0; i < observationTokens; i++) {
      rollout.lossMask.push(0)
      rollout.rolloutLogprobs.push(0)
    }
    const overflow =
      observationTokens < next.ids.length
        ? new OverlongError({ length: before + next.ids.length, maxInputLength: options.maxInputLength })
        : undefined
    return { observationTokens, overflow }
  })

/**
 * The finished trajectory. Chat mode kept step-wise (asked for, or the server's template rewrote the history) holds
 * the generated tokens alone.
 */
const trajectory = (rollout: Rollout, uid: string, sample: number, options: Options): Trajectory => {
  const stepWise = options.stepWise === true
  const chat = options.chat === true
  const { promptIds, turns, stopReason, error, envMetrics, steps } = rollout
  const assemble = (
    rows: Pick<Trajectory, "responseIds" | "lossMask" | "rolloutLogprobs" | "turns">,
    withSteps: boolean
  ): Trajectory => ({
    id: `${uid}/${sample}`,
    promptUid: uid,
    sample,
    promptIds,
    ...rows,
    reward: turns.reduce((sum, t) => sum + t.reward, 0),
    stopReason,
    ...(error === undefined ? {} : { error }),
    envMetrics,
    ...(withSteps ? { steps } : {})
  })
  if (chat && (stepWise || rollout.rewritten)) {
    const stepTurns = turns.map((t, i) => ({
      ...t,
      start: rollout.generatedSpans[i]![0],
      end: rollout.generatedSpans[i]![1],
      observationTokens: 0
    }))
    const { generated, generatedLogprobs } = rollout
    const lossMask = generated.map((): 0 | 1 => 1)
    return assemble({ responseIds: generated, lossMask, rolloutLogprobs: generatedLogprobs, turns: stepTurns }, true)
  }
  const { responseIds, lossMask, rolloutLogprobs } = rollout
  return assemble({ responseIds, lossMask, rolloutLogprobs, turns }, stepWise && !chat)
}
