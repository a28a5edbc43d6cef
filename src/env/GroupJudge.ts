/**
 * The group-relative LLM judge (`reward_spec.method: judge`, ART's RULER idea): the n trajectories of one prompt go
 * to one chat call, which scores each in [0, 1] against the others by a rubric (the row's `reward_spec.rubric`, else
 * `environment.judge.rubric`); the row's ground truth, when it has one, goes with them as the reference. Each score
 * is added to its trajectory's reward (on its last generated turn) and to `envMetrics["reward/judge"]`; the group
 * keeps the verdict (`TrajectoryGroup.judge`), with every call the judge made, so a replay answers them again.
 *
 * The judge is asked for `{"scores": {"t0": s0, …, "t<n-1>": s<n-1>}}` (with `response_format: json_schema` unless
 * `structured_output` is off). An answer that is not that JSON (malformed), names a trajectory that does not exist
 * or leaves one out (missing), or scores one outside [0, 1] (out of range) is counted and asked again, the rejected
 * answer and the reason appended to the conversation, up to `max_attempts` answers in all.
 *
 * Failure policy, on purpose: when no valid answer comes (or the endpoint fails after its own retries, or a replay
 * has no record), the group fails with a typed `JudgeError`, which is logged and recorded (`judge.failed`), and every
 * trajectory of the group gets `fallback_score`. Equal scores give the group zero advantage, so it adds no gradient
 * (the zero-variance filter drops it), but the step keeps its shape and the run goes on: a flaky judge never crashes
 * a run, and it shows in `judge/failed_groups`.
 *
 * Verdicts are cached by a hash of the first request (judge model, rubric, task, reference and the transcripts), in
 * memory and, with `cache_file`, in a JSONL file read at start (not in replay, which answers only from records).
 */
import { createHash } from "node:crypto"
import { Effect, FileSystem, Schema } from "effect"
import type { JudgeConfig } from "../config/EnvironmentConfig.ts"
import type { GroupJudgement, LlmCallRecord } from "../domain/LlmCall.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { Trajectory, TrajectoryGroup } from "../domain/Trajectory.ts"
import type { ChatClient, ChatMessage, ChatRequest } from "./ChatClient.ts"
import { canonicalJson } from "./ToolIo.ts"

/** No usable verdict for a group: the reason, the prompt, and the endpoint asked. */
export class JudgeError extends Schema.TaggedError<JudgeError>()("JudgeError", {
  promptUid: Schema.String,
  endpoint: Schema.String,
  reason: Schema.Literals(["Malformed", "OutOfRange", "Missing", "Endpoint", "ReplayMiss"]),
  attempts: Schema.Int,
  message: Schema.String
}) {}

/** What a judge answer is: scores for every trajectory, or why not. */
export type Verdict =
  | { readonly ok: true; readonly scores: ReadonlyArray<number> }
  | { readonly ok: false; readonly kind: "malformed" | "out_of_range" | "missing"; readonly detail: string }

export const methodName = "judge"

/** The settings the judge reads from `environment.judge`. */
export type Settings = Pick<
  JudgeConfig,
  "rubric" | "max_attempts" | "fallback_score" | "max_trajectory_chars" | "structured_output" | "cache" | "cache_file"
>

export interface GroupJudge {
  /** Whether the judge scores this row's groups (`reward_spec.method` is `judge`). */
  readonly applies: (row: PromptRow) => boolean
  /** The group with the judge's scores paid and its verdict attached. Never fails: see the failure policy. */
  readonly judge: (
    row: PromptRow,
    group: TrajectoryGroup,
    decode: (ids: ReadonlyArray<number>) => string
  ) => Effect.Effect<TrajectoryGroup>
}

// ---------------------------------------------------------------------------------------------------------------
// The prompt.

const idsOf = (n: number): Array<string> => Array.from({ length: n }, (_, i) => `t${i}`)

const cut = (text: string, limit: number) => (text.length <= limit ? text : `${text.slice(0, limit)}…[cut]`)

/** One trajectory as the judge reads it: each turn's generated text and the calls it made, with their results. */
export const transcript = (
  t: Trajectory,
  decode: (ids: ReadonlyArray<number>) => string,
  maxChars: number
): Record<string, unknown> => {
  const fields = Math.max(
    1,
    t.turns.reduce((n, turn) => n + 1 + turn.toolCalls.length, 0)
  )
  const limit = Math.max(64, Math.floor(maxChars / fields))
  const responseIds = t.steps === undefined ? t.responseIds : undefined
  const turns = t.turns.map((turn, k) => {
    const ids = responseIds !== undefined ? responseIds.slice(turn.start, turn.end) : (t.steps?.[k]?.responseIds ?? [])
    return {
      text: cut(decode(ids), limit),
      tool_calls: turn.toolCalls.map((c) => ({
        tool: c.tool,
        arguments: c.arguments,
        result: cut(c.result, limit),
        error: c.isError
      }))
    }
  })
  return { turns, stop: t.stopReason, ...(t.error === undefined ? {} : { error: cut(t.error, limit) }) }
}

