/**
 * Rewards from a dataset row's `reward_spec` (SkyRL's `{ method, ground_truth }`). Method `"rule"` is built in: the
 * ground truth (`RuleGroundTruth`) names what success is: an answer, tools that must be called, a sequence of calls.
 * Method `"judge"` pays nothing per episode: the LLM judge scores the finished group (`GroupJudge`). Any other method
 * is a reward function the user registered under that name (`register`).
 *
 * The rule reward of a finished episode is
 *   R = w_answer · outcome + w_tool_sequence · tool_sequence_match + w_format · format_ok  (+ the step's per-turn reward)
 * where `outcome` is 1 iff every criterion the row names holds (answer correct, required tools called, the tool
 * sequence fully matched), `tool_sequence_match` ∈ [0, 1] is the partial credit for the sequence, and `format_ok` is
 * 1 iff the episode ended with a non-empty answer and no unparsable tool-call attempt. Defaults: w_answer = 1, the
 * others 0, so a row that gives only `answer` is scored 1/0 on the answer, as SkyRL's rule rewards are.
 *
 * Departures and choices, on purpose:
 * 1. Only calls that succeeded (`isError` false) count as "called": a call the tool rejected did not do the work.
 * 2. `weights.answer` weighs the outcome, not the answer alone, so a row without `answer` (only `tool_sequence` or
 *    `must_call_tool`) still earns 1 on success with the default weights.
 * 3. A bare string, number or array of them as ground truth means `{ answer: <it> }` (SkyRL's gsm8k rows look like
 *    this); an array lists accepted answers.
 * 4. Per-turn rewards (`per_turn`) are paid for `Episode.stepCalls`, the calls of the step being scored.
 */
import { Effect, Schema } from "effect"
import { NonNegative, withDefault } from "../config/Field.ts"
import type { RewardSpec } from "../domain/PromptRow.ts"
import type { ToolCallRecord } from "../domain/ToolCall.ts"

// ---------------------------------------------------------------------------------------------------------------
// The ground truth of method "rule".

/** A number sets both: |a − b| ≤ max(absolute, relative · max(|a|, |b|)). */
export const Tolerance = Schema.Union([
  NonNegative,
  Schema.Struct({ absolute: NonNegative.pipe(withDefault(0)), relative: NonNegative.pipe(withDefault(0)) })
])
export type Tolerance = typeof Tolerance.Type

/** One expected call. `tool` may be namespaced `server__tool`; `arguments` must be a subset of the call's. */
export const ExpectedCall = Schema.Struct({
  tool: Schema.NonEmptyString,
  server: Schema.optionalKey(Schema.NonEmptyString),
  arguments: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown))
})
export type ExpectedCall = typeof ExpectedCall.Type

export const RuleGroundTruth = Schema.Struct({
  must_call_tool: Schema.optionalKey(Schema.Union([Schema.NonEmptyString, Schema.Array(Schema.NonEmptyString)])),
  tool_sequence: Schema.optionalKey(Schema.Array(ExpectedCall)),
  // strict: the successful calls are exactly the sequence; subsequence: in this order, other calls between allowed;
  // any: each expected call matched by a distinct call, in any order.
  order: Schema.Literals(["strict", "subsequence", "any"]).pipe(withDefault("subsequence")),
  // one answer, or several that are all accepted (aliases: "NYC", "New York City")
  answer: Schema.optionalKey(
    Schema.Union([
      Schema.String,
      Schema.Finite,
      Schema.Array(Schema.Union([Schema.String, Schema.Finite])).check(Schema.isMinLength(1))
    ])
  ),
  // exact: equal after trimming; normalized: case, spacing, currency signs and thousands separators ignored, numbers
  // compared as numbers; numeric: the number in the answer (\boxed{}, "#### n", else the last one) within tolerance.
  answer_match: Schema.Literals(["exact", "normalized", "numeric"]).pipe(withDefault("normalized")),
  tolerance: Tolerance.pipe(withDefault(1e-6)), // for answers and for numeric arguments in tool_sequence
  format_reward: Schema.optionalKey(Schema.Finite), // shorthand for weights.format
  weights: Schema.Struct({
    answer: NonNegative.pipe(withDefault(1)), // weighs the outcome (every criterion met)
    tool_sequence: NonNegative.pipe(withDefault(0)),
    format: Schema.optionalKey(NonNegative)
  }).pipe(withDefault({})),
  per_turn: Schema.Struct({
    successful_call: Schema.Finite.pipe(withDefault(0)), // paid per call that succeeded on the step
    failed_call: Schema.Finite.pipe(withDefault(0)) // per call the tool rejected (negative to discourage)
  }).pipe(withDefault({}))
}).check(
  Schema.makeFilter(
    (g) =>
      g.answer !== undefined ||
      g.tool_sequence !== undefined ||
      g.must_call_tool !== undefined || {
        path: [],
        issue: "names no criterion: give answer, tool_sequence or must_call_tool"
      }
  ),
  Schema.makeFilter(
    (g) =>
      g.format_reward === undefined ||
      g.weights.format === undefined || {
        path: ["format_reward"],
        issue: "give format_reward or weights.format, not both"
      }
  )
)
export type RuleGroundTruth = typeof RuleGroundTruth.Type

