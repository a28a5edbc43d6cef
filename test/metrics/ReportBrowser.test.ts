/**
 * The report as a person sees it: rendered by headless Chromium (Debian's /usr/bin/chromium, driven by
 * playwright-core, offline, a fresh profile). Skips when Chromium is not installed (scripts/setup-system.sh installs it).
 */
import { existsSync, mkdtempSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { chromium } from "playwright-core"
import * as Report from "../../src/metrics/Report.ts"
import * as SyntheticRun from "./SyntheticRun.ts"

const executablePath = "/usr/bin/chromium"
const hasChromium = existsSync(executablePath)
const skipped = hasChromium ? "" : ` (SKIPPED: ${executablePath} is absent; apt-get install chromium)`
if (!hasChromium) console.warn(`ReportBrowser.test.ts: ${executablePath} is absent, skipping the browser check`)

interface PageReport {
  readonly ready: boolean
  readonly errors: ReadonlyArray<string>
  readonly charts: ReadonlyArray<{
    readonly title: string
    readonly series: ReadonlyArray<{ readonly key: string; readonly points: number }>
    readonly plotted?: ReadonlyArray<number>
    readonly width: number
    readonly height: number
  }>
}

interface CompareReport {
  readonly ready: boolean
  readonly errors: ReadonlyArray<string>
  readonly smoothing: number
  readonly runs: ReadonlyArray<{ readonly name: string; readonly colour: string }>
  readonly charts: ReadonlyArray<{
    readonly title: string
    readonly series: ReadonlyArray<{ readonly run: string; readonly key: string; readonly points: number }>
    readonly plotted?: ReadonlyArray<number>
    readonly width: number
  }>
  readonly values: (title: string, index: number) => Array<number | null> | null
  readonly setSmoothing: (weight: number) => void
}

/** The browser globals the checks below read (tsconfig has no DOM lib; these run in the page). */
interface Node {
  readonly textContent: string | null
}
interface Browser {
  readonly __report?: PageReport
  readonly document: {
    readonly querySelector: (selector: string) => Node | null
    readonly querySelectorAll: (selector: string) => ArrayLike<Node> & Iterable<Node>
    readonly getElementById: (id: string) => Node | null
  }
  readonly getComputedStyle: (node: Node) => { readonly backgroundColor: string }
}

/** A headless Chromium page on a fresh profile, closed with the scope. */
const browserPage = Effect.acquireRelease(
  Effect.promise(async () => {
    const profile = mkdtempSync(join(tmpdir(), "effect-rl-chromium-"))
    const context = await chromium.launchPersistentContext(profile, {
      executablePath,
      headless: true,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync"
      ],
      viewport: { width: 1280, height: 900 },
      offline: true
    })
    return { context, profile, page: context.pages()[0] ?? (await context.newPage()) }
  }),
  ({ context, profile }) =>
    Effect.promise(async () => {
      await context.close()
      rmSync(profile, { recursive: true, force: true })
    })
)

