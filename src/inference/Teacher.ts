/**
 * The teacher of on-policy distillation (trainer.distillation): a frozen model that scores every token the policy
 * sampled. The Generator runs a `scorer` on each finished group, before it is logged, so each trajectory carries
 * `teacherLogprobs` (response-aligned, 0 off the loss mask) in episodes.jsonl and a replay needs no teacher; the
 * trainer turns them into the per-token advantage −β · (log π_rollout − log π_teacher) (TrainingBatch).
 *
 * - **Local**: a checkpoint directory loaded once on the active backend (any architecture the loader reads), scored in
 *   batched forward passes of its own distribution (τ 1: what a server's `prompt_logprobs` give; the student's
 *   log-probs are at its sampling temperature, so it learns to sample what the teacher would). It must share the
 *   policy's tokenizer: `tokenizerMismatch` says why a teacher whose vocabulary size or tokenizer.json
 *   vocabulary differs is refused.
 * - **Remote**: an OpenAI-compatible server (vLLM, SGLang, our `serve`) asked for vLLM's `prompt_logprobs` of each
 *   sequence as a token-id prompt on /v1/completions (`max_tokens: 1`, `prompt_logprobs: 0`: the prompt tokens' own
 *   log-probs, raw logits' log-softmax), `max_concurrency` requests at a time, each retried as RemoteWire retries.
 *   An answer without one finite log-prob ≤ 0 per token is a BadResponse, never a score.
 * - **Cache**: sequences already scored (identical samples of a group are common) are answered from an LRU keyed by
 *   the token ids; `TeacherUsage.cached` counts them.
 * - **Failures**: a teacher that cannot score a sequence ends that trajectory `error` with the reason (never trained
 *   on, kept in the log); the group and the run go on.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Clock, Effect, Schema } from "effect"
import type { TeacherUsage, Trajectory, TrajectoryGroup } from "../domain/Trajectory.ts"
import * as LogProbs from "../model/LogProbs.ts"
import type * as Transformer from "../model/Transformer.ts"
import * as RemoteWire from "./RemoteWire.ts"

export class TeacherError extends Schema.TaggedError<TeacherError>()("TeacherError", {
  teacher: Schema.String,
  message: Schema.String
}) {}

export interface Teacher {
  /** What it is, for messages: the checkpoint directory or the server's URL, as configured. */
  readonly source: string
  /** For each sequence, log p(ids[t] | ids[<t]) for t = 1 … n−1 (index t − 1 holds token t). */
  readonly score: (sequences: ReadonlyArray<ReadonlyArray<number>>) => Effect.Effect<Array<Array<number>>, TeacherError>
}

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

/** A loaded model as the teacher: right-padded batches of `batchRows` sequences, logits / `temperature`. */
export const local = (
  model: Transformer.Transformer,
  options: { readonly source: string; readonly temperature: number; readonly batchRows?: number }
): Teacher => {
  const rowsPer = options.batchRows ?? 8
  const batch = async (sequences: ReadonlyArray<ReadonlyArray<number>>): Promise<Array<Array<number>>> => {
    const T = Math.max(2, ...sequences.map((s) => s.length))
    const ids = sequences.map((s) => [...s, ...new Array<number>(T - s.length).fill(0)])
    const attentionMask = sequences.map((s) => Array.from({ length: T }, (_, t) => (t < s.length ? 1 : 0)))
    const { logprobs } = LogProbs.ofSequences(model, { ids, attentionMask }, { temperature: options.temperature })
    const values = await logprobs.data().finally(() => logprobs.dispose())
    return sequences.map((s, b) => Array.from(values.subarray(b * T + 1, b * T + s.length)))
  }
  const score = (sequences: ReadonlyArray<ReadonlyArray<number>>) =>
    Effect.forEach(
      Array.from({ length: Math.ceil(sequences.length / rowsPer) }, (_, k) =>
        sequences.slice(k * rowsPer, (k + 1) * rowsPer)
      ),
      (chunk) =>
        Effect.yieldNow.pipe(
          Effect.andThen(
            Effect.tryPromise({
              try: () => batch(chunk),
              catch: (e) => new TeacherError({ teacher: options.source, message: messageOf(e) })
            })
          )
        )
    ).pipe(
      Effect.map((parts) => parts.flat()),
      Effect.flatMap((scored) => {
        const bad = scored.findIndex((row) => row.some((v) => !Number.isFinite(v)))
        return bad < 0
          ? Effect.succeed(scored)
          : Effect.fail(
              new TeacherError({ teacher: options.source, message: `a non-finite log-prob in sequence ${bad}` })
            )
      })
    )
  return { source: options.source, score }
}

