/**
 * Run metrics: one JSON object per training step (and per eval) appended to `<run dir>/metrics.jsonl`, with the
 * names of MetricKeys (SkyRL's where it has one: `reward/avg_pass_at_n`, `loss/policy`, `policy/approx_kl`,
 * `timing/*`, `eval/<source>/avg_score`), and a live progress line on stderr: step, reward, pass@n, elapsed, and the
 * ETA to the last step or to the time budget, whichever ends the run first.
 * With `gauges` (a tracking backend reads them: otlp, prometheus), every recorded value also sets an Effect gauge of
 * the metric's name, plus `trainer/step` for the step of the last record.
 */
import { Clock, Console, Context, Effect, FileSystem, Layer, Metric, Path, Ref } from "effect"
import * as DiskFull from "../domain/DiskFull.ts"
import * as ConsumedLog from "../store/ConsumedLog.ts"
import * as RunDirectory from "../store/RunDirectory.ts"
import * as MetricKeys from "./MetricKeys.ts"

export interface Progress {
  readonly step: number
  readonly totalSteps: number
  readonly values: MetricKeys.Values
  /** When `trainer.max_train_seconds` passes (epoch ms, the training loop's deadline); absent without a budget. */
  readonly deadline?: number
}

export class Metrics extends Context.Service<
  Metrics,
  {
    readonly file: string
    /** Append one record (`step` and `event` are added) and update the progress line. */
    readonly record: (event: string, step: number, values: MetricKeys.Values) => Effect.Effect<void>
    readonly progress: (progress: Progress) => Effect.Effect<void>
    readonly elapsedSeconds: Effect.Effect<number>
  }
>()("rl/metrics/Metrics") {}

export const fileName = RunDirectory.metricsFile

const fmt = (x: number | undefined, digits = 3) => (x === undefined || !Number.isFinite(x) ? "-" : x.toFixed(digits))

