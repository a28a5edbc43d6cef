/**
 * The native matrix products shape by shape, in GMAC/s, with the instruction set each addon was built for: decode
 * shapes (few rows: the register-tiled few-row products) of the perf model and Qwen3-0.6B, the tied LM head (B
 * transposed), and one training-size product (the BLAS path). A kernel that is fast on one CPU and 10x slower on
 * another shows here as a row, not as a whole step that got slower.
 *
 * Several addons in one run (`--addon FILE`, repeatable; default the built one): each is loaded in its own child
 * process, in turn, `--rounds` times alternated, so builds for different targets are compared on the same machine
 * under the same load. An addon for an AVX2-only CPU is built on any x86 machine with
 *   EFFECT_RL_MARCH=x86-64-v3 node native/install.mjs && cp native/build/Release/effect_rl_kernels.node /tmp/avx2.node
 *   node native/install.mjs     # the machine's own build back
 *   npm run bench -- kernels --addon /tmp/avx2.node --addon native/build/Release/effect_rl_kernels.node
 * (x86-64-v3 is AVX2 + FMA without AVX-512: its kernels, register tiles and spills are those of an AVX2 CPU; only
 * the clock and caches are this machine's).
 *
 * Last stdout line: {"bench":"kernels","cpuFlags",…,"addons":[{"addon","simd","blas","threads","shapes":[{"name","m",
 * "n","k","transposeB","weights","us","usPerRound","gmacPerSec"}]}]} (us: the median over rounds of each round's median
 * call; `weights` > 1: the calls cycle through that many B, as a decode step's layers do); also written to
 * bench/out/kernels.json (`--out FILE`: bench/results/FILE).
 *
 * Run: npm run bench -- kernels [--addon FILE ...] [--threads N] [--rounds N] [--out FILE]
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import { createRequire } from "node:module"
import * as os from "node:os"
import * as path from "node:path"
import type * as Abi from "../src/native/Abi.ts"
import * as Addon from "../src/native/Addon.ts"
import { arg, writeResult } from "./args.ts"

interface Shape {
  readonly name: string
  readonly m: number
  readonly n: number
  readonly k: number
  /** B stored [N, K] (a tied embedding as the LM head). */
  readonly transposeB: boolean
  /** How many distinct B of this shape the row cycles through (1: the same B, hot in cache, every call). */
  readonly weights: number
}

const shape = (name: string, m: number, k: number, n: number, transposeB = false, weights = 1): Shape => ({
  name,
  m,
  n,
  k,
  transposeB,
  weights
})

/** The perf model (bench/harness.ts: d 256, SwiGLU 1024, vocab 512) and Qwen3-0.6B (d 1024, 16 × 128 q, 8 × 128 kv). */
const shapes: ReadonlyArray<Shape> = [
  shape("perf q|k|v, batch 8", 8, 256, 768),
  shape("perf o, batch 8", 8, 256, 256),
  shape("perf gate|up, batch 8", 8, 256, 2048),
  shape("perf down, batch 8", 8, 1024, 256),
  shape("perf head (tied), batch 8", 8, 256, 512, true),
  shape("perf q|k|v, batch 4", 4, 256, 768),
  shape("perf q|k|v, batch 1", 1, 256, 768),
  shape("perf q|k|v, batch 16", 16, 256, 768),
  shape("0.6B q|k|v, batch 8", 8, 1024, 4096),
  shape("0.6B o, batch 8", 8, 2048, 1024),
  shape("0.6B gate|up, batch 8", 8, 1024, 6144),
  shape("0.6B down, batch 8", 8, 3072, 1024),
  shape("0.6B head (tied, 16K of the vocabulary), batch 8", 8, 1024, 16384, true),
  shape("perf training q|k|v, 512 tokens", 512, 256, 768),
  // a decode step reads every layer's weights once, so they are not in L2: the same product over 16 weights (12 MB)
  shape("perf q|k|v, batch 8, 16 weights in turn (not in L2)", 8, 256, 768, false, 16),
  shape("perf gate|up, batch 8, 8 weights in turn (not in L2)", 8, 256, 2048, false, 8)
]