/**
 * vLLM's `prompt_logprobs` of the prompt `ids` in a /v1/completions response (`[null, { "<id>": { logprob, … } }, …]`,
 * one entry per prompt token) as log p(ids[t] | ids[<t]) for t ≥ 1, or why the answer holds none. The shape is vLLM's
 * `CompletionResponseChoice.prompt_logprobs: list[dict[int, Logprob] | None]` (vllm/entrypoints/openai/protocol.py),
 * which `serve` answers too.
 */
export const readPromptLogprobs =
  (ids: ReadonlyArray<number>) =>
  (body: unknown): Array<number> | string => {
    const entries = (body as { choices?: Array<{ prompt_logprobs?: unknown }> } | null)?.choices?.[0]?.prompt_logprobs
    if (!Array.isArray(entries)) {
      return "the answer has no choices[0].prompt_logprobs: the server must support vLLM's prompt_logprobs"
    }
    if (entries.length !== ids.length) {
      return `choices[0].prompt_logprobs has ${entries.length} entries for a prompt of ${ids.length} tokens`
    }
    const out: Array<number> = []
    for (let t = 1; t < ids.length; t++) {
      const entry = (entries[t] as Record<string, { logprob?: unknown }> | null)?.[String(ids[t])]
      const logprob = entry?.logprob
      if (typeof logprob !== "number" || !Number.isFinite(logprob) || logprob > 1e-4) {
        return `prompt_logprobs[${t}] holds no log-prob ≤ 0 of token ${ids[t]} (${JSON.stringify(entries[t]).slice(0, 120)})`
      }
      out.push(Math.min(0, logprob))
    }
    return out
  }

/** A teacher behind an OpenAI-compatible server at `base` (no trailing /v1), serving `model`. */
export const remote = (
  connection: RemoteWire.Connection,
  options: { readonly base: string; readonly model: string; readonly source: string; readonly concurrency: number }
): Teacher => ({
  source: options.source,
  score: (sequences) =>
    Effect.forEach(
      sequences,
      (ids) =>
        RemoteWire.post(
          connection,
          options.base,
          "/v1/completions",
          { model: options.model, prompt: ids, max_tokens: 1, temperature: 0, prompt_logprobs: 0 },
          readPromptLogprobs(ids)
        ),
      { concurrency: options.concurrency }
    ).pipe(Effect.mapError((e) => new TeacherError({ teacher: options.source, message: e.message })))
})

/** tokenizer.json's vocabulary and added tokens, as text to compare (undefined where the file is absent). */
const vocabularyOf = (dir: string): string | undefined => {
  const file = path.join(dir, "tokenizer.json")
  if (!fs.existsSync(file)) return undefined
  const json = JSON.parse(fs.readFileSync(file, "utf8")) as { model?: { vocab?: unknown }; added_tokens?: unknown }
  return JSON.stringify([json.model?.vocab ?? null, json.added_tokens ?? null])
}

/**
 * Undefined when the teacher (its checkpoint directory and vocabulary size) shares the policy's tokenizer, else why
 * not: the vocabulary sizes differ, or both directories hold a tokenizer.json with different vocabularies.
 */
export const tokenizerMismatch = (
  teacher: { readonly dir: string; readonly vocabSize: number },
  student: { readonly dir: string | undefined; readonly vocabSize: number }
): string | undefined => {
  if (teacher.vocabSize !== student.vocabSize) {
    return `the teacher's vocabulary has ${teacher.vocabSize} tokens, the policy's ${student.vocabSize}`
  }
  const theirs = vocabularyOf(teacher.dir)
  const ours = student.dir === undefined ? undefined : vocabularyOf(student.dir)
  if (theirs !== undefined && ours !== undefined && theirs !== ours) {
    return `${path.join(teacher.dir, "tokenizer.json")} and ${path.join(student.dir!, "tokenizer.json")} hold different vocabularies`
  }
  return undefined
}

/** An LRU of scored sequences, by their ids. */
const lru = (capacity: number) => {
  const entries = new Map<string, Array<number>>()
  return {
    get: (key: string) => {
      const hit = entries.get(key)
      if (hit !== undefined) {
        entries.delete(key)
        entries.set(key, hit)
      }
      return hit
    },
    set: (key: string, value: Array<number>) => {
      if (capacity === 0) return
      entries.delete(key)
      entries.set(key, value)
      if (entries.size > capacity) entries.delete(entries.keys().next().value!)
    }
  }
}