// ---------------------------------------------------------------------------------------------------------------
// Episodes, results, errors.

/** What the environment knows when it asks for a reward. */
export interface Episode {
  /** Every call executed so far in the episode, in order. */
  readonly calls: ReadonlyArray<ToolCallRecord>
  /** The model's final answer, once it gave one. */
  readonly finalAnswer: string | undefined
  /** 0-based index of the step being scored. */
  readonly turn: number
  /** True on the episode's last step: the final reward is paid then. */
  readonly done: boolean
  /** The calls executed on this step; per-turn rewards are paid for them. Absent: none. */
  readonly stepCalls?: ReadonlyArray<ToolCallRecord>
  /** Tool-call attempts in the episode that could not be parsed (`ToolCallParser`'s `error`). Absent: 0. */
  readonly parseFailures?: number
}

export interface RewardResult {
  readonly reward: number
  /** A reward function may end the episode (e.g. once it is solved). */
  readonly done?: boolean
  /** `reward/<name>` → value, on the final step. */
  readonly metrics: Record<string, number>
}

/** The parts of a rule reward. Keys for criteria the row does not name are absent, so means stay honest. */
export interface Score {
  readonly outcome: number // 1 iff every named criterion holds
  readonly format_ok: number
  readonly answer_correct?: number
  readonly tool_sequence_match?: number // ∈ [0, 1]
  readonly must_call_ok?: number
}

