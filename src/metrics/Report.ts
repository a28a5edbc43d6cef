/**
 * The run report: one self-contained HTML file built from a run directory (metrics.jsonl, episodes.jsonl,
 * consumed.jsonl, config.yaml, the latest checkpoint's tokenizer), with no network at view time: the charting library
 * (uPlot, MIT) and its CSS are inlined, and the data is embedded as JSON.
 *
 * What it shows: the run's summary (steps, wall time, held-out eval before → after), curves of every training metric
 * (reward, pass@n, held-out success, KL, entropy, response length, staleness, throughput, losses, timings), and a
 * trajectory viewer (step → group → each sample's turns, tokens coloured by loss mask, tool calls with their I/O,
 * per-turn rewards, stop reason).
 *
 * The data it embeds, how it is read from the run directory and what is left out: ReportData.ts.
 *
 * Everything from the run (model output, tool results, config) is data: it goes into the page as JSON inside a
 * `<script type="application/json">` with `<`, `>`, `&` escaped, and the page's script writes it with `textContent`.
 */
import { createRequire } from "node:module"
import { Cause, Effect, FileSystem, Path } from "effect"
import * as DiskFull from "../domain/DiskFull.ts"
import * as Metrics from "./Metrics.ts"
import * as ReportData from "./ReportData.ts"
import * as ComparePage from "./report-template/ComparePage.ts"
import * as ReportPage from "./report-template/ReportPage.ts"

export interface Options extends ReportData.Options {
  /** where to write; default `<run dir>/report.html` */
  readonly out?: string
}

// ---------------------------------------------------------------------------------------------------------------
// Rendering and writing

/** JSON safe inside a `<script>` element: no `<`, `>`, `&` or line separators survive unescaped. */
export const scriptJson = (value: unknown): string =>
  JSON.stringify(value)
    .replace(/</g, "\\u003c")
    .replace(/>/g, "\\u003e")
    .replace(/&/g, "\\u0026")
    .replace(/\u2028/g, "\\u2028")
    .replace(/\u2029/g, "\\u2029")

/** The charting library's browser build and stylesheet, read from node_modules (inlined into the page). */
export const chartAssets = Effect.fn("Report.chartAssets")(function* () {
  const fs = yield* FileSystem.FileSystem
  const require = createRequire(import.meta.url)
  const read = (name: string) =>
    Effect.try({
      try: () => require.resolve(`uplot/${name}`),
      catch: () => new ReportData.ReportError({ path: `uplot/${name}`, message: "the uplot package is not installed" })
    }).pipe(
      Effect.flatMap((file) =>
        fs
          .readFileString(file)
          .pipe(
            Effect.mapError(
              (cause) => new ReportData.ReportError({ path: file, message: `cannot read: ${cause.message}` })
            )
          )
      )
    )
  const script = yield* read("dist/uPlot.iife.min.js")
  const style = yield* read("dist/uPlot.min.css")
  const license = yield* read("LICENSE") // MIT: the notice travels with the copy
  // inlined verbatim: a closing tag inside would end the element early
  return {
    script: `/* uPlot ${license.replace(/\*\//g, "* /").trim()} */\n${script}`.replace(/<\/(script)/gi, "<\\/$1"),
    style: style.replace(/<\/(style)/gi, "<\\/$1")
  }
})

/** The HTML page for `data` (pure). */
export const render = (data: ReportData.Data, assets: { readonly script: string; readonly style: string }): string =>
  ReportPage.html({ data, dataJson: scriptJson(data), chartScript: assets.script, chartStyle: assets.style })

/** The report's file name in a run directory. */
export const fileName = "report.html"

/** Write `text` to `file` atomically: a temporary file beside it, then a rename (a reader never sees half a page). */
const writeAtomic = (file: string, text: string) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const tmp = `${file}.${process.pid}.tmp`
    yield* fs.writeFileString(tmp, text).pipe(
      Effect.flatMap(() => fs.rename(tmp, file)),
      Effect.tapError(() => fs.remove(tmp).pipe(Effect.ignore)),
      Effect.mapError(
        DiskFull.orElse(
          file,
          (cause) => new ReportData.ReportError({ path: file, message: `cannot write: ${(cause as Error).message}` })
        )
      )
    )
  })

/** Build the report of `runDir` and write it (default `<runDir>/report.html`); returns the file and its size. */
export const write = Effect.fn("Report.write")(function* (runDir: string, options: Options = {}) {
  const path = yield* Path.Path
  const data = yield* ReportData.collect(runDir, options)
  const html = render(data, yield* chartAssets())
  const out = options.out ?? path.join(runDir, fileName)
  yield* writeAtomic(out, html)
  return {
    file: out,
    bytes: Buffer.byteLength(html),
    steps: data.summary.steps,
    episodeSteps: data.episodes.steps.length
  }
})

/**
 * Rewrite `<runDir>/report.html` during a run (after an eval or a checkpoint): a report that cannot be built or
 * written is a warning, but a full disk stops the run (a DiskFullError defect, said in one line at the top); before the
 * run's first record there is nothing to report and nothing is written.
 */
export const refresh = (runDir: string): Effect.Effect<void, never, FileSystem.FileSystem | Path.Path> =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const path = yield* Path.Path
    if (!(yield* fs.exists(path.join(runDir, Metrics.fileName)).pipe(Effect.orElseSucceed(() => false)))) return
    yield* write(runDir)
  }).pipe(
    Effect.catchCause((cause) => {
      const error = Cause.squash(cause)
      if (DiskFull.is(error)) return Effect.die(DiskFull.find(error))
      return Cause.hasInterruptsOnly(cause)
        ? Effect.failCause(cause as Cause.Cause<never>)
        : Effect.logWarning(`report not refreshed: ${error instanceof Error ? error.message : String(error)}`)
    }),
    Effect.withSpan("Report.refresh")
  )

// ---------------------------------------------------------------------------------------------------------------
// Several runs on the same charts

/** Write one page overlaying `runDirs` on the same charts (default `./compare.html`). */
export const writeMany = Effect.fn("Report.writeMany")(function* (
  runDirs: ReadonlyArray<string>,
  options: { readonly out?: string } = {}
) {
  const data = yield* ReportData.collectMany(runDirs)
  const assets = yield* chartAssets()
  const html = ComparePage.html({
    data,
    dataJson: scriptJson(data),
    chartScript: assets.script,
    chartStyle: assets.style
  })
  const out = options.out ?? compareFileName
  yield* writeAtomic(out, html)
  return { file: out, bytes: Buffer.byteLength(html), runs: data.runs.length }
})

/** The comparison page's file when `--out` is not given (in the working directory: no run is written to). */
export const compareFileName = "compare.html"
