/**
 * The run report's data: the types embedded in the page as JSON (what the pages render and their scripts read), and
 * how a run directory is read into them (metrics.jsonl, episodes.jsonl, consumed.jsonl, config.yaml, the latest
 * checkpoint's tokenizer). Report.ts turns this data into HTML.
 *
 * Limits, on purpose, so the page stays small: the episodes of at most `maxSteps` steps (sampled evenly, first and
 * last included), `maxGroupsPerStep` groups of each, prompts and responses cut at `maxTokens` tokens, and a total
 * budget of `maxTotalTokens` embedded tokens (fewer steps when exceeded). The page says what was left out.
 *
 * The run's files are read strictly: a line of metrics.jsonl, episodes.jsonl or consumed.jsonl that does not decode
 * fails the report naming the file and line, unless it is the torn last line of a crash mid-write (skipped with a
 * warning); so do a config.yaml that is not YAML and tokenizer files of the latest checkpoint that do not load.
 */
import { Clock, Effect, FileSystem, Option, Path, Schema, Stream } from "effect"
import { CliError } from "effect/cli"
import type { RunConfig } from "../config/RunConfig.ts"
import * as RunConfigLoader from "../config/RunConfigLoader.ts"
import type { Trajectory, TrajectoryGroup } from "../domain/Trajectory.ts"
import * as ConsumedLog from "../store/ConsumedLog.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"
import * as AutoTokenizer from "../tokenizer/AutoTokenizer.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import * as Metrics from "./Metrics.ts"

export class ReportError extends Schema.TaggedError<ReportError>()("ReportError", {
  path: Schema.String,
  line: Schema.optionalKey(Schema.Int),
  message: Schema.String
}) {
  /** `FILE[:LINE]: message`, what the CLI prints. */
  override get [CliError.userMessage](): string {
    return `${this.path}${this.line === undefined ? "" : `:${this.line}`}: ${this.message}`
  }
}

export interface Options {
  /** steps whose episodes are embedded (sampled evenly); default 50 */
  readonly maxSteps?: number
  /** groups embedded per step (the first by dataset cursor); default 4 */
  readonly maxGroupsPerStep?: number
  /** prompt and response tokens kept per trajectory; default 2048 */
  readonly maxTokens?: number
  /** total embedded tokens; fewer steps are embedded beyond it; default 400k (about 8 MB of HTML) */
  readonly maxTotalTokens?: number
}

const defaults = { maxSteps: 50, maxGroupsPerStep: 4, maxTokens: 2048, maxTotalTokens: 400_000 }

// ---------------------------------------------------------------------------------------------------------------
// The embedded data (what the page's script reads)

/** Columns over steps: `steps[i]` and `series[key][i]` (null where a step lacks the key). */
export interface Columns {
  readonly steps: ReadonlyArray<number>
  readonly series: Readonly<Record<string, ReadonlyArray<number | null>>>
}

/** Tokens as the policy saw them: `text[i]` is token i's text ("" when a multi-byte character is on token i − 1). */
export interface Tokens {
  readonly ids: ReadonlyArray<number>
  readonly text: ReadonlyArray<string> | null // null: no tokenizer could be loaded, the page shows ids
  readonly mask: string // one "0"/"1" per token (1 = sampled by the policy, trained on)
  readonly logprobs?: ReadonlyArray<number> // behaviour log-probs (responses only), 3 decimals
  readonly special: ReadonlyArray<number> // indices of special (added) tokens
  readonly omitted: number // tokens cut off at the end
}

export interface ViewTurn {
  readonly start: number
  readonly end: number
  readonly observationEnd: number // end of the template + observation tokens that follow the turn
  readonly reward: number
  readonly finishReason: string
  readonly policyVersions: readonly [number, number]
  readonly toolCalls: ReadonlyArray<{
    readonly tool: string
    readonly server?: string
    readonly arguments: unknown
    readonly result: string
    readonly isError: boolean
    readonly ms: number
  }>
  readonly parseError?: string
  readonly llmMs: number
  readonly envMs: number
}

