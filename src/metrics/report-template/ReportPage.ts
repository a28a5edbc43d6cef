/**
 * The report's HTML page: a static header (the run's summary, rendered here with every value escaped), the inlined
 * charting library (uPlot), the run's data as JSON, and the page script that draws the charts and the trajectory
 * viewer from that JSON. The page script builds the DOM with `textContent` only: run data never becomes markup.
 *
 * The page script publishes what it drew on `window.__report` (`charts`: title, canvas size, points per series;
 * `errors`), which the browser test reads.
 */
import * as MetricKeys from "../MetricKeys.ts"
import type { Data, EvalScore } from "../ReportData.ts"

export const escapeHtml = (s: string): string =>
  s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&#39;")

export const num = (x: number | undefined, digits = 3): string =>
  x === undefined || !Number.isFinite(x) ? "–" : Number.isInteger(x) ? String(x) : x.toFixed(digits)

const duration = (seconds: number): string => {
  const s = Math.round(seconds)
  const h = Math.floor(s / 3600)
  const m = Math.floor((s % 3600) / 60)
  return h > 0 ? `${h}h ${String(m).padStart(2, "0")}m` : `${m}m ${String(s % 60).padStart(2, "0")}s`
}

const arrow = (before: number | undefined, after: number | undefined): string => {
  const cls = before === undefined || after === undefined || after === before ? "same" : after > before ? "up" : "down"
  return `${escapeHtml(num(before))} <span class="arrow ${cls}">→</span> ${escapeHtml(num(after))}`
}

const card = (label: string, valueHtml: string, sub = "") =>
  `<div class="card"><div class="label">${escapeHtml(label)}</div><div class="value">${valueHtml}</div>${
    sub === "" ? "" : `<div class="sub">${escapeHtml(sub)}</div>`
  }</div>`

const evalTable = (before: EvalScore | undefined, after: EvalScore | undefined): string => {
  if (before === undefined) return `<p class="muted">No held-out evaluation in this run.</p>`
  const sources = [...new Set([...Object.keys(before.scores), ...Object.keys(after?.scores ?? {})])].sort((a, b) =>
    a === "all" ? 1 : b === "all" ? -1 : a.localeCompare(b)
  )
  const rows = sources
    .map((source) => {
      const b = before.scores[source]
      const a = after?.scores[source]
      return `<tr><td>${escapeHtml(source)}</td><td>${arrow(b?.avg_score, a?.avg_score)}</td><td>${arrow(
        b?.pass_at_n,
        a?.pass_at_n
      )}</td></tr>`
    })
    .join("")
  const span = after === undefined ? `step ${before.step}` : `step ${before.step} → step ${after.step}`
  return `<table class="eval" id="eval-table"><thead><tr><th>held-out source</th><th>avg_score (${escapeHtml(
    span
  )})</th><th>pass@n</th></tr></thead><tbody>${rows}</tbody></table>`
}

const header = (data: Data): string => {
  const s = data.summary
  const all = (e: EvalScore | undefined, k: "avg_score" | "pass_at_n") => e?.scores["all"]?.[k]
  return `<header>
<h1>Run report</h1>
<div class="run-dir">${escapeHtml(data.runDir)}${s.mode === undefined ? "" : ` · ${escapeHtml(s.mode)} pipeline`} · generated ${escapeHtml(data.generatedAt)}</div>
<div class="cards" id="summary">
${card("steps", escapeHtml(num(s.steps)))}
${card("wall time", escapeHtml(duration(s.seconds)), `${num(s.seconds, 1)} s`)}
${card("trajectories trained", escapeHtml(num(s.trajectories)), `${num(s.generatedTokens)} sampled tokens`)}
${card("train reward", arrow(s.firstReward, s.lastReward), "first step → last step")}
${card("held-out avg_score", arrow(all(s.evalBefore, "avg_score"), all(s.evalAfter, "avg_score")), "before → after")}
${card("held-out pass@n", arrow(all(s.evalBefore, "pass_at_n"), all(s.evalAfter, "pass_at_n")), "before → after")}
</div>
${evalTable(s.evalBefore, s.evalAfter)}
</header>`
}