const scoresFormat = (ids: ReadonlyArray<string>) => ({
  type: "json_schema",
  json_schema: {
    name: "judge_scores",
    strict: true,
    schema: {
      type: "object",
      properties: {
        scores: {
          type: "object",
          properties: Object.fromEntries(ids.map((id) => [id, { type: "number", minimum: 0, maximum: 1 }])),
          required: ids,
          additionalProperties: false
        }
      },
      required: ["scores"],
      additionalProperties: false
    }
  }
})

const answerShape = (ids: ReadonlyArray<string>) =>
  `{"scores": {${ids.map((id) => `"${id}": <score>`).join(", ")}}}, a number from 0 to 1 for each of ${ids.join(", ")}`

/** The judge's first request for a group: the rubric, the task, the reference (if any), the transcripts. */
export const messagesOf = (
  row: PromptRow,
  group: TrajectoryGroup,
  decode: (ids: ReadonlyArray<number>) => string,
  settings: Pick<Settings, "rubric" | "max_trajectory_chars">
): Array<ChatMessage> => {
  const ids = idsOf(group.trajectories.length)
  const rubric = row.reward_spec?.rubric ?? settings.rubric
  const system = [
    `You judge an AI agent's attempts at a task. ${ids.length} trajectories follow: attempts at the same task, each with the text the agent wrote on every turn, the tool calls it made and what they returned.`,
    "Score each trajectory from 0 to 1 by the rubric, comparing them with each other.",
    `Rubric: ${rubric}`,
    `Answer with JSON only, no prose: ${answerShape(ids)}.`
  ].join("\n\n")
  const task = row.prompt.map(
    (m) => `${m.role}: ${typeof m.content === "string" ? m.content : canonicalJson(m.content)}`
  )
  const truth = row.reward_spec?.ground_truth
  const parts = [`Task:\n${task.join("\n")}`]
  if (truth !== undefined) parts.push(`Reference (ground truth, JSON):\n${canonicalJson(truth)}`)
  group.trajectories.forEach((t, i) => {
    parts.push(`Trajectory ${ids[i]}:\n${JSON.stringify(transcript(t, decode, settings.max_trajectory_chars))}`)
  })
  return [
    { role: "system", content: system },
    { role: "user", content: parts.join("\n\n") }
  ]
}

// ---------------------------------------------------------------------------------------------------------------
// The answer.

const parseObject = (content: string): unknown => {
  const text = content
    .trim()
    .replace(/^```(?:json)?\s*/i, "")
    .replace(/\s*```$/, "")
  try {
    return JSON.parse(text)
  } catch {
    // prose around the object: take the outermost braces
    const first = text.indexOf("{")
    const last = text.lastIndexOf("}")
    if (first < 0 || last <= first) return undefined
    try {
      return JSON.parse(text.slice(first, last + 1))
    } catch {
      return undefined
    }
  }
}

/** Reads a judge answer for the trajectories `ids`. Pure: problems are a `Verdict` with the kind and what was wrong. */
export const parseVerdict = (content: string, ids: ReadonlyArray<string>): Verdict => {
  const value = parseObject(content)
  const scores = (value as { scores?: unknown } | undefined)?.scores
  if (value === undefined || typeof value !== "object" || value === null) {
    return { ok: false, kind: "malformed", detail: `not a JSON object: ${content.slice(0, 120)}` }
  }
  if (typeof scores !== "object" || scores === null || Array.isArray(scores)) {
    return { ok: false, kind: "malformed", detail: 'no "scores" object' }
  }
  const given = scores as Record<string, unknown>
  const absent = ids.filter((id) => !(id in given))
  const extra = Object.keys(given).filter((k) => !ids.includes(k))
  if (absent.length > 0 || extra.length > 0) {
    const say = [
      ...(absent.length > 0 ? [`no score for ${absent.join(", ")}`] : []),
      ...(extra.length > 0 ? [`scores for unknown ${extra.join(", ")}`] : [])
    ]
    return { ok: false, kind: "missing", detail: say.join("; ") }
  }
  const bad = ids.filter((id) => {
    const s = given[id]
    return typeof s !== "number" || !Number.isFinite(s) || s < 0 || s > 1
  })
  if (bad.length > 0) {
    return {
      ok: false,
      kind: "out_of_range",
      detail: `not a number in [0, 1]: ${bad.map((id) => `${id}=${JSON.stringify(given[id])}`).join(", ")}`
    }
  }
  return { ok: true, scores: ids.map((id) => given[id] as number) }
}