export interface ViewTrajectory {
  readonly id: string
  readonly sample: number
  readonly reward: number
  readonly stopReason: string
  readonly error?: string
  readonly envMetrics: Readonly<Record<string, number>>
  readonly turns: ReadonlyArray<ViewTurn>
  readonly response: Tokens
}

export interface ViewGroup {
  readonly uid: string
  readonly cursor: number
  readonly dataSource: string
  readonly envClass: string
  readonly prompt: Tokens
  readonly trajectories: ReadonlyArray<ViewTrajectory>
}

export interface EvalScore {
  readonly step: number
  readonly scores: Readonly<Record<string, { readonly avg_score?: number; readonly pass_at_n?: number }>>
}

export interface Data {
  readonly runDir: string
  readonly generatedAt: string
  readonly summary: {
    readonly steps: number
    readonly seconds: number
    readonly trajectories: number // trajectories trained on (in consumed groups)
    readonly generatedTokens: number // sampled tokens (loss mask 1) in those trajectories
    readonly firstReward?: number
    readonly lastReward?: number
    readonly evalBefore?: EvalScore
    readonly evalAfter?: EvalScore
    readonly tokenizer: string
    readonly mode?: string
  }
  readonly train: Columns
  readonly eval: Columns
  readonly episodes: {
    readonly note: string
    readonly steps: ReadonlyArray<{ readonly step: number; readonly groups: ReadonlyArray<ViewGroup> }>
  }
  readonly config: string
}

// ---------------------------------------------------------------------------------------------------------------
// Metrics

type MetricRecord = Readonly<Record<string, unknown>>

const numericEntries = (r: MetricRecord): Array<readonly [string, number]> =>
  Object.entries(r).flatMap(([k, v]) =>
    k !== "step" && k !== "time" && typeof v === "number" && Number.isFinite(v) ? [[k, v] as const] : []
  )

/** Columns from records keyed by step; a later record of the same step (a resumed run) replaces the earlier one. */
export const columns = (records: ReadonlyArray<MetricRecord>): Columns => {
  const byStep = new Map<number, MetricRecord>()
  for (const r of records) if (typeof r["step"] === "number") byStep.set(r["step"], r)
  const steps = [...byStep.keys()].sort((a, b) => a - b)
  const keys = new Set<string>()
  for (const r of byStep.values()) for (const [k] of numericEntries(r)) keys.add(k)
  const series: Record<string, Array<number | null>> = {}
  for (const key of [...keys].sort()) {
    series[key] = steps.map((s) => {
      const v = byStep.get(s)![key]
      return typeof v === "number" && Number.isFinite(v) ? v : null
    })
  }
  return { steps, series }
}

/** Wall time of a run that may have been resumed: `time` restarts at each process start, so add up the segments. */
export const wallSeconds = (records: ReadonlyArray<MetricRecord>): number => {
  let total = 0
  let segmentMax = 0
  let last = -1
  for (const r of records) {
    const t = r["time"]
    if (typeof t !== "number") continue
    if (t < last) {
      total += segmentMax
      segmentMax = 0
    }
    segmentMax = Math.max(segmentMax, t)
    last = t
  }
  return total + segmentMax
}

const evalScore = (cols: Columns, index: number): EvalScore => {
  const scores: Record<string, { avg_score?: number; pass_at_n?: number }> = {}
  for (const [key, values] of Object.entries(cols.series)) {
    const m = /^eval\/(.+)\/(avg_score|pass_at_n)$/.exec(key)
    const v = values[index]
    if (m === null || v === null || v === undefined) continue
    const source = m[1]!
    scores[source] = { ...scores[source], [m[2]!]: v }
  }
  return { step: cols.steps[index]!, scores }
}

// ---------------------------------------------------------------------------------------------------------------
// Episodes

/** `k` of `n` indices spread evenly, first and last included. */
export const evenly = (n: number, k: number): Array<number> => {
  if (k >= n) return Array.from({ length: n }, (_, i) => i)
  if (k <= 1) return n === 0 ? [] : [n - 1]
  return [...new Set(Array.from({ length: k }, (_, i) => Math.round((i * (n - 1)) / (k - 1))))]
}