export const style = `
:root { --fg: #1d2330; --muted: #667085; --line: #e4e7ec; --bg: #f7f8fa; --card: #fff;
  --sampled-bg: #d3f2dc; --sampled-fg: #0b5d27; --ctx-bg: #eceef2; --ctx-fg: #4a5261; --accent: #3056d3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
main { max-width: 1400px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { margin: 0 0 2px; font-size: 22px; }
h2 { margin: 28px 0 10px; font-size: 18px; }
.run-dir { color: var(--muted); font-family: ui-monospace, Menlo, monospace; font-size: 12px; word-break: break-all; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; margin: 14px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .value { font-size: 18px; font-weight: 600; margin-top: 2px; white-space: nowrap; }
.card .sub { color: var(--muted); font-size: 12px; }
.arrow { font-weight: 700; padding: 0 2px; } .arrow.up { color: #138a3c; } .arrow.down { color: #c0362c; } .arrow.same { color: var(--muted); }
table.eval { border-collapse: collapse; background: var(--card); border: 1px solid var(--line); border-radius: 8px; }
table.eval th, table.eval td { padding: 5px 14px; border-bottom: 1px solid var(--line); text-align: left; }
table.eval th { color: var(--muted); font-weight: 500; font-size: 12px; }
.muted, .note { color: var(--muted); }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px; }
.chart-card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 8px 10px 4px; min-width: 0; }
.chart-card h3 { margin: 0 0 4px; font-size: 14px; font-weight: 600; }
.chart-card .chart { width: 100%; min-height: 40px; }
.chart-card .empty { color: var(--muted); font-size: 12px; padding: 12px 0; }
.uplot .u-legend { font-size: 11px; text-align: left; }
.uplot .u-legend .u-marker { width: 10px; height: 10px; }
.controls { display: flex; flex-wrap: wrap; align-items: center; gap: 10px 16px; margin: 8px 0 12px; }
.controls label { font-weight: 600; }
.controls select { font: inherit; padding: 3px 6px; max-width: 520px; }
.legend { display: flex; gap: 10px; align-items: center; font-size: 12px; color: var(--muted); }
.group-meta { color: var(--muted); margin-bottom: 8px; font-size: 13px; }
details.prompt, .trajectory { background: var(--card); border: 1px solid var(--line); border-radius: 8px; margin: 10px 0; }
details.prompt > summary, .trajectory > summary { cursor: pointer; padding: 8px 12px; font-weight: 600; }
details.prompt > .tokens { margin: 0 12px 12px; }
.trajectory > .body { padding: 0 12px 12px; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; margin-left: 6px; font-size: 12px; font-weight: 500; background: var(--ctx-bg); color: var(--ctx-fg); }
.badge.good { background: #d3f2dc; color: #0b5d27; } .badge.bad { background: #fde2e0; color: #9b231a; }
.turn { border-left: 3px solid var(--accent); margin: 10px 0 0; padding: 2px 0 2px 10px; }
.turn-head { font-size: 12px; color: var(--muted); margin-bottom: 4px; }
.turn-head b { color: var(--fg); }
.tokens { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; white-space: pre-wrap; word-break: break-word; line-height: 1.7; }
.tok { border-radius: 2px; padding: 1px 0; }
.tok.m1 { background: var(--sampled-bg); color: var(--sampled-fg); }
.tok.m0 { background: var(--ctx-bg); color: var(--ctx-fg); }
.tok.sp { font-weight: 700; outline: 1px dotted currentColor; }
.tok.id { margin-right: 3px; }
.tok:hover { outline: 1px solid #333; }
.segment-label { font-size: 11px; color: var(--muted); margin: 6px 0 2px; }
.omitted { color: #9b231a; font-size: 11px; }
table.tools { border-collapse: collapse; width: 100%; margin: 6px 0; font-size: 12px; }
table.tools th, table.tools td { border: 1px solid var(--line); padding: 3px 6px; vertical-align: top; text-align: left; }
table.tools th { background: var(--bg); font-weight: 500; color: var(--muted); }
table.tools pre { margin: 0; white-space: pre-wrap; word-break: break-word; font-size: 11px; max-height: 240px; overflow: auto; }
tr.tool-error td { background: #fff4f3; }
.parse-error { color: #9b231a; font-size: 12px; margin: 4px 0; }
details.config pre { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px; overflow: auto; font-size: 12px; }
`