/** A reward spec that cannot be evaluated: unknown method, bad ground truth (a dataset problem), or a failing function. */
export class RewardError extends Schema.TaggedError<RewardError>()("RewardError", {
  method: Schema.String,
  reason: Schema.Literals(["UnknownMethod", "BadGroundTruth", "FunctionFailed"]),
  message: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {}

/**
 * A user reward, registered by name and called on every step with the row's ground truth. Return 0 until
 * `episode.done` unless you want per-turn rewards. A number is `{ reward, metrics: {} }`.
 */
export type RewardFn = (
  groundTruth: unknown,
  episode: Episode
) => number | RewardResult | Effect.Effect<number | RewardResult, RewardError>

// ---------------------------------------------------------------------------------------------------------------
// Registry.

const registry = new Map<string, RewardFn>()

/**
 * Makes `fn` the reward of rows whose `reward_spec.method` is `name`; a later registration replaces it.
 * **Gotcha:** the registry is process-wide; register at startup, before rollouts begin. `"rule"` and `"judge"` are reserved.
 */
export const register = (name: string, fn: RewardFn): void => {
  if (name === "rule") throw new Error('Rewards.register: "rule" is the built-in rule reward and cannot be replaced')
  if (name === "judge")
    throw new Error('Rewards.register: "judge" is the built-in LLM group judge and cannot be replaced')
  registry.set(name, fn)
}

// ---------------------------------------------------------------------------------------------------------------
// Evaluation.

/**
 * The reward for the step just taken: on a step that is not the last, the per-turn reward only; on the last, the
 * final reward (plus that step's per-turn reward) and `reward/*` metrics. No spec: reward 0.
 */
export const evaluate = Effect.fn("Rewards.evaluate")(function* (
  spec: RewardSpec | undefined,
  episode: Episode
): Effect.fn.Return<RewardResult, RewardError> {
  if (spec === undefined) return { reward: 0, metrics: {} }
  // the group judge (GroupJudge) pays these rows once their whole group is done; the episode itself pays nothing
  if (spec.method === "judge") return { reward: 0, metrics: {} }
  if (spec.method !== "rule") return yield* callRegistered(spec, episode)
  const truth = yield* decodeGroundTruth(spec.ground_truth)
  const perTurn = perTurnReward(truth, episode.stepCalls ?? [])
  if (!episode.done) return { reward: perTurn, metrics: {} }
  const parts = score(truth, episode)
  const ruleReward = finalReward(truth, parts)
  const metrics: Record<string, number> = { "reward/rule": ruleReward }
  for (const [key, value] of Object.entries(parts)) metrics[`reward/${key}`] = value
  return { reward: ruleReward + perTurn, metrics }
})

/** Decodes `ground_truth` for method "rule"; a bare string, number or array of them is the answer. */
export const decodeGroundTruth = (groundTruth: unknown): Effect.Effect<RuleGroundTruth, RewardError> => {
  if (groundTruth === undefined) {
    return Effect.fail(
      new RewardError({ method: "rule", reason: "BadGroundTruth", message: 'method "rule" needs a ground_truth' })
    )
  }
  const input =
    typeof groundTruth === "string" || typeof groundTruth === "number" || Array.isArray(groundTruth)
      ? { answer: groundTruth }
      : groundTruth
  return Schema.decodeUnknownEffect(RuleGroundTruth)(input, { errors: "all", onExcessProperty: "error" }).pipe(
    Effect.mapError(
      (e) => new RewardError({ method: "rule", reason: "BadGroundTruth", message: `ground_truth: ${e.message}` })
    )
  )
}

/** The parts of the rule reward for an episode (see the module header). */
export const score = (
  truth: RuleGroundTruth,
  episode: Pick<Episode, "calls" | "finalAnswer" | "parseFailures">
): Score => {
  const succeeded = episode.calls.filter((call) => !call.isError)
  const tolerance = toleranceOf(truth.tolerance)
  const final = episode.finalAnswer
  const answerCorrect =
    truth.answer === undefined
      ? undefined
      : bit(
          final !== undefined &&
            toArray(truth.answer).some((a) => answerMatches(a, final, truth.answer_match, tolerance))
        )
  const sequence =
    truth.tool_sequence === undefined
      ? undefined
      : sequenceMatch(truth.tool_sequence, succeeded, truth.order, tolerance)
  const mustCall =
    truth.must_call_tool === undefined
      ? undefined
      : bit(
          toArray(truth.must_call_tool).every((tool) =>
            succeeded.some((call) => callMatches({ tool }, call, tolerance))
          )
        )
  const outcome = bit(answerCorrect !== 0 && (sequence === undefined || sequence === 1) && mustCall !== 0)
  const formatOk = bit((episode.finalAnswer ?? "").trim() !== "" && (episode.parseFailures ?? 0) === 0)
  return {
    outcome,
    format_ok: formatOk,
    ...(answerCorrect === undefined ? {} : { answer_correct: answerCorrect }),
    ...(sequence === undefined ? {} : { tool_sequence_match: sequence }),
    ...(mustCall === undefined ? {} : { must_call_ok: mustCall })
  }
}

const finalReward = (truth: RuleGroundTruth, parts: Score): number =>
  truth.weights.answer * parts.outcome +
  truth.weights.tool_sequence * (parts.tool_sequence_match ?? 0) +
  (truth.weights.format ?? truth.format_reward ?? 0) * parts.format_ok

const perTurnReward = (truth: RuleGroundTruth, calls: ReadonlyArray<ToolCallRecord>): number =>
  calls.reduce((sum, call) => sum + (call.isError ? truth.per_turn.failed_call : truth.per_turn.successful_call), 0)

const callRegistered = (spec: RewardSpec, episode: Episode): Effect.Effect<RewardResult, RewardError> => {
  const fn = registry.get(spec.method)
  if (fn === undefined) {
    const known = ["rule", "judge", ...[...registry.keys()].sort()].map((name) => `"${name}"`).join(", ")
    return Effect.fail(
      new RewardError({
        method: spec.method,
        reason: "UnknownMethod",
        message: `unknown reward method "${spec.method}"; registered: ${known}`
      })
    )
  }
  const failed = (cause: unknown) =>
    new RewardError({
      method: spec.method,
      reason: "FunctionFailed",
      message: `reward function "${spec.method}" threw`,
      cause
    })
  return Effect.try({ try: () => fn(spec.ground_truth, episode), catch: failed }).pipe(
    Effect.flatMap((out) => (Effect.isEffect(out) ? out : Effect.succeed(out))),
    Effect.map((out): RewardResult => (typeof out === "number" ? { reward: out, metrics: {} } : out)),
    Effect.flatMap((out) =>
      Number.isFinite(out.reward)
        ? Effect.succeed(out)
        : Effect.fail(
            new RewardError({
              method: spec.method,
              reason: "FunctionFailed",
              message: `reward function "${spec.method}" returned a non-finite reward (${out.reward})`
            })
          )
    )
  )
}

// ---------------------------------------------------------------------------------------------------------------
// Matching calls.

interface Closeness {
  readonly absolute: number
  readonly relative: number
}

const toleranceOf = (t: Tolerance): Closeness => (typeof t === "number" ? { absolute: t, relative: t } : t)

const close = (a: number, b: number, t: Closeness): boolean =>
  Math.abs(a - b) <= Math.max(t.absolute, t.relative * Math.max(Math.abs(a), Math.abs(b)))

/** `server__tool` → { server, tool }; a name without `__` has no server. */
const splitName = (name: string): { readonly server?: string; readonly tool: string } => {
  const at = name.indexOf("__")
  return at <= 0 ? { tool: name } : { server: name.slice(0, at), tool: name.slice(at + 2) }
}

/** Same tool (bare or namespaced on either side), same server when one is expected, expected arguments a subset. */
const callMatches = (
  expected: Pick<ExpectedCall, "tool" | "server" | "arguments">,
  call: ToolCallRecord,
  t: Closeness
): boolean => {
  const want = splitName(expected.tool)
  const got = splitName(call.tool)
  const wantServer = expected.server ?? want.server
  const gotServer = call.server ?? got.server
  const sameTool = expected.tool === call.tool || want.tool === got.tool
  if (!sameTool || (wantServer !== undefined && wantServer !== gotServer)) return false
  return expected.arguments === undefined || isSubset(expected.arguments, call.arguments, t)
}

/**
 * `expected` is contained in `actual`: object keys recursively, arrays element by element (same length), numbers
 * within tolerance (a numeric string counts as its number: models often quote them), everything else equal.
 */
const isSubset = (expected: unknown, actual: unknown, t: Closeness): boolean => {
  const wantNumber = asNumber(expected)
  if (typeof expected === "number" || (typeof actual === "number" && wantNumber !== undefined)) {
    const gotNumber = asNumber(actual)
    return wantNumber !== undefined && gotNumber !== undefined && close(wantNumber, gotNumber, t)
  }
  if (Array.isArray(expected)) {
    return (
      Array.isArray(actual) &&
      actual.length === expected.length &&
      expected.every((item, i) => isSubset(item, actual[i], t))
    )
  }
  if (typeof expected === "object" && expected !== null) {
    if (typeof actual !== "object" || actual === null || Array.isArray(actual)) return false
    const record = actual as Record<string, unknown>
    return Object.entries(expected).every(([key, value]) => key in record && isSubset(value, record[key], t))
  }
  return expected === actual
}

const asNumber = (value: unknown): number | undefined => {
  if (typeof value === "number") return Number.isFinite(value) ? value : undefined
  if (typeof value !== "string" || !NUMBER.test(value.trim())) return undefined
  return Number(value.trim())
}

const NUMBER = /^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i

/** Partial credit ∈ [0, 1] for the expected sequence against the calls that succeeded. */
const sequenceMatch = (
  expected: ReadonlyArray<ExpectedCall>,
  calls: ReadonlyArray<ToolCallRecord>,
  order: RuleGroundTruth["order"],
  t: Closeness
): number => {
  const n = expected.length
  const m = calls.length
  const match = (i: number, j: number) => callMatches(expected[i]!, calls[j]!, t)
  switch (order) {
    case "strict": {
      // matched prefix / max(n, m): an extra or missing call costs as much as a wrong one
      if (Math.max(n, m) === 0) return 1
      let k = 0
      while (k < Math.min(n, m) && match(k, k)) k++
      return k / Math.max(n, m)
    }
    case "subsequence": {
      // longest common subsequence of expected steps and calls / n
      if (n === 0) return 1
      let previous = new Array<number>(m + 1).fill(0)
      for (let i = 0; i < n; i++) {
        const row = new Array<number>(m + 1).fill(0)
        for (let j = 0; j < m; j++) row[j + 1] = match(i, j) ? previous[j]! + 1 : Math.max(previous[j + 1]!, row[j]!)
        previous = row
      }
      return previous[m]! / n
    }
    case "any": {
      // maximum bipartite matching (augmenting paths): each call serves one expected step
      if (n === 0) return 1
      const owner = new Array<number>(m).fill(-1) // call j → expected step it serves
      const assign = (i: number, seen: Array<boolean>): boolean => {
        for (let j = 0; j < m; j++) {
          if (seen[j] || !match(i, j)) continue
          seen[j] = true
          if (owner[j] === -1 || assign(owner[j]!, seen)) {
            owner[j] = i
            return true
          }
        }
        return false
      }
      let matched = 0
      for (let i = 0; i < n; i++) if (assign(i, new Array<boolean>(m).fill(false))) matched++
      return matched / n
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Matching answers.

const answerMatches = (
  expected: string | number,
  actual: string,
  mode: RuleGroundTruth["answer_match"],
  t: Closeness
): boolean => {
  switch (mode) {
    case "exact":
      return String(expected).trim() === actual.trim()
    case "normalized": {
      const want = normalize(String(expected))
      const got = normalize(actual)
      if (want === got) return true
      const a = asNumber(want)
      const b = asNumber(got)
      return a !== undefined && b !== undefined && close(a, b, t)
    }
    case "numeric": {
      const want = typeof expected === "number" ? expected : extractNumber(expected)
      const got = extractNumber(actual)
      return want !== undefined && got !== undefined && close(want, got, t)
    }
  }
}

/** Lower case, one space between words, no currency signs or thousands separators, no wrapping quotes or final stop. */
const normalize = (text: string): string =>
  text
    .toLowerCase()
    .replace(/[$€£¥]/g, "")
    .replace(/(\d),(?=\d{3}(\D|$))/g, "$1")
    .replace(/\s+/g, " ")
    .trim()
    .replace(/^["'`]+|["'`]+$/g, "")
    .replace(/[.!。]+$/, "")
    .trim()

/** The answer's number: inside `\boxed{}`, after `####`, else the last number in the text. */
const extractNumber = (text: string): number | undefined => {
  const boxed = /\\boxed\{([^{}]*)\}/.exec(text)?.[1]
  const marked = /####\s*(.*)$/m.exec(text)?.[1]
  const source = (boxed ?? marked ?? text).replace(/(\d),(?=\d{3}(\D|$))/g, "$1")
  const numbers = source.match(/[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?/gi)
  const last = numbers?.at(boxed !== undefined || marked !== undefined ? 0 : -1)
  return last === undefined ? undefined : Number(last)
}

const toArray = <A>(value: A | ReadonlyArray<A>): ReadonlyArray<A> => (Array.isArray(value) ? value : [value as A])

const bit = (condition: boolean): number => (condition ? 1 : 0)