const groupKey = (uid: string, cursor: number) => `${uid}#${cursor}`

/**
 * Decoded text per token. A token that is only part of a UTF-8 character (byte tokenizers, byte-fallback BPE)
 * decodes to U+FFFD alone: then up to 3 following tokens of the same mask are joined to it, the text goes on the
 * first and the others get "".
 */
export const tokenTexts = (tokenizer: TokenizerImpl, ids: ReadonlyArray<number>, mask?: string): Array<string> => {
  const out = new Array<string>(ids.length).fill("")
  let i = 0
  while (i < ids.length) {
    let width = 1
    let text = tokenizer.decode([ids[i]!])
    if (text.includes("\uFFFD")) {
      for (let w = 2; w <= 4 && i + w <= ids.length; w++) {
        if (mask !== undefined && mask[i + w - 1] !== mask[i]) break
        const joined = tokenizer.decode(ids.slice(i, i + w))
        if (!joined.includes("\uFFFD")) {
          text = joined
          width = w
          break
        }
      }
    }
    out[i] = text
    i += width
  }
  return out
}

const round3 = (x: number) => Math.round(x * 1000) / 1000

const toTokens = (
  tokenizer: TokenizerImpl | undefined,
  specialIds: ReadonlySet<number>,
  allIds: ReadonlyArray<number>,
  allMask: ReadonlyArray<number> | undefined,
  allLogprobs: ReadonlyArray<number> | undefined,
  maxTokens: number
): Tokens => {
  const ids = allIds.slice(0, maxTokens)
  const mask =
    allMask === undefined ? "0".repeat(ids.length) : ids.map((_, i) => (allMask[i] === 1 ? "1" : "0")).join("")
  const special: Array<number> = []
  ids.forEach((id, i) => {
    if (specialIds.has(id)) special.push(i)
  })
  return {
    ids,
    text: tokenizer === undefined ? null : tokenTexts(tokenizer, ids, mask),
    mask,
    ...(allLogprobs === undefined
      ? {}
      : { logprobs: ids.map((_, i) => (mask[i] === "1" ? round3(allLogprobs[i]!) : 0)) }),
    special,
    omitted: allIds.length - ids.length
  }
}

const viewTrajectory = (
  t: Trajectory,
  tokenizer: TokenizerImpl | undefined,
  specialIds: ReadonlySet<number>,
  maxTokens: number
): ViewTrajectory => ({
  id: t.id,
  sample: t.sample,
  reward: t.reward,
  stopReason: t.stopReason,
  ...(t.error === undefined ? {} : { error: t.error }),
  envMetrics: t.envMetrics,
  turns: t.turns.map((turn, k) => ({
    start: turn.start,
    end: turn.end,
    observationEnd: Math.min(
      t.responseIds.length,
      k + 1 < t.turns.length ? t.turns[k + 1]!.start : turn.end + turn.observationTokens
    ),
    reward: turn.reward,
    finishReason: turn.finishReason,
    policyVersions: [turn.policyVersionFirst, turn.policyVersionLast] as const,
    toolCalls: turn.toolCalls.map((c) => ({
      tool: c.tool,
      ...(c.server === undefined ? {} : { server: c.server }),
      arguments: c.arguments,
      result: c.result,
      isError: c.isError,
      ms: c.ms
    })),
    ...(turn.parseError === undefined ? {} : { parseError: turn.parseError }),
    llmMs: turn.llmMs,
    envMs: turn.envMs
  })),
  response: toTokens(tokenizer, specialIds, t.responseIds, t.lossMask, t.rolloutLogprobs, maxTokens)
})

const groupTokens = (g: TrajectoryGroup, maxTokens: number) =>
  Math.min(maxTokens, g.trajectories[0]?.promptIds.length ?? 0) +
  g.trajectories.reduce((n, t) => n + Math.min(maxTokens, t.responseIds.length), 0)

// ---------------------------------------------------------------------------------------------------------------
// Reading a run directory

const readText = (file: string) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    if (!(yield* fs.exists(file).pipe(Effect.orElseSucceed(() => false)))) return undefined
    return yield* fs
      .readFileString(file)
      .pipe(Effect.mapError((cause) => new ReportError({ path: file, message: `cannot read: ${cause.message}` })))
  })

