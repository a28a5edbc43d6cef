/**
 * The comparison page (`report RUN_A RUN_B ...`): the runs' summaries side by side and every chart of the run report
 * with each run overlaid in its own colour (a metric's several keys in one chart differ by dash), a legend naming the
 * run directories, and a smoothing slider (an exponential moving average, debiased as TensorBoard's, over each
 * series' recorded points). The page script builds the DOM with `textContent` only: run data never becomes markup.
 *
 * The page script publishes what it drew on `window.__report` (`runs`, `charts`: title, canvas size, points per
 * series, `smoothing`, `errors`), which the browser test reads.
 */
import * as MetricKeys from "../MetricKeys.ts"
import type { CompareData, CompareRun } from "../ReportData.ts"
import { chartHelpers, escapeHtml, num, palette, style } from "./ReportPage.ts"

const pair = (before: number | undefined, after: number | undefined) => `${num(before)} → ${num(after)}`

const summaryRow = (run: CompareRun, i: number): string => {
  const s = run.summary
  const all = (k: "avg_score" | "pass_at_n") => [s.evalBefore?.scores["all"]?.[k], s.evalAfter?.scores["all"]?.[k]]
  const [avgBefore, avgAfter] = all("avg_score")
  const [passBefore, passAfter] = all("pass_at_n")
  const cells = [
    num(s.steps),
    `${num(s.seconds, 1)} s`,
    pair(s.firstReward, s.lastReward),
    pair(avgBefore, avgAfter),
    pair(passBefore, passAfter)
  ]
  return `<tr class="run"><td><span class="swatch" style="background:${palette[i % palette.length]}"></span>${escapeHtml(
    run.name
  )}<div class="run-dir">${escapeHtml(run.runDir)}</div></td>${cells.map((c) => `<td>${escapeHtml(c)}</td>`).join("")}</tr>`
}

const compareStyle = `
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 6px; vertical-align: -1px; }
table.runs { border-collapse: collapse; background: var(--card); border: 1px solid var(--line); }
table.runs th, table.runs td { padding: 5px 14px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
table.runs th { color: var(--muted); font-weight: 500; font-size: 12px; }
#smoothing { width: 240px; }
`

