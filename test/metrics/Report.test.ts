import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import * as fs from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Metrics from "../../src/metrics/Metrics.ts"
import * as Report from "../../src/metrics/Report.ts"
import * as ReportData from "../../src/metrics/ReportData.ts"
import * as EpisodeLog from "../../src/store/EpisodeLog.ts"
import * as SyntheticRun from "./SyntheticRun.ts"

const steps = 60

/** The embedded JSON, parsed back out of the page. */
const embedded = (html: string): ReportData.Data => {
  const m = /<script type="application\/json" id="report-data">([\s\S]*?)<\/script>/.exec(html)
  assert.isNotNull(m, "the page embeds its data")
  return JSON.parse(m![1]!) as ReportData.Data
}

describe("Report.write", () => {
  it.effect("writes one self-contained page with the run's curves, eval before → after and sampled episodes", () =>
    Effect.gen(function* () {
      const runDir = mkdtempSync(join(tmpdir(), "effect-rl-report-"))
      yield* SyntheticRun.write(runDir, steps)
      const written = yield* Report.write(runDir)
      assert.strictEqual(written.file, join(runDir, "report.html"))
      const html = readFileSync(written.file, "utf8")
      assert.strictEqual(written.bytes, Buffer.byteLength(html))

      // nothing is fetched at view time: no script/link/img pointing anywhere, the chart library is inline
      assert.notMatch(html, /<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=/i)
      assert.notMatch(html, /<[^>]+\b(src|href)\s*=\s*["']?(https?:)?\/\//i)
      assert.include(html, "uPlot")
      assert.include(html, 'id="charts"')
      assert.include(html, 'id="step-select"')
      assert.include(html, 'id="group-select"')
      assert.include(html, 'id="trajectories"')

      // model output is data: the tool result's markup never appears as markup
      assert.notInclude(html, SyntheticRun.toolResult)
      assert.notInclude(html, "<script>alert")
      assert.strictEqual(html.match(/<script\b/g)?.length, 3) // uPlot, the data, the page script

      // header: 60 steps; held-out avg_score 0.25 → 0.75 and pass@n 0.5 → 1 for "toolbox" and "all"
      const header = html.slice(html.indexOf("<header>"), html.indexOf("</header>"))
      assert.include(header, '<div class="value">60</div>')
      assert.match(
        header,
        /<td>toolbox<\/td><td>0\.250 <span class="arrow up">→<\/span> 0\.750<\/td><td>0\.500 <span class="arrow up">→<\/span> 1<\/td>/
      )
      assert.match(
        header,
        /<td>toolbox\/family=date_span<\/td><td>0 <span class="arrow up">→<\/span> 0\.500<\/td><td>0 <span class="arrow up">→<\/span> 1<\/td>/
      )
      assert.include(header, "step 0 → step 60")

      const data = embedded(html)
      assert.deepStrictEqual(
        data.train.steps,
        Array.from({ length: steps }, (_, i) => i + 1)
      )
      assert.deepStrictEqual(
        data.train.series["reward/avg_raw_reward"],
        data.train.steps.map((s) => SyntheticRun.rewardAt(s, steps))
      )
      assert.deepStrictEqual(data.eval.steps, [0, 60])
      assert.deepStrictEqual(data.eval.series["eval/toolbox/avg_score"], [0.25, 0.75])
      assert.deepStrictEqual(data.train.series["async/staleness_max"]?.[0], 1)
      // throughput: 2 groups × 4 samples / timing/step 4 s = 2 trajectories/s
      assert.deepStrictEqual(data.train.series["throughput/trajectories_per_s"]?.[0], 2)
      assert.strictEqual(data.summary.trajectories, steps * 8)
      assert.strictEqual(data.summary.lastReward, 0.5)

      // episodes: 50 of 60 steps, evenly, first and last included; each with its 2 groups in cursor order
      const shown = data.episodes.steps.map((s) => s.step)
      assert.strictEqual(shown.length, 50)
      assert.strictEqual(shown[0], 1)
      assert.strictEqual(shown[49], 60)
      assert.include(data.episodes.note, "50 of 60 trained steps (sampled evenly)")
      const last = data.episodes.steps[49]!
      assert.deepStrictEqual(
        last.groups.map((g) => g.cursor),
        [118, 119]
      )
      const t = last.groups[0]!.trajectories[0]!
      assert.strictEqual(t.reward, 1)
      assert.strictEqual(t.turns.length, 2)
      assert.strictEqual(t.turns[0]!.toolCalls[0]!.result, SyntheticRun.toolResult)
      // the observation runs from the end of turn 1 to the start of turn 2, all mask 0
      assert.strictEqual(t.turns[0]!.observationEnd, t.turns[1]!.start)
      assert.match(t.response.mask.slice(t.turns[0]!.end, t.turns[0]!.observationEnd), /^0+$/)
      assert.match(t.response.mask.slice(t.turns[1]!.start, t.turns[1]!.end), /^1+$/)
      // decoded text: the byte tokens of ✓ (3 bytes) are joined on the first of them
      const text = t.response.text!
      assert.strictEqual(text.join(""), SyntheticRun.tokenizer.decode(t.response.ids))
      const check = text.indexOf("✓")
      assert.deepStrictEqual(text.slice(check, check + 3), ["✓", "", ""])
      rmSync(runDir, { recursive: true, force: true })
    }).pipe(Effect.provide(NodeServices.layer))
  )

  it.effect("keeps fewer steps under a token budget and shows ids when no tokenizer loads", () =>
    Effect.gen(function* () {
      const runDir = mkdtempSync(join(tmpdir(), "effect-rl-report-"))
      yield* SyntheticRun.write(runDir, 10)
      yield* Effect.promise(async () => {
        await fs.rm(join(runDir, "checkpoints"), { recursive: true })
        await fs.rm(join(runDir, "config.yaml"))
      })
      const out = join(runDir, "elsewhere.html")
      // one group = a 53-token prompt + 4 × 132 response tokens = 581 tokens per step (1 group kept per step):
      // 10 steps = 5,810 > 4,000 → 8 steps (4,648) > 4,000 → 6 steps (3,486), evenly at each cut, ends kept
      const written = yield* Report.write(runDir, { out, maxTotalTokens: 4000, maxGroupsPerStep: 1 })
      const data = embedded(readFileSync(out, "utf8"))
      assert.strictEqual(written.file, out)
      assert.deepStrictEqual(
        data.episodes.steps.map((s) => s.step),
        [1, 2, 5, 6, 9, 10]
      )
      for (const s of data.episodes.steps) assert.strictEqual(s.groups.length, 1)
      assert.include(data.episodes.note, "at most 1 groups per step")
      assert.include(data.episodes.note, "tokens are shown as ids")
      assert.isNull(data.episodes.steps[0]!.groups[0]!.prompt.text)
      rmSync(runDir, { recursive: true, force: true })
    }).pipe(Effect.provide(NodeServices.layer))
  )

  it.effect(
    "after a resume, shows what was trained: the later line of a re-recorded group and of a step's metrics",
    () =>
      Effect.gen(function* () {
        const runDir = mkdtempSync(join(tmpdir(), "effect-rl-report-"))
        yield* SyntheticRun.write(runDir, 4)
        // a resumed process re-records step 4's first group (now rewarded 0.25) and one group it never trains on
        yield* Effect.gen(function* () {
          const log = yield* EpisodeLog.make(runDir)
          const again = SyntheticRun.group(4, 0, 4)
          yield* log.append({ ...again, trajectories: again.trajectories.map((t) => ({ ...t, reward: 0.25 })) })
          yield* log.append({ ...SyntheticRun.group(51, 0, 4), cursor: 100 })
          const metrics = yield* Metrics.make(runDir, { progress: false })
          yield* metrics.record("train", 4, { "reward/avg_raw_reward": 0.9 })
        }).pipe(Effect.scoped)
        const data = yield* ReportData.collect(runDir)
        assert.strictEqual(data.train.series["reward/avg_raw_reward"]?.[3], 0.9)
        assert.strictEqual(data.summary.trajectories, 4 * 8) // not 40: duplicates and the untrained group left out
        const step4 = data.episodes.steps.find((s) => s.step === 4)!
        assert.deepStrictEqual(
          step4.groups.map((g) => g.trajectories.map((t) => t.reward)),
          [
            [0.25, 0.25, 0.25, 0.25],
            [1, 1, 0, 0]
          ]
        )
        assert.include(data.episodes.note, "2 recorded groups were never trained on or re-recorded")
        rmSync(runDir, { recursive: true, force: true })
      }).pipe(Effect.provide(NodeServices.layer))
  )

  it.effect("fails with ReportError naming a run directory that does not exist", () =>
    Effect.gen(function* () {
      const error = yield* Report.write("/nonexistent/run").pipe(Effect.flip)
      assert.strictEqual(error._tag, "ReportError")
      assert.strictEqual(error._tag === "ReportError" ? error.path : undefined, "/nonexistent/run")
    }).pipe(Effect.provide(NodeServices.layer))
  )
})

describe("Report without a run", () => {
  it.effect("fails naming a directory that has no metrics.jsonl, and refresh writes nothing there", () =>
    Effect.gen(function* () {
      const dir = mkdtempSync(join(tmpdir(), "effect-rl-report-empty-"))
      const error = yield* Report.write(dir).pipe(Effect.flip)
      assert.strictEqual(error._tag, "ReportError")
      assert.strictEqual(error._tag === "ReportError" ? error.path : undefined, dir)
      assert.include(error.message, "not a run directory: no metrics.jsonl")
      yield* Report.refresh(dir)
      assert.deepStrictEqual(yield* Effect.promise(() => fs.readdir(dir)), [])
      rmSync(dir, { recursive: true, force: true })
    }).pipe(Effect.provide(NodeServices.layer))
  )

  it.effect("refresh rewrites report.html atomically (no temporary file left) and only warns when it cannot", () =>
    Effect.gen(function* () {
      const runDir = mkdtempSync(join(tmpdir(), "effect-rl-report-refresh-"))
      yield* SyntheticRun.write(runDir, 4)
      yield* Report.refresh(runDir)
      const files = yield* Effect.promise(() => fs.readdir(runDir))
      assert.include(files, "report.html")
      assert.isEmpty(files.filter((f) => f.endsWith(".tmp")))
      assert.strictEqual(embedded(readFileSync(join(runDir, "report.html"), "utf8")).summary.steps, 4)
      // report.html a directory: cannot be written, and refresh still succeeds
      yield* Effect.promise(() => fs.rm(join(runDir, "report.html")))
      yield* Effect.promise(() => fs.mkdir(join(runDir, "report.html")))
      yield* Report.refresh(runDir)
      rmSync(runDir, { recursive: true, force: true })
    }).pipe(Effect.provide(NodeServices.layer))
  )
})

describe("Report.writeMany", () => {
  it.effect("overlays runs: one entry per run named by its directory, each with its own curves and summary", () =>
    Effect.gen(function* () {
      const root = mkdtempSync(join(tmpdir(), "effect-rl-report-compare-"))
      const a = join(root, "run-a")
      const b = join(root, "run-b")
      yield* SyntheticRun.write(a, 6)
      yield* SyntheticRun.write(b, 10)
      const out = join(root, "compare.html")
      const written = yield* Report.writeMany([a, b], { out })
      assert.strictEqual(written.runs, 2)
      const html = readFileSync(out, "utf8")
      assert.notMatch(html, /<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=/i)
      assert.include(html, 'id="smoothing"')
      const data = embedded(html) as unknown as ReportData.CompareData
      assert.deepStrictEqual(
        data.runs.map((r) => r.name),
        ["run-a", "run-b"]
      )
      assert.deepStrictEqual(
        data.runs.map((r) => r.train.steps.length),
        [6, 10]
      )
      assert.deepStrictEqual(
        data.runs.map((r) => r.summary.steps),
        [6, 10]
      )
      assert.include(html.slice(html.indexOf("<header>"), html.indexOf("</header>")), "run-b")

      // a directory without a run among them fails naming it
      const empty = join(root, "empty")
      yield* Effect.promise(() => fs.mkdir(empty))
      const error = yield* Report.writeMany([a, empty], { out }).pipe(Effect.flip)
      assert.strictEqual(error._tag === "ReportError" ? error.path : undefined, empty)
      rmSync(root, { recursive: true, force: true })
    }).pipe(Effect.provide(NodeServices.layer))
  )

  it("names runs by their directories, the paths as given where two share a name", () => {
    assert.deepStrictEqual(ReportData.runNames(["runs/a", "runs/b/"]), ["a", "b"])
    assert.deepStrictEqual(ReportData.runNames(["x/latest", "y/latest"]), ["x/latest", "y/latest"])
  })
})

describe("ReportData.evenly", () => {
  it("spreads k of n indices with the first and last included", () => {
    assert.deepStrictEqual(ReportData.evenly(10, 4), [0, 3, 6, 9])
    assert.deepStrictEqual(ReportData.evenly(3, 50), [0, 1, 2])
    assert.deepStrictEqual(ReportData.evenly(5, 1), [4])
  })
})

describe("Report.scriptJson", () => {
  it("leaves no character that could close the script element or start markup", () => {
    const json = Report.scriptJson({ text: "</script><!-- & \u2028" })
    assert.notMatch(json, /[<>&\u2028]/)
    assert.deepStrictEqual(JSON.parse(json), { text: "</script><!-- & \u2028" })
  })
})