/**
 * The records of a JSONL file the run appends to, those `decode` accepts. A bad last line is a crash mid-write:
 * skipped with a warning; so is the torn start of a line that ends with a whole record (a crash mid-write, then a
 * resumed run appending to the torn line). A bad line anywhere else fails naming the file and line: the file was
 * edited or corrupted, and a report of what is left would be silently wrong. An absent file has no records.
 */
const readJsonl = <A>(file: string, what: string, decode: (value: unknown) => Option.Option<A>) =>
  Effect.gen(function* () {
    const text = yield* readText(file)
    if (text === undefined) return []
    const decodeLine = (line: string) => parseJson(line).pipe(Option.flatMap(decode))
    const lines = text.split("\n")
    const last = lines.findLastIndex((line) => line.trim() !== "")
    const records: Array<A> = []
    for (const [i, line] of lines.entries()) {
      if (line.trim() === "") continue
      const record = decodeLine(line)
      if (Option.isSome(record)) {
        records.push(record.value)
        continue
      }
      const glued = gluedRecord(line, decodeLine)
      if (Option.isSome(glued)) {
        yield* Effect.logWarning(
          `${file}:${i + 1}: skipping a torn record (${glued.value.at} bytes; a crash mid-write) that a resumed run appended to`
        )
        records.push(glued.value.record)
      } else if (i === last) {
        yield* Effect.logWarning(`${file}:${i + 1}: skipping torn last line (${line.length} bytes; a crash mid-write)`)
      } else {
        return yield* new ReportError({
          path: file,
          line: i + 1,
          message: `not ${what} (a torn or edited line in the middle of the file; only a torn last line is skipped)`
        })
      }
    }
    return records
  })

/** The longest tail of `line` that is a whole record, and where it starts. */
const gluedRecord = <A>(
  line: string,
  decodeLine: (line: string) => Option.Option<A>
): Option.Option<{ readonly at: number; readonly record: A }> => {
  for (let at = line.indexOf("{", 1); at > 0; at = line.indexOf("{", at + 1)) {
    const record = decodeLine(line.slice(at))
    if (Option.isSome(record)) return Option.some({ at, record: record.value })
  }
  return Option.none()
}

const parseJson = (line: string): Option.Option<unknown> => {
  try {
    return Option.some(JSON.parse(line))
  } catch {
    return Option.none()
  }
}

/** A metrics.jsonl record: what Metrics.record writes, `{ event, step, time, ...values }`. */
const asMetricRecord = (value: unknown): Option.Option<MetricRecord> =>
  typeof value === "object" &&
  value !== null &&
  !Array.isArray(value) &&
  typeof (value as MetricRecord)["event"] === "string" &&
  typeof (value as MetricRecord)["step"] === "number"
    ? Option.some(value as MetricRecord)
    : Option.none()

const firstLine = (e: { readonly message: string }) => e.message.split("\n")[0] ?? ""

/**
 * The run's config (config.yaml, as `train` resolved it); undefined when absent. A file that is not YAML fails; one
 * that no longer decodes (a key renamed since the run) is a warning, and the report leaves out what it would take
 * from it (the batch size, the pipeline mode, the tokenizer).
 */
const loadConfig = (runDir: string) =>
  Effect.gen(function* () {
    const path = yield* Path.Path
    const file = path.join(runDir, "config.yaml")
    const fs = yield* FileSystem.FileSystem
    if (!(yield* fs.exists(file).pipe(Effect.orElseSucceed(() => false)))) return undefined
    const raw = yield* RunConfigLoader.readFile(file).pipe(
      Effect.mapError((e) => new ReportError({ path: file, message: e.message }))
    )
    return yield* RunConfigLoader.decode(raw, file).pipe(
      Effect.catch((e) =>
        Effect.logWarning(`${file} no longer decodes as a run config, so the report ignores it: ${firstLine(e)}`).pipe(
          Effect.as(undefined)
        )
      )
    )
  })