/** The page script (runs in the browser; plain ES2020, no imports). */
const script = String.raw`
(function () {
  "use strict";
  var report = (window.__report = { runs: [], charts: [], errors: [], smoothing: 0, ready: false });
  window.addEventListener("error", function (e) { report.errors.push(String(e.message)); });
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var DASHES = [[], [6, 3], [2, 3], [8, 3, 2, 3]];
  var CHARTS = ${JSON.stringify(MetricKeys.charts)};
${chartHelpers}
  report.runs = data.runs.map(function (r, i) { return { name: r.name, colour: PALETTE[i % PALETTE.length] }; });

  // EMA over the recorded points (nulls stay null), debiased so the first points are not pulled towards 0
  function smooth(ys, weight) {
    if (weight <= 0) return ys.slice();
    var last = 0, n = 0;
    return ys.map(function (v) {
      if (v === null || v === undefined) return null;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return last / (1 - Math.pow(weight, n));
    });
  }

  function keysOf(spec, cols) {
    return spec.keys ? spec.keys.filter(function (k) { return cols.series[k]; })
      : Object.keys(cols.series).filter(function (k) { return new RegExp(spec.match).test(k); });
  }

  // one chart: every (key, run) as a series on the union of the runs' steps
  var charts = [];
  function drawChart(container, title, source, keys) {
    var card = el("div", "chart-card");
    card.appendChild(el("h3", null, title));
    var box = el("div", "chart");
    card.appendChild(box);
    container.appendChild(card);
    var stepSet = {};
    data.runs.forEach(function (r) { (source === "eval" ? r.eval : r.train).steps.forEach(function (s) { stepSet[s] = true; }); });
    var steps = Object.keys(stepSet).map(Number).sort(function (a, b) { return a - b; });
    var lines = [];
    keys.forEach(function (key, k) {
      data.runs.forEach(function (r, i) {
        var cols = source === "eval" ? r.eval : r.train;
        if (!cols.series[key]) return;
        var at = {};
        cols.steps.forEach(function (s, j) { at[s] = cols.series[key][j]; });
        var ys = steps.map(function (s) { return at[s] === undefined ? null : at[s]; });
        lines.push({ run: r.name, runIndex: i, key: key, keyIndex: k, raw: ys });
      });
    });
    var entry = {
      title: title,
      series: lines.map(function (l) { return { run: l.run, key: l.key, points: l.raw.filter(function (v) { return v !== null; }).length }; }),
      width: 0,
      height: 0
    };
    report.charts.push(entry);
    if (lines.length === 0 || steps.length === 0) {
      box.appendChild(el("div", "empty", "no data recorded"));
      return;
    }
    var opts = {
      width: Math.max(280, box.clientWidth || card.clientWidth - 20),
      height: 220,
      scales: { x: { time: false }, y: { range: yRange } },
      axes: [
        { label: "step", size: 36, labelSize: 14, incrs: STEP_INCRS, values: function (u, splits) { return splits.map(String); } },
        { size: axisSize, values: axisValues }
      ],
      cursor: { drag: { x: true, y: false } },
      series: [{ label: "step", value: function (u, v) { return v === null || v === undefined ? "–" : String(v); } }].concat(
        lines.map(function (l) {
          return {
            label: l.run + (keys.length > 1 ? " · " + label(l.key) : ""),
            stroke: PALETTE[l.runIndex % PALETTE.length],
            dash: DASHES[l.keyIndex % DASHES.length],
            width: 1.5,
            spanGaps: true,
            points: { show: steps.length <= 60, size: 4 },
            value: function (u, v) { return fmt(v); }
          };
        })
      )
    };
    var plot = new uPlot(opts, [steps].concat(lines.map(function (l) { return l.raw.slice(); })), box);
    var chart = { plot: plot, box: box, entry: entry, steps: steps, lines: lines };
    charts.push(chart);
    plotted(chart);
  }
  function plotted(chart) {
    chart.entry.plotted = chart.plot.data.slice(1).map(function (ys) { return ys.filter(function (v) { return v !== null && v !== undefined; }).length; });
  }

  var grid = document.getElementById("charts");
  CHARTS.forEach(function (spec) {
    var seen = {};
    var keys = [];
    data.runs.forEach(function (r) {
      keysOf(spec, spec.source === "eval" ? r.eval : r.train).forEach(function (k) { if (!seen[k]) { seen[k] = true; keys.push(k); } });
    });
    if (!spec.keys) keys.sort();
    if (spec.optional && keys.length === 0) return;
    drawChart(grid, spec.title, spec.source === "eval" ? "eval" : "train", keys);
  });

  // smoothing: redraw every chart's series through the EMA
  var slider = document.getElementById("smoothing");
  var shown = document.getElementById("smoothing-value");
  function setSmoothing(weight) {
    report.smoothing = weight;
    shown.textContent = weight.toFixed(2);
    charts.forEach(function (c) {
      c.plot.setData([c.steps].concat(c.lines.map(function (l) { return smooth(l.raw, weight); })));
      plotted(c);
    });
  }
  slider.addEventListener("input", function () { setSmoothing(Number(slider.value)); });
  report.setSmoothing = function (weight) { slider.value = String(weight); setSmoothing(Number(slider.value)); };
  report.values = function (title, index) {
    var c = charts.filter(function (c) { return c.entry.title === title; })[0];
    return c ? c.plot.data[index + 1].slice() : null;
  };

  window.addEventListener("resize", function () {
    charts.forEach(function (c) { c.plot.setSize({ width: Math.max(280, c.box.clientWidth), height: 220 }); });
  });
  requestAnimationFrame(function () {
    requestAnimationFrame(function () {
      charts.forEach(function (c) {
        var canvas = c.box.querySelector("canvas");
        var rect = canvas ? canvas.getBoundingClientRect() : { width: 0, height: 0 };
        c.entry.width = Math.round(rect.width);
        c.entry.height = Math.round(rect.height);
      });
      report.ready = true;
    });
  });
})();
`

export interface PageInput {
  readonly data: CompareData
  readonly dataJson: string // already safe inside <script>
  readonly chartScript: string
  readonly chartStyle: string
}

export const html = (input: PageInput): string => `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Run comparison · ${escapeHtml(input.data.runs.map((r) => r.name).join(", "))}</title>
<style>${input.chartStyle}</style>
<style>${style}${compareStyle}</style>
</head>
<body>
<main>
<header>
<h1>Run comparison</h1>
<div class="run-dir">generated ${escapeHtml(input.data.generatedAt)}</div>
<table class="runs" id="runs"><thead><tr><th>run</th><th>steps</th><th>wall time</th><th>train reward (first → last)</th><th>held-out avg_score (before → after)</th><th>held-out pass@n</th></tr></thead><tbody>
${input.data.runs.map(summaryRow).join("\n")}
</tbody></table>
</header>
<h2>Training curves</h2>
<div class="controls"><label for="smoothing">smoothing</label><input type="range" id="smoothing" min="0" max="0.99" step="0.01" value="0"><span id="smoothing-value">0.00</span><span class="muted">exponential moving average of each series' recorded points</span></div>
<div class="charts" id="charts"></div>
</main>
<script>${input.chartScript}</script>
<script type="application/json" id="report-data">${input.dataJson}</script>
<script>${script}</script>
</body>
</html>
`