/** The sequence the teacher scores for a trajectory: its prompt then its response (none for an error or step-wise). */
const sequenceOf = (t: Trajectory): ReadonlyArray<number> | undefined =>
  t.stopReason === "error" || t.steps !== undefined ? undefined : [...t.promptIds, ...t.responseIds]

/** Response-aligned teacher log-probs of `t` from its sequence's scores (0 off the loss mask). */
const alignedTo = (t: Trajectory, scores: ReadonlyArray<number>): Array<number> => {
  const P = t.promptIds.length
  return t.responseIds.map((_, i) => (t.lossMask[i] === 1 && P + i >= 1 ? scores[P + i - 1]! : 0))
}

/**
 * Scores groups with `teacher`, through a cache of `cacheSize` sequences: each trajectory gets `teacherLogprobs`, the
 * group its `TeacherUsage`; a trajectory the teacher failed on ends `error` ("teacher <source>: …").
 */
export const scorer = (teacher: Teacher, options: { readonly cacheSize: number; readonly pricePerToken: number }) => {
  const cache = lru(options.cacheSize)
  return (g: TrajectoryGroup): Effect.Effect<TrajectoryGroup> =>
    Effect.gen(function* () {
      const started = yield* Clock.currentTimeMillis
      const sequences = g.trajectories.map(sequenceOf)
      const keys = sequences.map((s) => s?.join(","))
      const found = new Map<string, Array<number>>()
      for (const k of keys) {
        const hit = k === undefined ? undefined : cache.get(k)
        if (hit !== undefined) found.set(k!, hit)
      }
      const todo = [...new Set(keys.filter((k): k is string => k !== undefined && !found.has(k)))]
      const sequenceBy = new Map(keys.flatMap((k, i) => (k === undefined ? [] : [[k, sequences[i]!] as const])))
      const outcome = yield* teacher.score(todo.map((k) => sequenceBy.get(k)!)).pipe(Effect.result)
      if (outcome._tag === "Success") {
        for (const [j, k] of todo.entries()) {
          found.set(k, outcome.success[j]!)
          cache.set(k, outcome.success[j]!)
        }
      }
      const failure = outcome._tag === "Failure" ? `teacher ${teacher.source}: ${outcome.failure.message}` : undefined
      const trajectories = g.trajectories.map((t, i): Trajectory => {
        const key = keys[i]
        if (key === undefined) return t
        const scores = found.get(key)
        return scores === undefined
          ? { ...t, stopReason: "error", error: failure ?? `teacher ${teacher.source}: no score` }
          : { ...t, teacherLogprobs: alignedTo(t, scores) }
      })
      const rows = keys.filter((k) => k !== undefined).length
      const failed = trajectories.filter((t, i) => keys[i] !== undefined && t.teacherLogprobs === undefined).length
      const tokens = todo.reduce((n, k) => n + sequenceBy.get(k)!.length, 0)
      const usage: TeacherUsage = {
        calls: todo.length,
        tokens,
        cost: tokens * options.pricePerToken,
        cached: rows - failed - (outcome._tag === "Success" ? todo.length : 0),
        failed,
        ms: (yield* Clock.currentTimeMillis) - started
      }
      return { ...g, trajectories, teacher: usage }
    })
}

/** The step's distill/* metrics (MetricKeys) from its groups; {} when no group was scored by a teacher. */
export const stepMetrics = (groups: ReadonlyArray<TrajectoryGroup>): Record<string, number> => {
  const usages = groups.flatMap((g) => (g.teacher === undefined ? [] : [g.teacher]))
  if (usages.length === 0) return {}
  const sum = (f: (u: TeacherUsage) => number) => usages.reduce((a, u) => a + f(u), 0)
  let kl = 0
  let tokens = 0
  for (const t of groups.flatMap((g) => g.trajectories)) {
    if (t.teacherLogprobs === undefined) continue
    for (const [i, m] of t.lossMask.entries()) {
      if (m === 1) {
        kl += t.rolloutLogprobs[i]! - t.teacherLogprobs[i]!
        tokens++
      }
    }
  }
  return {
    "distill/teacher_kl": kl / Math.max(1, tokens),
    "distill/teacher_calls": sum((u) => u.calls),
    "distill/teacher_tokens": sum((u) => u.tokens),
    "distill/teacher_cost": sum((u) => u.cost ?? 0),
    "distill/teacher_cached": sum((u) => u.cached),
    "distill/teacher_failed": sum((u) => u.failed),
    "distill/teacher_s": sum((u) => u.ms) / 1000
  }
}