/** The tokenizer of the latest checkpoint, else the one the config names; undefined when neither loads. */
const loadTokenizer = (runDir: string, config: RunConfig | undefined) =>
  Effect.gen(function* () {
    const path = yield* Path.Path
    const latest = yield* readText(path.join(runDir, "checkpoints", "latest")).pipe(
      Effect.orElseSucceed(() => undefined)
    )
    if (latest !== undefined && latest.trim() !== "") {
      // a checkpoint without tokenizer files falls back to the config's; files that do not load are an error
      const dir = path.join(runDir, "checkpoints", latest.trim())
      const fromCheckpoint = yield* AutoTokenizer.load(dir).pipe(
        Effect.map(Option.some),
        Effect.catch((e) =>
          e.reason === "NotFound"
            ? Effect.succeed(Option.none())
            : Effect.fail(
                new ReportError({
                  path: e.path?.startsWith(dir) === true ? e.path : path.join(dir, e.path ?? ""),
                  message: `cannot load the tokenizer: ${e.message}`
                })
              )
        )
      )
      if (Option.isSome(fromCheckpoint)) return { tokenizer: fromCheckpoint.value, from: "latest checkpoint" }
    }
    if (config === undefined) return undefined
    const fromConfig = yield* AutoTokenizer.fromConfig(config.tokenizer, config.model.path).pipe(Effect.option)
    return Option.isSome(fromConfig) ? { tokenizer: fromConfig.value, from: "run config" } : undefined
  })

