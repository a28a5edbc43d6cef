/**
 * Run metrics: one JSON object per training step (and per eval) appended to `<run dir>/metrics.jsonl`, with the
 * names of MetricKeys (SkyRL's where it has one: `reward/avg_pass_at_n`, `loss/policy`, `policy/approx_kl`,
 * `timing/*`, `eval/<source>/avg_score`), and a live progress line on stderr: step, reward, pass@n, elapsed, ETA.
 * With `gauges` (a tracking backend reads them: otlp, prometheus), every recorded value also sets an Effect gauge of
 * the metric's name, plus `trainer/step` for the step of the last record.
 */
import { Clock, Console, Context, Effect, FileSystem, Layer, Metric, Path, Ref } from "effect"
import * as ConsumedLog from "../store/ConsumedLog.ts"
import * as RunDirectory from "../store/RunDirectory.ts"
import * as MetricKeys from "./MetricKeys.ts"

export interface Progress {
  readonly step: number
  readonly totalSteps: number
  readonly values: MetricKeys.Values
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

/**
 * `step 3/20 ███░░░ reward 0.412 pass@n 0.750 kl 0.002 | 0:41 elapsed, ETA 3:52`. The ETA is the steps left times
 * `secondsPerStep`, the mean training-step time so far (evaluations and start-up are not steps); without it, elapsed
 * time over steps done.
 */
export const progressLine = (p: Progress, elapsed: number, secondsPerStep?: number): string => {
  const width = 20
  const done = Math.min(width, Math.round((p.step / Math.max(1, p.totalSteps)) * width))
  const bar = "█".repeat(done) + "░".repeat(width - done)
  const perStep = secondsPerStep ?? (p.step > 0 ? elapsed / p.step : Number.NaN)
  const eta = perStep * (p.totalSteps - p.step)
  return (
    `step ${p.step}/${p.totalSteps} ${bar} reward ${fmt(p.values["reward/avg_raw_reward"])} ` +
    `pass@n ${fmt(p.values["reward/avg_pass_at_n"])} kl ${fmt(p.values["policy/approx_kl"], 4)} ` +
    `| ${clock(elapsed)} elapsed, ETA ${Number.isFinite(eta) ? clock(eta) : "-"}`
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
      yield* fs
        .writeFileString(file, `${line}\n`, { flag: "a" })
        .pipe(Effect.catch((e) => Effect.logWarning(`metrics: cannot append to ${file}: ${e.message}`)))
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
      return options.progress
        ? Effect.flatMap(elapsedSeconds, (elapsed) =>
            Console.error(progressLine(p, elapsed, timedSteps > 0 ? stepSeconds / timedSteps : undefined))
          )
        : Effect.void
    })
  return Metrics.of({ file, record, progress, elapsedSeconds })
})

export const layer = (runDir: string, options: Options) => Layer.effect(Metrics, make(runDir, options))