// ---------------------------------------------------------------------------------------------------------------
// Paying the scores.

/** The trajectory with `score` added to its reward, on its last turn that generated tokens. */
export const withScore = (t: Trajectory, score: number): Trajectory => {
  let last = -1
  for (const [k, turn] of t.turns.entries()) if (turn.end > turn.start) last = k
  return {
    ...t,
    reward: t.reward + score,
    turns: t.turns.map((turn, k) => (k === last ? { ...turn, reward: turn.reward + score } : turn)),
    envMetrics: { ...t.envMetrics, "reward/judge": score }
  }
}

/** The `judge/*` metrics of a step: sums over its groups' verdicts (none when no group was judged). */
export const stepMetrics = (groups: ReadonlyArray<TrajectoryGroup>): Record<string, number> => {
  const verdicts = groups.flatMap((g) => (g.judge === undefined ? [] : [g.judge]))
  if (verdicts.length === 0) return {}
  const sum = (f: (j: GroupJudgement) => number) => verdicts.reduce((a, j) => a + f(j), 0)
  const scores = verdicts.flatMap((j) => j.scores)
  return {
    "judge/groups": verdicts.length,
    "judge/calls": sum((j) => j.calls.length),
    "judge/cache_hits": sum((j) => (j.cacheHit ? 1 : 0)),
    "judge/malformed": sum((j) => j.malformed),
    "judge/out_of_range": sum((j) => j.outOfRange),
    "judge/missing": sum((j) => j.missing),
    "judge/failed_groups": sum((j) => (j.failed === undefined ? 0 : 1)),
    "judge/prompt_tokens": sum((j) => j.promptTokens),
    "judge/completion_tokens": sum((j) => j.completionTokens),
    "judge/cost": sum((j) => j.cost),
    "judge/score_mean": scores.reduce((a, b) => a + b, 0) / Math.max(1, scores.length)
  }
}

/** Every judge call recorded in episode-log groups, in log order: what a replay answers from. */
export const recordsOf = (groups: Iterable<TrajectoryGroup>): Array<LlmCallRecord> => {
  const out: Array<LlmCallRecord> = []
  for (const g of groups) if (g.judge !== undefined) out.push(...g.judge.calls)
  return out
}

// ---------------------------------------------------------------------------------------------------------------
// The judge.

interface Tally {
  calls: Array<LlmCallRecord>
  malformed: number
  outOfRange: number
  missing: number
  promptTokens: number
  completionTokens: number
  cost: number
}

const cacheKey = (model: string, request: ChatRequest): string =>
  createHash("sha256")
    .update(canonicalJson({ model, messages: request.messages }))
    .digest("hex")

/**
 * A judge asking `client`. With `settings.cache_file` (and a client not in replay) earlier verdicts are read from
 * that JSONL file and new ones appended to it.
 */