/** Read a run directory into the report's data. */
export const collect = Effect.fn("Report.collect")(function* (runDir: string, options: Options = {}) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const maxSteps = options.maxSteps ?? defaults.maxSteps
  const maxGroupsPerStep = options.maxGroupsPerStep ?? defaults.maxGroupsPerStep
  const maxTokens = options.maxTokens ?? defaults.maxTokens
  const maxTotalTokens = options.maxTotalTokens ?? defaults.maxTotalTokens

  if (!(yield* fs.exists(runDir).pipe(Effect.orElseSucceed(() => false)))) {
    return yield* new ReportError({ path: runDir, message: "no such run directory" })
  }
  if (!(yield* fs.exists(path.join(runDir, Metrics.fileName)).pipe(Effect.orElseSucceed(() => false)))) {
    return yield* new ReportError({
      path: runDir,
      message: `not a run directory: no ${Metrics.fileName} (train writes it from its first eval or step)`
    })
  }
  const records = yield* readJsonl(path.join(runDir, Metrics.fileName), "a metrics record", asMetricRecord)
  const train = columns(records.filter((r) => r["event"] === "train"))
  const evalCols = columns(records.filter((r) => r["event"] === "eval"))
  const configText = (yield* readText(path.join(runDir, "config.yaml"))) ?? ""
  const config = yield* loadConfig(runDir)
  const loaded = yield* loadTokenizer(runDir, config)
  const tokenizer = loaded?.tokenizer
  const specialIds = new Set(tokenizer?.addedTokens.map((t) => t.id) ?? [])

  // the step each recorded group was trained in: consumed.jsonl, or without it (an older run) the file order
  const consumed = yield* ConsumedLog.read(runDir)
  const stepOf = new Map(consumed.map((c) => [groupKey(c.uid, c.cursor), c.step] as const))
  const batchSize = config?.trainer.train_batch_size ?? 1
  const steps = consumed.length > 0 ? [...new Set(consumed.map((c) => c.step))].sort((a, b) => a - b) : train.steps
  const candidates = new Set(evenly(steps.length, maxSteps).map((i) => steps[i]!))

  // one pass over the episode log: every trained group is counted, only the candidate steps' groups are kept.
  // A resumed run records a lost step's groups again: the later line (same uid and cursor) is the one trained on.
  const counted = new Map<string, { readonly step: number; readonly trajectories: number; readonly tokens: number }>()
  const kept = new Map<string, { readonly step: number; readonly group: TrajectoryGroup }>()
  let recorded = 0
  const episodesFile = path.join(runDir, EpisodeLog.fileName)
  if (yield* fs.exists(episodesFile).pipe(Effect.orElseSucceed(() => false))) {
    yield* EpisodeLog.read(episodesFile).pipe(
      Stream.runForEach((group) =>
        Effect.sync(() => {
          const key = groupKey(group.promptUid, group.cursor)
          const step = consumed.length > 0 ? stepOf.get(key) : Math.floor(recorded / batchSize) + 1
          recorded += 1
          if (step === undefined) return // recorded, never trained on
          const tokens = group.trajectories.reduce((n, t) => n + t.lossMask.reduce<number>((m, x) => m + x, 0), 0)
          counted.set(key, { step, trajectories: group.trajectories.length, tokens })
          if (candidates.has(step)) kept.set(key, { step, group })
          else kept.delete(key)
        })
      ),
      Effect.mapError(
        (e) => new ReportError({ path: e.file, ...(e.line === undefined ? {} : { line: e.line }), message: e.message })
      )
    )
  }
  const byStepCounts = new Map<number, { groups: number; trajectories: number; tokens: number }>()
  for (const c of counted.values()) {
    const n = byStepCounts.get(c.step) ?? { groups: 0, trajectories: 0, tokens: 0 }
    n.groups += 1
    n.trajectories += c.trajectories
    n.tokens += c.tokens
    byStepCounts.set(c.step, n)
  }

  // the groups shown: per step the first `maxGroupsPerStep` by cursor; then fewer steps while over the token budget
  const byStep = new Map<number, Array<TrajectoryGroup>>()
  for (const { step, group } of kept.values()) byStep.set(step, [...(byStep.get(step) ?? []), group])
  const tokensByStep = new Map<number, number>()
  for (const [step, groups] of byStep) {
    const shown = groups.sort((a, b) => a.cursor - b.cursor).slice(0, maxGroupsPerStep)
    byStep.set(step, shown)
    tokensByStep.set(
      step,
      shown.reduce((n, g) => n + groupTokens(g, maxTokens), 0)
    )
  }
  let shownSteps = [...byStep.keys()].sort((a, b) => a - b)
  const total = (ss: ReadonlyArray<number>) => ss.reduce((n, s) => n + (tokensByStep.get(s) ?? 0), 0)
  while (shownSteps.length > 1 && total(shownSteps) > maxTotalTokens) {
    const fewer = evenly(shownSteps.length, Math.floor(shownSteps.length * 0.8)).map((i) => shownSteps[i]!)
    shownSteps = fewer.length < shownSteps.length ? fewer : shownSteps.slice(0, -1)
  }

  const trainedSteps = byStepCounts.size
  const cutGroups = shownSteps.some((s) => (byStepCounts.get(s)?.groups ?? 0) > maxGroupsPerStep)
  const notes = [
    `Episodes of ${shownSteps.length} of ${trainedSteps} trained steps${shownSteps.length < trainedSteps ? " (sampled evenly)" : ""}`,
    cutGroups ? `at most ${maxGroupsPerStep} groups per step (lowest dataset cursor first)` : "all groups of each",
    `prompts and responses cut at ${maxTokens} tokens`
  ]
  if (recorded > counted.size)
    notes.push(`${recorded - counted.size} recorded groups were never trained on or re-recorded`)
  if (tokenizer === undefined) notes.push("no tokenizer could be loaded: tokens are shown as ids")

  const viewGroup = (g: TrajectoryGroup): ViewGroup => ({
    uid: g.promptUid,
    cursor: g.cursor,
    dataSource: g.dataSource,
    envClass: g.envClass,
    prompt: toTokens(tokenizer, specialIds, g.trajectories[0]?.promptIds ?? [], undefined, undefined, maxTokens),
    trajectories: g.trajectories.map((t) => viewTrajectory(t, tokenizer, specialIds, maxTokens))
  })

  const rewards = train.series["reward/avg_raw_reward"] ?? []
  const firstReward = rewards.find((r) => r !== null)
  const lastReward = [...rewards].reverse().find((r) => r !== null)
  const mode = config?.pipeline.mode
  const data: Data = {
    runDir: path.resolve(runDir),
    generatedAt: new Date(yield* Clock.currentTimeMillis).toISOString(),
    summary: {
      steps: train.steps.length === 0 ? 0 : train.steps[train.steps.length - 1]!,
      seconds: Math.round(wallSeconds(records) * 10) / 10,
      trajectories: [...byStepCounts.values()].reduce((n, c) => n + c.trajectories, 0),
      generatedTokens: [...byStepCounts.values()].reduce((n, c) => n + c.tokens, 0),
      ...(firstReward === undefined || firstReward === null ? {} : { firstReward }),
      ...(lastReward === undefined || lastReward === null ? {} : { lastReward }),
      ...(evalCols.steps.length === 0 ? {} : { evalBefore: evalScore(evalCols, 0) }),
      ...(evalCols.steps.length < 2 ? {} : { evalAfter: evalScore(evalCols, evalCols.steps.length - 1) }),
      tokenizer: loaded === undefined ? "none (ids shown)" : `${loaded.tokenizer.kind} (${loaded.from})`,
      ...(mode === undefined ? {} : { mode })
    },
    train: withThroughput(train, byStepCounts),
    eval: evalCols,
    episodes: {
      note: `${notes.join("; ")}.`,
      steps: shownSteps.map((step) => ({ step, groups: (byStep.get(step) ?? []).map(viewGroup) }))
    },
    config: configText
  }
  return data
})