describe.skipIf(!hasChromium)(`report in headless Chromium${skipped}`, () => {
  it.effect(
    "draws every chart with points, shows a chosen group's turns with tokens coloured by loss mask, logs no errors",
    () =>
      Effect.gen(function* () {
        const runDir = mkdtempSync(join(tmpdir(), "effect-rl-report-browser-"))
        yield* SyntheticRun.write(runDir, 60)
        const { file } = yield* Report.write(runDir)
        const { page } = yield* browserPage
        const problems: Array<string> = []
        page.on("console", (m) => {
          if (m.type() === "error" || m.type() === "warning") problems.push(`console.${m.type()}: ${m.text()}`)
        })
        page.on("pageerror", (e) => problems.push(`page error: ${e.message}`))
        page.on("dialog", (d) => problems.push(`dialog opened: ${d.message()}`)) // model output must never run
        page.on("request", (r) => {
          if (!r.url().startsWith("file:")) problems.push(`network request: ${r.url()}`)
        })

        const report = yield* Effect.promise(async () => {
          await page.goto(`file://${file}`)
          await page.waitForFunction(() => (globalThis as unknown as Browser).__report?.ready === true)
          return page.evaluate(() => (globalThis as unknown as Browser).__report!)
        })
        assert.deepStrictEqual(report.errors, [])

        // 16 fixed charts (the optional ones included: the run recorded async/staleness_* and per-family evals) + the
        // metric explorer's
        const titles = report.charts.map((c) => c.title)
        assert.strictEqual(report.charts.length, 17, titles.join(", "))
        assert.include(titles, "Staleness (policy versions behind)")
        const heldOut = report.charts.find((c) => c.title === "Held-out success (eval avg_score, pass@n)")
        assert.deepStrictEqual(
          heldOut?.series.map((s) => s.key),
          ["eval/all/avg_score", "eval/all/pass_at_n", "eval/toolbox/avg_score", "eval/toolbox/pass_at_n"]
        )
        const perGroup = report.charts.find((c) => c.title === "Held-out avg_score per group")
        assert.deepStrictEqual(
          perGroup?.series.map((s) => s.key),
          ["eval/toolbox/family=date_span/avg_score", "eval/toolbox/family=unit_sum/avg_score"]
        )
        for (const chart of report.charts) {
          assert.isAbove(chart.width, 200, chart.title)
          assert.isAbove(chart.height, 100, chart.title)
          assert.isAbove(chart.series.length, 0, chart.title)
          // uPlot holds every point: 60 per training series, 2 (steps 0 and 60) per eval series
          const expected = chart.title.startsWith("Held-out") ? 2 : 60
          assert.deepStrictEqual(
            chart.plotted,
            chart.series.map(() => expected),
            chart.title
          )
        }
        const canvases = yield* Effect.promise(() =>
          page.$$eval("canvas", (cs) =>
            cs.map((c) => c.getBoundingClientRect().width * c.getBoundingClientRect().height)
          )
        )
        assert.strictEqual(canvases.length, 17)
        for (const area of canvases) assert.isAbove(area, 0)

        // the viewer: step 60, second group → 4 samples × 2 turns, the tool call with its result as text
        const viewer = yield* Effect.promise(async () => {
          await page.selectOption("#step-select", { label: "step 60 (2 groups)" })
          await page.selectOption("#group-select", { index: 1 })
          return page.evaluate(() => {
            const { document, getComputedStyle } = globalThis as unknown as Browser
            const q = (s: string) => document.querySelectorAll(s)
            const colour = (s: string) => getComputedStyle(document.querySelector(s)!).backgroundColor
            return {
              meta: document.getElementById("group-meta")!.textContent,
              trajectories: q("#trajectories .trajectory").length,
              turns: q("#trajectories .turn").length,
              sampled: q("#trajectories .tok.m1").length,
              context: q("#trajectories .tok.m0").length,
              sampledColour: colour("#trajectories .tok.m1"),
              contextColour: colour("#trajectories .tok.m0"),
              toolResult: q("#trajectories .tool-call pre")[1]?.textContent,
              scriptsInViewer: q("#trajectories script, #trajectories b:not(.turn-head b)").length,
              firstSampleText: document.querySelector("#trajectories .trajectory .body")!.textContent,
              rewards: [...q("#trajectories .trajectory > summary .badge:first-child")].map((b) => b.textContent)
            }
          })
        })
        assert.include(viewer.meta, "toolbox-train-00119")
        assert.include(viewer.meta, "trained in step 60")
        assert.strictEqual(viewer.trajectories, 4)
        assert.strictEqual(viewer.turns, 8)
        assert.isAbove(viewer.sampled, 0)
        assert.isAbove(viewer.context, 0)
        assert.notStrictEqual(viewer.sampledColour, viewer.contextColour)
        assert.strictEqual(viewer.toolResult, SyntheticRun.toolResult)
        assert.strictEqual(viewer.scriptsInViewer, 0)
        assert.include(viewer.firstSampleText, SyntheticRun.answer)
        assert.deepStrictEqual(viewer.rewards, ["reward 1", "reward 1", "reward 0", "reward 0"])

        // the screenshot stays for a person to look at; the run directory goes
        const screenshot = join(mkdtempSync(join(tmpdir(), "effect-rl-report-screenshot-")), "report.png")
        yield* Effect.promise(() => page.screenshot({ path: screenshot, fullPage: true }))
        assert.isAbove(statSync(screenshot).size, 10_000)
        assert.deepStrictEqual(problems, [])
        rmSync(runDir, { recursive: true, force: true })
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)),
    120_000
  )

  it.effect(
    "overlays two runs on every chart in their own colours, legend names the runs, smoothing redraws the curves",
    () =>
      Effect.gen(function* () {
        const root = mkdtempSync(join(tmpdir(), "effect-rl-report-compare-browser-"))
        yield* SyntheticRun.write(join(root, "run-a"), 20)
        yield* SyntheticRun.write(join(root, "run-b"), 40)
        const { file } = yield* Report.writeMany([join(root, "run-a"), join(root, "run-b")], {
          out: join(root, "compare.html")
        })
        const { page } = yield* browserPage
        const problems: Array<string> = []
        page.on("console", (m) => {
          if (m.type() === "error" || m.type() === "warning") problems.push(`console.${m.type()}: ${m.text()}`)
        })
        page.on("pageerror", (e) => problems.push(`page error: ${e.message}`))
        page.on("request", (r) => {
          if (!r.url().startsWith("file:")) problems.push(`network request: ${r.url()}`)
        })
        const report = yield* Effect.promise(async () => {
          await page.goto(`file://${file}`)
          await page.waitForFunction(() => (globalThis as unknown as Browser).__report?.ready === true)
          return page.evaluate(() => (globalThis as unknown as Browser).__report! as unknown as CompareReport)
        })
        assert.deepStrictEqual(report.errors, [])
        assert.deepStrictEqual(
          report.runs.map((r) => r.name),
          ["run-a", "run-b"]
        )
        assert.notStrictEqual(report.runs[0]!.colour, report.runs[1]!.colour)
        assert.isAbove(report.charts.length, 10)
        const reward = report.charts.find((c) => c.title.startsWith("Reward"))!
        for (const chart of report.charts) {
          assert.isAbove(chart.width, 200, chart.title)
          assert.deepStrictEqual([...new Set(chart.series.map((s) => s.run))], ["run-a", "run-b"], chart.title)
        }
        // every training series of run-a has 20 points, run-b's 40 (on the union of their steps)
        for (const [i, s] of reward.series.entries()) {
          assert.strictEqual(s.points, s.run === "run-a" ? 20 : 40)
          assert.strictEqual(reward.plotted?.[i], s.points)
        }
        const legend = yield* Effect.promise(() =>
          page.$$eval(".chart-card .u-legend .u-series th", (ths) => ths.map((t) => t.textContent ?? ""))
        )
        assert.isTrue(legend.some((t) => t.includes("run-a")))
        assert.isTrue(legend.some((t) => t.includes("run-b")))

        // smoothing: the curves change, their recorded points stay
        const title = reward.title
        const smoothed = yield* Effect.promise(() =>
          page.evaluate((t) => {
            const r = (globalThis as unknown as { __report: CompareReport }).__report
            const raw = r.values(t, 1)
            r.setSmoothing(0.9)
            return { raw, smooth: r.values(t, 1), smoothing: r.smoothing }
          }, title)
        )
        assert.strictEqual(smoothed.smoothing, 0.9)
        assert.notDeepEqual(smoothed.raw, smoothed.smooth)
        assert.strictEqual(
          smoothed.smooth!.filter((v) => v !== null).length,
          smoothed.raw!.filter((v) => v !== null).length
        )
        const shown = yield* Effect.promise(() => page.textContent("#smoothing-value"))
        assert.strictEqual(shown, "0.90")
        assert.deepStrictEqual(problems, [])
        rmSync(root, { recursive: true, force: true })
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)),
    120_000
  )
})