/** One colour per series (a run, or a metric's keys), in order. */
export const palette = [
  "#3056d3",
  "#e4572e",
  "#17a05d",
  "#a239ca",
  "#f0a202",
  "#0fa3b1",
  "#d7263d",
  "#6c757d",
  "#8f5e15",
  "#2e294e"
]

/** The page scripts' DOM and number helpers, the charts' axes and ranges: shared with the comparison page (ES2020). */
export const chartHelpers = String.raw`
  var PALETTE = ${JSON.stringify(palette)};
  // DOM by textContent only: run data never becomes markup
  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    if (Number.isInteger(x)) return String(x);
    var d = digits === undefined ? 3 : digits;
    return Math.abs(x) >= 1e4 || (Math.abs(x) < 1e-3 && x !== 0) ? x.toExponential(2) : x.toFixed(d);
  }
  // a metric's name without its family prefix, for legends
  function label(key) { return key.replace(/^eval\//, "").replace(/^(reward|generate|policy|loss|timing|async|throughput)\//, ""); }
  // steps are integers: no ticks between them
  var STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];
  // a flat series gets a small band around its value (uPlot's default for 0 is 0..100)
  function yRange(u, min, max) {
    if (min === null || max === null) return [0, 1];
    if (min === max) { var pad = Math.abs(min) * 0.1 || 1; return [min - pad, max + pad]; }
    var span = max - min;
    return [min - span * 0.08, max + span * 0.08];
  }
  // tick labels with as many decimals as the spacing between ticks has (0.25 → 2, 0.0005 → 4)
  function axisValues(u, splits) {
    var step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 1;
    var written = String(parseFloat(step.toPrecision(6)));
    var decimals = written.indexOf("e-") >= 0 ? Number(written.split("e-")[1]) : written.indexOf(".") >= 0 ? written.length - written.indexOf(".") - 1 : 0;
    return splits.map(function (v) {
      var a = Math.abs(v);
      return a !== 0 && (a >= 1e6 || a < 1e-4) ? v.toExponential(1) : v.toFixed(Math.min(decimals, 8));
    });
  }
  // the y axis is as wide as its longest label
  function axisSize(u, values) {
    var longest = (values || []).reduce(function (n, v) { return Math.max(n, String(v).length); }, 3);
    return 24 + longest * 7;
  }

`

