/**
 * ToolCallParser.parse on adversarial model turns: each shape at 256 KiB, 512 KiB and 1 MiB of (ASCII) text, `auto`
 * format. Linear work grows 4× from 256 KiB to 1 MiB (`growth`); quadratic work grows 16×. Shapes:
 * - `think`: `<think>` repeated, never closed (a lazy-regex strip rescanned to the end from each one),
 * - `unclosedToolCall`: one `<tool_call>{"name": …, "arguments": {"query": "` whose string runs to the end,
 * - `deepArrays`: `[[[[…`, `deepObjects`: `{"a":{"a":…`, both never closed,
 * - `qwenParameters`: a Qwen3-Coder body of `<parameter=` repeated, no key ever closed by `>`,
 * - `manyToolCalls`: complete small hermes calls, one after another (the normal case, scaled up),
 * - `plainText`: prose without markers (an answer).
 * Medians of `--iters` runs (default 9) after three warm-ups, wall and CPU milliseconds. Last stdout line: the JSON
 * result, also written to bench/out/parser.json (`--out FILE`: bench/results/FILE) with the date, the command and the
 * load average (the machine is shared: wall times move with the neighbours, growth ratios much less).
 *
 * Run: npm run bench -- parser [--iters N] [--out FILE]
 */
import * as os from "node:os"
import * as ToolCallParser from "../src/env/ToolCallParser.ts"
import { arg, writeResult } from "./args.ts"

const KiB = 1024
const sizes = [256 * KiB, 512 * KiB, 1024 * KiB]

/** `unit` repeated and cut to exactly `n` characters. */
const fill = (unit: string, n: number): string => unit.repeat(Math.ceil(n / unit.length)).slice(0, n)

/** Each shape at exactly `n` characters. */
const shapes: Record<string, (n: number) => string> = {
  think: (n) => fill("<think>", n),
  unclosedToolCall: (n) => {
    const head = '<tool_call>{"name": "search", "arguments": {"query": "'
    return head + fill("why is the sky blue ", n - head.length)
  },
  deepArrays: (n) => fill("[", n),
  deepObjects: (n) => fill('{"a":', n),
  qwenParameters: (n) => {
    const head = "<tool_call>\n<function=search>\n"
    return head + fill("<parameter=", n - head.length)
  },
  manyToolCalls: (n) => fill('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n', n),
  plainText: (n) => fill("The quick brown fox jumps over the lazy dog, then thinks about it. ", n)
}

const median = (xs: ReadonlyArray<number>): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

const round = (ms: number): number => Number(ms.toFixed(2))

/** Median wall and CPU milliseconds of `parse(text)`. */
const time = (text: string, iters: number): { wall: number; cpu: number } => {
  for (let i = 0; i < 3; i++) ToolCallParser.parse(text) // warm-up: the JIT's tiers and the heap's size settle
  const wall: Array<number> = []
  const cpu: Array<number> = []
  for (let i = 0; i < iters; i++) {
    const start = performance.now()
    const cpuStart = process.cpuUsage()
    ToolCallParser.parse(text)
    const used = process.cpuUsage(cpuStart)
    wall.push(performance.now() - start)
    cpu.push((used.user + used.system) / 1000)
  }
  return { wall: median(wall), cpu: median(cpu) }
}

export const run = async (): Promise<void> => {
  const iters = Number(arg("iters", "9"))
  const loadBefore = os.loadavg()
  const results: Record<string, { wallMs: Array<number>; cpuMs: Array<number>; growth: number }> = {}
  for (const [name, make] of Object.entries(shapes)) {
    const timings = sizes.map((n) => time(make(n), iters))
    const growth = timings.at(-1)!.cpu / timings[0]!.cpu // CPU time: the neighbours move it less than wall time
    results[name] = {
      wallMs: timings.map((t) => round(t.wall)),
      cpuMs: timings.map((t) => round(t.cpu)),
      growth: Number(growth.toFixed(2))
    }
    console.error(`${name}: ${JSON.stringify(results[name])}`)
  }
  const result = {
    bench: "parser",
    command: `npm run bench -- parser${process.argv.includes("--iters") ? ` --iters ${iters}` : ""}`,
    date: new Date().toISOString(),
    sizes: sizes.map((n) => `${n / KiB} KiB`),
    iters,
    note: "medians per parse, auto format; growth = CPU time at 1 MiB / at 256 KiB (linear ≈ 4, quadratic ≈ 16)",
    shapes: results,
    cpu: os.cpus()[0]?.model ?? "unknown",
    cores: os.availableParallelism(),
    loadAvg: { before: loadBefore.map((l) => round(l)), after: os.loadavg().map((l) => round(l)) }, // 1, 5, 15 min
    node: process.version
  }
  writeResult("parser.json", result)
  console.log(JSON.stringify(result))
}

if (import.meta.main) await run()