/** One addon, in this process: each shape's median µs over repeats of at least 50 ms. */
const measure = (file: string, threads: number) => {
  const raw = createRequire(import.meta.url)(path.resolve(file)) as Abi.RawAddon
  const { kernels, status } = Addon.fromExports(raw, file)
  if (kernels === undefined) throw new Error(`${file}: ${status.available ? "" : status.reason}`)
  kernels.setThreads({ threads })
  const info = kernels.info({})
  const results = shapes.map((s) => {
    const a = Float32Array.from({ length: s.m * s.k }, (_, i) => ((i * 7919) % 1000) / 1000 - 0.5)
    const bs = Array.from({ length: s.weights }, (_, w) =>
      Float32Array.from({ length: s.k * s.n }, (_, i) => (((i + w) * 104729) % 1000) / 1000 - 0.5)
    )
    const out = new Float32Array(s.m * s.n)
    const at = (view: Float32Array) => kernels.addressOf({ view })
    let turn = 0
    const call = () =>
      kernels.matmul({
        heap: null,
        a: at(a),
        b: at(bs[turn++ % s.weights]!),
        out: at(out),
        batch: 1,
        aBatchStride: 0,
        bBatchStride: 0,
        m: s.m,
        n: s.n,
        k: s.k,
        transposeA: false,
        transposeB: s.transposeB,
        bias: -1,
        activation: 0,
        alpha: 0,
        aBatchIndex: null,
        bBatchIndex: null
      })
    call()
    let reps = 1
    for (;;) {
      const start = performance.now()
      for (let r = 0; r < reps; r++) call()
      if (performance.now() - start > 20) break
      reps *= 2
    }
    const samples: Array<number> = []
    for (let round = 0; round < 5; round++) {
      const start = performance.now()
      for (let r = 0; r < reps; r++) call()
      samples.push(((performance.now() - start) * 1000) / reps)
    }
    const us = samples.sort((x, y) => x - y)[2]!
    return { ...s, us: Number(us.toFixed(2)), gmacPerSec: Number(((s.m * s.n * s.k) / us / 1000).toFixed(2)) }
  })
  return { addon: file, simd: info.simd, blas: info.blas, threads: info.threads, shapes: results }
}

const cpuFlags = (): Array<string> => {
  try {
    const flags = /^flags\s*:\s*(.*)$/m.exec(fs.readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? ""
    return flags.split(" ").filter((f) => /^(avx|fma|sse4|amx)/.test(f))
  } catch {
    return []
  }
}

export const run = async (): Promise<void> => {
  const threads = Number(arg("threads", String(os.availableParallelism())))
  // a child measuring one addon prints its result and exits
  const child = arg("measure", "")
  if (child !== "") {
    console.log(JSON.stringify(measure(child, threads)))
    return
  }
  const addons: Array<string> = []
  process.argv.forEach(
    (a, i) => a === "--addon" && process.argv[i + 1] !== undefined && addons.push(process.argv[i + 1]!)
  )
  if (addons.length === 0) {
    const status = Addon.status()
    if (!status.available) throw new Error(`no native addon: ${status.reason}`)
    addons.push(status.path)
  }
  const rounds = Number(arg("rounds", "3"))
  const runs = addons.map(() => [] as Array<ReturnType<typeof measure>>)
  for (let round = 0; round < rounds; round++) {
    addons.forEach((file, i) => {
      const args = [process.argv[1]!, "kernels", "--measure", file, "--threads", String(threads)]
      const result = spawnSync(process.execPath, args, { encoding: "utf8", maxBuffer: 2 ** 24 })
      if (result.status !== 0) throw new Error(`${file}: ${result.stderr || `exit ${result.status}`}`)
      const measured = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as ReturnType<typeof measure>
      runs[i]!.push(measured)
      console.error(`round ${round + 1}: ${measured.simd} ${file}`)
    })
  }
  const summary = addons.map((file, i) => {
    const measured = runs[i]!
    const median = (values: Array<number>) => values.sort((x, y) => x - y)[Math.floor(values.length / 2)]!
    return {
      addon: file,
      simd: measured[0]!.simd,
      blas: measured[0]!.blas,
      threads: measured[0]!.threads,
      shapes: measured[0]!.shapes.map((s, j) => {
        const us = median(measured.map((r) => r.shapes[j]!.us))
        return {
          name: s.name,
          m: s.m,
          n: s.n,
          k: s.k,
          transposeB: s.transposeB,
          weights: s.weights,
          us,
          usPerRound: measured.map((r) => r.shapes[j]!.us),
          gmacPerSec: Number(((s.m * s.n * s.k) / us / 1000).toFixed(2))
        }
      })
    }
  })
  for (const a of summary) {
    console.error(`\n${a.simd} (${a.addon}), ${a.threads} threads`)
    for (const s of a.shapes)
      console.error(`  ${s.name.padEnd(52)} ${String(s.us).padStart(10)} µs ${s.gmacPerSec} GMAC/s`)
  }
  const result = {
    bench: "kernels",
    cpu: os.cpus()[0]?.model ?? "unknown",
    cpuFlags: cpuFlags(),
    cores: os.availableParallelism(),
    loadAvg: os.loadavg().map((x) => Number(x.toFixed(2))),
    command: ["node", path.relative(process.cwd(), process.argv[1] ?? ""), ...process.argv.slice(2)].join(" "),
    date: new Date().toISOString(),
    rounds,
    addons: summary
  }
  writeResult("kernels.json", result)
  console.log(JSON.stringify(result))
}