/**
 * Throughput per step, added as `throughput/*` columns:
 *   trajectories_per_s = trajectories trained in the step / timing/step
 *   tokens_per_s       = sampled tokens (loss mask 1) in the step / timing/generate (timing/step when absent)
 * counted from the episode log (no throughput columns without one).
 */
const withThroughput = (
  train: Columns,
  counts: ReadonlyMap<number, { readonly trajectories: number; readonly tokens: number }>
): Columns => {
  const stepSeconds = train.series["timing/step"]
  const generateSeconds = train.series["timing/generate"] ?? stepSeconds
  if (stepSeconds === undefined || counts.size === 0) return train
  const per = (i: number, s: ReadonlyArray<number | null> | undefined, pick: "trajectories" | "tokens") => {
    const c = counts.get(train.steps[i]!)
    const seconds = s?.[i]
    return c === undefined || seconds === null || seconds === undefined || seconds <= 0
      ? null
      : Math.round((c[pick] / seconds) * 100) / 100
  }
  return {
    steps: train.steps,
    series: {
      ...train.series,
      "throughput/trajectories_per_s": train.steps.map((_, i) => per(i, stepSeconds, "trajectories")),
      "throughput/tokens_per_s": train.steps.map((_, i) => per(i, generateSeconds, "tokens"))
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Several runs on the same charts

/** One run of a comparison: its name (the run directory's), summary and metric columns. */
export interface CompareRun {
  readonly name: string
  readonly runDir: string
  readonly summary: Data["summary"]
  readonly train: Columns
  readonly eval: Columns
}

export interface CompareData {
  readonly generatedAt: string
  readonly runs: ReadonlyArray<CompareRun>
}

/** Names for run directories: their base names, the paths as given where two base names are the same. */
export const runNames = (runDirs: ReadonlyArray<string>): Array<string> => {
  const base = (dir: string) => dir.replace(/\/+$/, "").split("/").pop() || dir
  const bases = runDirs.map(base)
  return runDirs.map((dir, i) => (bases.filter((b) => b === bases[i]).length > 1 ? dir : bases[i]!))
}

/** Read several run directories into one comparison (metrics and summaries; no episodes). */
export const collectMany = Effect.fn("Report.collectMany")(function* (runDirs: ReadonlyArray<string>) {
  const names = runNames(runDirs)
  const runs: Array<CompareRun> = []
  for (const [i, runDir] of runDirs.entries()) {
    const data = yield* collect(runDir, { maxSteps: 1, maxGroupsPerStep: 1, maxTokens: 1, maxTotalTokens: 1 })
    runs.push({ name: names[i]!, runDir: data.runDir, summary: data.summary, train: data.train, eval: data.eval })
  }
  const compare: CompareData = { generatedAt: new Date(yield* Clock.currentTimeMillis).toISOString(), runs }
  return compare
})