const clock = (seconds: number) => {
  const s = Math.max(0, Math.round(seconds))
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`
}

/** When training ends: in `seconds`, and which limit ends it (`steps` more steps, or the time budget). */
export interface Eta {
  readonly seconds: number
  readonly limit: "steps" | "time budget"
  readonly steps: number // the steps still to train
}

/**
 * When training ends, at `secondsPerStep` a step: after the `stepsLeft` steps, or earlier when
 * `trainer.max_train_seconds` passes first (`budgetLeft`: its seconds left). The loop stops after the step during which
 * the budget passes, so the budget leaves ⌈budgetLeft / secondsPerStep⌉ more steps. `budgetLeft` is wall time, so it
 * also counts the evaluations and checkpoints between the steps; the steps' own pace does not.
 */
export const eta = (stepsLeft: number, secondsPerStep: number, budgetLeft?: number): Eta => {
  const byBudget =
    budgetLeft === undefined ? Number.POSITIVE_INFINITY : Math.max(0, Math.ceil(budgetLeft / secondsPerStep))
  return byBudget < stepsLeft
    ? { seconds: byBudget * secondsPerStep, limit: "time budget", steps: byBudget }
    : { seconds: stepsLeft * secondsPerStep, limit: "steps", steps: stepsLeft }
}

/**
 * `step 3/240 █░░░ reward 0.412 pass@n 0.750 kl 0.002 | 0:41 elapsed, ETA 3:52 (time budget)`. The pace is
 * `secondsPerStep`, the mean training-step time so far (evaluations and start-up are not steps); without it, elapsed
 * time over steps done. The ETA counts down to the earlier of the last step and the time budget (`budgetLeft`,
 * seconds until `trainer.max_train_seconds` passes) and says which: `(time budget)` or `(N steps left)`.
 */
export const progressLine = (p: Progress, elapsed: number, secondsPerStep?: number, budgetLeft?: number): string => {
  const width = 20
  const done = Math.min(width, Math.round((p.step / Math.max(1, p.totalSteps)) * width))
  const bar = "█".repeat(done) + "░".repeat(width - done)
  const perStep = secondsPerStep ?? (p.step > 0 ? elapsed / p.step : Number.NaN)
  const left = eta(Math.max(0, p.totalSteps - p.step), perStep, budgetLeft)
  const until = left.limit === "time budget" ? "time budget" : `${left.steps} step${left.steps === 1 ? "" : "s"} left`
  return (
    `step ${p.step}/${p.totalSteps} ${bar} reward ${fmt(p.values["reward/avg_raw_reward"])} ` +
    `pass@n ${fmt(p.values["reward/avg_pass_at_n"])} kl ${fmt(p.values["policy/approx_kl"], 4)} ` +
    `| ${clock(elapsed)} elapsed, ETA ${Number.isFinite(left.seconds) ? `${clock(left.seconds)} (${until})` : "-"}`
  )
}

export interface Options {
  readonly progress: boolean
  /** Also set an Effect gauge per metric name (Tracking's otlp and prometheus backends export them). */
  readonly gauges?: boolean
}

const gauges = new Map<string, Metric.Gauge<number>>()
const gaugeOf = (name: string) => {
  let g = gauges.get(name)
  if (g === undefined) {
    const description = MetricKeys.meaning(name)
    g = Metric.gauge(name, description === undefined ? undefined : { description })
    gauges.set(name, g)
  }
  return g
}

/** Set the gauge of every finite value, and `trainer/step`. */
const setGauges = (step: number, values: MetricKeys.Values) =>
  Effect.suspend(() => {
    const updates = [Metric.update(gaugeOf("trainer/step"), step)]
    for (const [name, value] of Object.entries(values)) {
      if (typeof value === "number" && Number.isFinite(value)) updates.push(Metric.update(gaugeOf(name), value))
    }
    return Effect.all(updates, { discard: true })
  })

export const make = Effect.fn("Metrics.make")(function* (runDir: string, options: Options) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const file = path.join(runDir, fileName)
  yield* fs.makeDirectory(runDir, { recursive: true }).pipe(Effect.orDie)
  // a resumed run appends after a crash: a torn last line must not swallow the next record
  yield* ConsumedLog.dropTornTail(file)
  const started = yield* Clock.currentTimeMillis
  const lastValues = yield* Ref.make<MetricKeys.Values>({})
  const elapsedSeconds = Effect.map(Clock.currentTimeMillis, (now) => (now - started) / 1000)
  const record = (event: string, step: number, values: MetricKeys.Values) =>
    Effect.gen(function* () {
      const time = yield* elapsedSeconds
      const line = JSON.stringify({ event, step, time: Math.round(time * 1000) / 1000, ...values })
      yield* fs.writeFileString(file, `${line}\n`, { flag: "a" }).pipe(
        Effect.catch((e) =>
          // a full disk stops the run (in one line, at the top); any other failure loses this line only
          DiskFull.is(e)
            ? Effect.die(DiskFull.at(file))
            : Effect.logWarning(`metrics: cannot append to ${file}: ${e.message}`)
        )
      )
      if (event === "train") yield* Ref.set(lastValues, { ...values })
      if (options.gauges === true) yield* setGauges(step, values)
    })
  // the ETA's pace: the steps' own times (`timing/step`), not the evaluations between them or the start-up before
  let stepSeconds = 0
  let timedSteps = 0
  const progress = (p: Progress) =>
    Effect.suspend(() => {
      const t = p.values["timing/step"]
      if (t !== undefined && Number.isFinite(t)) {
        stepSeconds += t
        timedSteps++
      }
      if (!options.progress) return Effect.void
      return Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const budgetLeft = p.deadline === undefined ? undefined : (p.deadline - now) / 1000
        const perStep = timedSteps > 0 ? stepSeconds / timedSteps : undefined
        yield* Console.error(progressLine(p, (now - started) / 1000, perStep, budgetLeft))
      })
    })
  return Metrics.of({ file, record, progress, elapsedSeconds })
})

export const layer = (runDir: string, options: Options) => Layer.effect(Metrics, make(runDir, options))