/** The page script (runs in the browser; plain ES2020, no imports). */
const script = String.raw`
(function () {
  "use strict";
  var report = (window.__report = { charts: [], errors: [], ready: false });
  window.addEventListener("error", function (e) { report.errors.push(String(e.message)); });
  var data = JSON.parse(document.getElementById("report-data").textContent);
${chartHelpers}

  // ---------------------------------------------------------------- charts
  // the chart table of MetricKeys (src/metrics/MetricKeys.ts): titles and the metric names each draws
  var CHARTS = ${JSON.stringify(MetricKeys.charts)};

  function seriesFor(spec) {
    var cols = spec.source === "eval" ? data.eval : data.train;
    var keys = spec.keys ? spec.keys.filter(function (k) { return cols.series[k]; })
      : Object.keys(cols.series).filter(function (k) { return new RegExp(spec.match).test(k); }).sort();
    return { cols: cols, keys: keys };
  }

  function drawChart(container, title, cols, keys) {
    var card = el("div", "chart-card");
    card.appendChild(el("h3", null, title));
    var box = el("div", "chart");
    card.appendChild(box);
    container.appendChild(card);
    var points = keys.map(function (k) { return cols.series[k].filter(function (v) { return v !== null; }).length; });
    var entry = { title: title, series: keys.map(function (k, i) { return { key: k, points: points[i] }; }), width: 0, height: 0 };
    report.charts.push(entry);
    if (keys.length === 0 || cols.steps.length === 0) {
      box.appendChild(el("div", "empty", "no data recorded"));
      return null;
    }
    var width = Math.max(280, box.clientWidth || card.clientWidth - 20);
    var opts = {
      width: width,
      height: 200,
      scales: { x: { time: false }, y: { range: yRange } },
      axes: [
        { label: "step", size: 36, labelSize: 14, incrs: STEP_INCRS, values: function (u, splits) { return splits.map(String); } },
        { size: axisSize, values: axisValues }
      ],
      cursor: { drag: { x: true, y: false } },
      series: [{ label: "step", value: function (u, v) { return v === null || v === undefined ? "–" : String(v); } }].concat(
        keys.map(function (k, i) {
          return {
            label: label(k),
            stroke: PALETTE[i % PALETTE.length],
            width: 1.5,
            spanGaps: true,
            points: { show: cols.steps.length <= 60, size: 5 },
            value: function (u, v) { return fmt(v); }
          };
        })
      )
    };
    var plot = new uPlot(opts, [cols.steps.slice()].concat(keys.map(function (k) { return cols.series[k].slice(); })), box);
    entry.plotted = plot.data.slice(1).map(function (ys) { return ys.filter(function (v) { return v !== null && v !== undefined; }).length; });
    charts.push({ plot: plot, box: box, entry: entry });
    return plot;
  }

  var charts = [];
  var grid = document.getElementById("charts");
  CHARTS.forEach(function (spec) {
    var s = seriesFor(spec);
    if (spec.optional && s.keys.length === 0) return;
    drawChart(grid, spec.title, s.cols, s.keys);
  });

  // any metric, picked from a list
  var explorer = document.getElementById("explorer");
  var select = document.getElementById("metric-select");
  var allKeys = Object.keys(data.train.series).map(function (k) { return "train:" + k; })
    .concat(Object.keys(data.eval.series).map(function (k) { return "eval:" + k; }));
  allKeys.forEach(function (k) { var o = el("option", null, k.replace(/^train:/, "")); o.value = k; select.appendChild(o); });
  var explorerPlot = null;
  function drawExplorer() {
    if (explorerPlot) { explorerPlot.destroy(); explorerPlot = null; }
    explorer.textContent = "";
    var value = select.value;
    if (!value) return;
    var source = value.slice(0, value.indexOf(":"));
    var key = value.slice(value.indexOf(":") + 1);
    var cols = source === "eval" ? data.eval : data.train;
    report.charts = report.charts.filter(function (c) { return c.title.indexOf("Metric: ") !== 0; });
    explorerPlot = drawChart(explorer, "Metric: " + key, cols, [key]);
  }
  select.addEventListener("change", drawExplorer);
  if (allKeys.length > 0) { select.value = allKeys[0]; drawExplorer(); }

  window.addEventListener("resize", function () {
    charts.forEach(function (c) { if (c.box.isConnected) c.plot.setSize({ width: Math.max(280, c.box.clientWidth), height: 200 }); });
  });

  // ---------------------------------------------------------------- trajectory viewer
  var steps = data.episodes.steps;
  var stepSelect = document.getElementById("step-select");
  var groupSelect = document.getElementById("group-select");
  var view = document.getElementById("trajectories");
  var meta = document.getElementById("group-meta");
  var promptBox = document.getElementById("prompt");

  function tokenSpans(target, tokens, from, to) {
    var end = Math.min(to, tokens.ids.length);
    var special = {};
    tokens.special.forEach(function (i) { special[i] = true; });
    for (var i = from; i < end; i++) {
      var text = tokens.text ? tokens.text[i] : null;
      if (text === "") continue; // the rest of a multi-byte character shown on an earlier token
      var m = tokens.mask.charAt(i);
      var span = el("span", "tok m" + m + (special[i] ? " sp" : "") + (text === null ? " id" : ""), text === null ? tokens.ids[i] : text);
      var tip = "id " + tokens.ids[i] + (m === "1" ? " · sampled" : " · not trained");
      if (tokens.logprobs && m === "1") tip += " · logp " + tokens.logprobs[i];
      span.title = tip;
      target.appendChild(span);
    }
    if (to > tokens.ids.length && tokens.omitted > 0) target.appendChild(el("span", "omitted", " … " + tokens.omitted + " more tokens not embedded"));
  }

  function segment(parent, labelText, tokens, from, to) {
    if (to <= from) return;
    parent.appendChild(el("div", "segment-label", labelText + " · " + (to - from) + " tokens"));
    var box = el("div", "tokens");
    tokenSpans(box, tokens, from, to);
    parent.appendChild(box);
  }

  function compactJson(value) {
    var flat = JSON.stringify(value);
    return flat !== undefined && flat.length > 80 ? JSON.stringify(value, null, 1) : String(flat);
  }

  function toolTable(calls) {
    var table = el("table", "tools");
    var head = el("tr");
    ["tool", "arguments", "result", "ms"].forEach(function (h) { head.appendChild(el("th", null, h)); });
    table.appendChild(head);
    calls.forEach(function (c) {
      var row = el("tr", c.isError ? "tool-error tool-call" : "tool-call");
      row.appendChild(el("td", null, (c.server ? c.server + "/" : "") + c.tool + (c.isError ? " (error)" : "")));
      var args = el("td"); args.appendChild(el("pre", null, typeof c.arguments === "string" ? c.arguments : compactJson(c.arguments)));
      var result = el("td"); result.appendChild(el("pre", null, c.result));
      row.appendChild(args); row.appendChild(result); row.appendChild(el("td", null, fmt(c.ms, 0)));
      table.appendChild(row);
    });
    return table;
  }

  function renderTrajectory(t, open) {
    var box = el("details", "trajectory");
    box.open = open;
    box.dataset.sample = String(t.sample);
    var summary = el("summary", null, "sample " + t.sample);
    var reward = el("span", "badge " + (t.reward > 0 ? "good" : "bad"), "reward " + fmt(t.reward));
    summary.appendChild(reward);
    summary.appendChild(el("span", "badge stop-reason", "stop: " + t.stopReason));
    summary.appendChild(el("span", "badge", t.turns.length + (t.turns.length === 1 ? " turn" : " turns")));
    summary.appendChild(el("span", "badge", t.response.ids.length + t.response.omitted + " response tokens"));
    if (t.error) summary.appendChild(el("span", "badge bad", "error"));
    box.appendChild(summary);
    var body = el("div", "body");
    if (t.error) body.appendChild(el("div", "parse-error", "error: " + t.error));
    var first = t.turns.length > 0 ? t.turns[0].start : t.response.ids.length + t.response.omitted;
    segment(body, "before the first turn (template, not trained)", t.response, 0, first);
    var last = first;
    t.turns.forEach(function (turn, k) {
      var div = el("div", "turn");
      var head = el("div", "turn-head");
      head.appendChild(el("b", null, "turn " + (k + 1)));
      head.appendChild(document.createTextNode(
        " · reward " + fmt(turn.reward) + " · finish " + turn.finishReason +
        " · policy v" + turn.policyVersions[0] + (turn.policyVersions[1] !== turn.policyVersions[0] ? "→v" + turn.policyVersions[1] : "") +
        " · llm " + fmt(turn.llmMs, 0) + " ms · env " + fmt(turn.envMs, 0) + " ms" +
        (turn.toolCalls.length ? " · " + turn.toolCalls.length + " tool call" + (turn.toolCalls.length > 1 ? "s" : "") : "")));
      div.appendChild(head);
      segment(div, "sampled by the policy", t.response, turn.start, turn.end);
      if (turn.parseError) div.appendChild(el("div", "parse-error", "tool call not parsed: " + turn.parseError));
      if (turn.toolCalls.length) div.appendChild(toolTable(turn.toolCalls));
      segment(div, "template + tool output (not trained)", t.response, turn.end, turn.observationEnd);
      body.appendChild(div);
      last = Math.max(last, turn.observationEnd, turn.end);
    });
    segment(body, "after the last turn", t.response, last, t.response.ids.length + t.response.omitted);
    var env = Object.keys(t.envMetrics);
    if (env.length) body.appendChild(el("div", "segment-label", "env metrics: " + env.map(function (k) { return k + "=" + fmt(t.envMetrics[k]); }).join(", ")));
    box.appendChild(body);
    return box;
  }

  function renderGroup() {
    view.textContent = "";
    meta.textContent = "";
    promptBox.textContent = "";
    var step = steps[Number(stepSelect.value)];
    if (!step) return;
    var g = step.groups[Number(groupSelect.value)];
    if (!g) return;
    var rewards = g.trajectories.map(function (t) { return fmt(t.reward); }).join(", ");
    meta.textContent = "prompt " + g.uid + " · dataset cursor " + g.cursor + " · source " + g.dataSource + " · env " + g.envClass +
      " · trained in step " + step.step + " · rewards [" + rewards + "]";
    var summary = el("summary", null, "Prompt (" + (g.prompt.ids.length + g.prompt.omitted) + " tokens, not trained)");
    promptBox.appendChild(summary);
    var tokens = el("div", "tokens");
    promptBox.appendChild(tokens);
    var filled = false;
    function fill() { if (!filled && promptBox.open) { filled = true; tokenSpans(tokens, g.prompt, 0, g.prompt.ids.length + g.prompt.omitted); } }
    promptBox.ontoggle = fill;
    fill();
    g.trajectories.forEach(function (t, i) { view.appendChild(renderTrajectory(t, i < 2)); });
  }

  function fillGroups() {
    groupSelect.textContent = "";
    var step = steps[Number(stepSelect.value)];
    (step ? step.groups : []).forEach(function (g, i) {
      var best = Math.max.apply(null, g.trajectories.map(function (t) { return t.reward; }));
      var o = el("option", null, "#" + g.cursor + " " + g.uid + " · best reward " + fmt(best));
      o.value = String(i);
      groupSelect.appendChild(o);
    });
    renderGroup();
  }

  steps.forEach(function (s, i) {
    var o = el("option", null, "step " + s.step + " (" + s.groups.length + " group" + (s.groups.length === 1 ? "" : "s") + ")");
    o.value = String(i);
    stepSelect.appendChild(o);
  });
  stepSelect.addEventListener("change", fillGroups);
  groupSelect.addEventListener("change", renderGroup);
  if (steps.length === 0) view.appendChild(el("p", "muted", "No recorded episodes in this run."));
  fillGroups();

  document.getElementById("config-text").textContent = data.config || "(no config.yaml)";
  // uPlot lays its canvas out after construction: measure once the page has painted
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
  readonly data: Data
  readonly dataJson: string // already safe inside <script>
  readonly chartScript: string
  readonly chartStyle: string
}

export const html = (input: PageInput): string => `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Run report · ${escapeHtml(input.data.runDir)}</title>
<style>${input.chartStyle}</style>
<style>${style}</style>
</head>
<body>
<main>
${header(input.data)}
<h2>Training curves</h2>
<div class="charts" id="charts"></div>
<h2>Any metric</h2>
<div class="controls"><label for="metric-select">metric</label><select id="metric-select"></select></div>
<div class="charts" id="explorer"></div>
<h2>Trajectories</h2>
<p class="note" id="episodes-note">${escapeHtml(input.data.episodes.note)}</p>
<div class="controls">
<label for="step-select">step</label><select id="step-select"></select>
<label for="group-select">group</label><select id="group-select"></select>
<span class="legend"><span class="tok m1">sampled (loss mask 1)</span><span class="tok m0">prompt / template / tool output (mask 0)</span><span class="tok m0 sp">special token</span> · hover a token for its id and log-prob</span>
</div>
<div class="group-meta" id="group-meta"></div>
<details class="prompt" id="prompt"></details>
<div id="trajectories"></div>
<h2>Config</h2>
<details class="config"><summary>config.yaml</summary><pre id="config-text"></pre></details>
</main>
<script>${input.chartScript}</script>
<script type="application/json" id="report-data">${input.dataJson}</script>
<script>${script}</script>
</body>
</html>
`