export const make = Effect.fn("GroupJudge.make")(function* (client: ChatClient, settings: Settings) {
  const fs = yield* FileSystem.FileSystem
  const cache = new Map<string, ReadonlyArray<number>>()
  const file = settings.cache && client.mode !== "replay" ? settings.cache_file : undefined
  if (file !== undefined && (yield* fs.exists(file).pipe(Effect.orElseSucceed(() => false)))) {
    const text = yield* fs.readFileString(file).pipe(Effect.orElseSucceed(() => ""))
    for (const line of text.split("\n")) {
      if (line.trim() === "") continue
      try {
        const entry = JSON.parse(line) as { key?: unknown; scores?: unknown }
        if (typeof entry.key === "string" && Array.isArray(entry.scores))
          cache.set(entry.key, entry.scores as Array<number>)
      } catch {
        // a torn line (a run killed mid-append): that verdict is asked for again
      }
    }
  }
  const remember = (key: string, scores: ReadonlyArray<number>) =>
    Effect.gen(function* () {
      if (!settings.cache) return
      cache.set(key, scores)
      if (file === undefined) return
      yield* fs
        .writeFileString(file, `${JSON.stringify({ key, scores })}\n`, { flag: "a" })
        .pipe(Effect.catch((e) => Effect.logWarning(`judge cache ${file} not written: ${e.message}`)))
    })

  const ask = (group: TrajectoryGroup, first: ChatRequest, tally: Tally) =>
    Effect.gen(function* () {
      const ids = idsOf(group.trajectories.length)
      const fail = (reason: JudgeError["reason"], attempts: number, message: string) =>
        new JudgeError({ promptUid: group.promptUid, endpoint: client.endpoint, reason, attempts, message })
      let request = first
      let last: Verdict | undefined
      for (let attempt = 1; attempt <= settings.max_attempts; attempt++) {
        const response = yield* client
          .complete(request)
          .pipe(
            Effect.mapError((e) =>
              e._tag === "ReplayMissError"
                ? fail("ReplayMiss", attempt, `judge of ${group.promptUid}: ${e.message}`)
                : fail("Endpoint", attempt, `judge of ${group.promptUid}: ${e.message}`)
            )
          )
        tally.calls.push(response.record)
        tally.promptTokens += response.promptTokens
        tally.completionTokens += response.completionTokens
        tally.cost += response.cost
        const verdict = parseVerdict(response.content, ids)
        if (verdict.ok) return verdict.scores
        last = verdict
        if (verdict.kind === "malformed") tally.malformed++
        else if (verdict.kind === "out_of_range") tally.outOfRange++
        else tally.missing++
        request = {
          ...first,
          messages: [
            ...first.messages,
            { role: "assistant", content: response.content },
            {
              role: "user",
              content: `That answer cannot be used (${verdict.detail}). Answer again with JSON only: ${answerShape(ids)}.`
            }
          ]
        }
      }
      const kind = last !== undefined && !last.ok ? last.kind : "malformed"
      const reason = kind === "malformed" ? "Malformed" : kind === "out_of_range" ? "OutOfRange" : "Missing"
      return yield* fail(
        reason,
        settings.max_attempts,
        `judge of ${group.promptUid}: no usable answer in ${settings.max_attempts} attempts from ${client.model} at ${client.endpoint}; the last was ${kind} (${last !== undefined && !last.ok ? last.detail : ""}). Every trajectory gets the fallback score; raise environment.judge.max_attempts or use an endpoint with structured outputs`
      )
    })

  const judge = (row: PromptRow, group: TrajectoryGroup, decode: (ids: ReadonlyArray<number>) => string) =>
    Effect.gen(function* () {
      const ids = idsOf(group.trajectories.length)
      const first: ChatRequest = {
        messages: messagesOf(row, group, decode, settings),
        ...(settings.structured_output ? { responseFormat: scoresFormat(ids) } : {})
      }
      const key = cacheKey(client.model, first)
      const tally: Tally = {
        calls: [],
        malformed: 0,
        outOfRange: 0,
        missing: 0,
        promptTokens: 0,
        completionTokens: 0,
        cost: 0
      }
      const cached = settings.cache ? cache.get(key) : undefined
      const outcome: { scores: ReadonlyArray<number>; cacheHit: boolean; failed?: string } =
        cached !== undefined && cached.length === ids.length
          ? { scores: cached, cacheHit: true }
          : yield* ask(group, first, tally).pipe(
              Effect.tap((scores) => remember(key, scores)),
              Effect.map((scores) => ({ scores, cacheHit: false })),
              Effect.catchTag("JudgeError", (e) =>
                Effect.as(Effect.logWarning(e.message), {
                  scores: ids.map(() => settings.fallback_score),
                  cacheHit: false,
                  failed: `${e.reason}: ${e.message}`
                })
              )
            )
      const judgement: GroupJudgement = {
        model: client.model,
        scores: outcome.scores,
        calls: tally.calls,
        cacheHit: outcome.cacheHit,
        malformed: tally.malformed,
        outOfRange: tally.outOfRange,
        missing: tally.missing,
        ...(outcome.failed === undefined ? {} : { failed: outcome.failed }),
        promptTokens: tally.promptTokens,
        completionTokens: tally.completionTokens,
        cost: tally.cost
      }
      return {
        ...group,
        trajectories: group.trajectories.map((t, i) => withScore(t, outcome.scores[i]!)),
        judge: judgement
      } satisfies TrajectoryGroup
    }).pipe(Effect.withSpan("GroupJudge.judge", { attributes: { "prompt.uid": group.promptUid } }))

  return {
    applies: (row: PromptRow) => row.reward_spec?.method === methodName,
    judge
  } satisfies GroupJudge
})

/** `apply_to: all_train_rows`: the rows with their reward method set to the judge (ground truth and rubric kept). */
export const asJudgeRows = (rows: ReadonlyArray<PromptRow>): Array<PromptRow> =>
  rows.map((row) => ({ ...row, reward_spec: { ...(row.reward_spec ?? {}), method: methodName } }))
