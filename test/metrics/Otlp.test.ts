/**
 * `logging.backends: [jsonl, otlp]`: a real training run (`train` through the CLI, the quickstart policy, which calls
 * tools) exports its spans over OTLP/HTTP (JSON bodies) to a receiver started here, and its groups carry their trace
 * in episodes.jsonl.
 */
import { spawn } from "node:child_process"
import { mkdtempSync, readFileSync } from "node:fs"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"

interface OtlpValue {
  readonly stringValue?: string
  readonly intValue?: number | string
  readonly boolValue?: boolean
  readonly doubleValue?: number
}
interface OtlpSpan {
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly name: string
  readonly attributes: ReadonlyArray<{ readonly key: string; readonly value: OtlpValue }>
  readonly links?: ReadonlyArray<{ readonly traceId: string; readonly spanId: string }>
}
interface Received {
  readonly path: string
  readonly contentType: string
  readonly body: Record<string, unknown>
}

/** An OTLP/HTTP receiver on 127.0.0.1 that keeps every request body (JSON encoding). */
const receiver = async () => {
  const received: Array<Received> = []
  const server = createServer((req, res) => {
    let body = ""
    req.on("data", (chunk) => {
      body += String(chunk)
    })
    req.on("end", () => {
      received.push({
        path: req.url ?? "",
        contentType: String(req.headers["content-type"]),
        body: JSON.parse(body) as Record<string, unknown>
      })
      res.setHeader("content-type", "application/json")
      res.end("{}")
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return { received, port: (server.address() as AddressInfo).port, close: () => server.close() }
}

/** `node src/main.ts train ...` without blocking this process (the receiver answers while it runs). */
const train = (args: ReadonlyArray<string>) =>
  new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = spawn(process.execPath, ["src/main.ts", "train", ...args], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, NO_COLOR: "1" }
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (c) => {
      stdout += String(c)
    })
    child.stderr.on("data", (c) => {
      stderr += String(c)
    })
    child.on("exit", (code) => resolve({ code, stdout, stderr }))
  })

const spansOf = (received: ReadonlyArray<Received>): Array<OtlpSpan> =>
  received
    .filter((r) => r.path === "/v1/traces")
    .flatMap((r) =>
      (r.body["resourceSpans"] as Array<{ scopeSpans: Array<{ spans: Array<OtlpSpan> }> }>).flatMap((rs) =>
        rs.scopeSpans.flatMap((ss) => ss.spans)
      )
    )

const attribute = (span: OtlpSpan, key: string) => {
  const v = span.attributes.find((a) => a.key === key)?.value
  return v?.stringValue ?? v?.doubleValue ?? (v?.intValue === undefined ? v?.boolValue : Number(v.intValue))
}

// the quickstart policy (it calls the toolbox's tools), two small synchronous steps, no evaluation before
const quickRun = (runDir: string, port: number, extra: ReadonlyArray<string> = []) => [
  "--config",
  "configs/quickstart.yaml",
  "--run-dir",
  runDir,
  "generator.engine.kind=local",
  "pipeline.weight_sync=inprocess",
  "pipeline.mode=sync",
  "generator.n_samples_per_prompt=2",
  "generator.max_turns=3",
  "trainer.train_batch_size=2",
  "trainer.policy_mini_batch_size=2",
  "trainer.update_epochs_per_batch=1",
  "trainer.max_steps=2",
  "trainer.eval_before_train=false",
  "trainer.eval_interval=0",
  "checkpoint.interval=0",
  "data.max_eval_prompts=1",
  "logging.report=false",
  "logging.progress=false",
  "logging.backends=[jsonl, otlp]",
  `logging.otlp.endpoint=http://127.0.0.1:${port}`,
  "logging.otlp.protocol=http/json",
  "logging.otlp.export_interval_seconds=1",
  ...extra
]

describe("logging.backends otlp", () => {
  it("exports spans whose parents follow run → step → group → turn → tool call (and step → weight sync); episodes.jsonl carries each group's trace", async () => {
    const otlp = await receiver()
    try {
      const runDir = mkdtempSync(join(tmpdir(), "effect-rl-otlp-"))
      const run = await train(quickRun(runDir, otlp.port))
      assert.strictEqual(run.code, 0, run.stderr.slice(-3000))
      assert.include(run.stderr, `otlp: exporting spans and metrics to http://127.0.0.1:${otlp.port}`)
      assert.isTrue(otlp.received.every((r) => r.contentType.startsWith("application/json")))

      const spans = spansOf(otlp.received)
      const byId = new Map(spans.map((s) => [s.spanId, s]))
      const named = (name: string) => spans.filter((s) => s.name === name)
      const parentOf = (s: OtlpSpan) => (s.parentSpanId === undefined ? undefined : byId.get(s.parentSpanId))
      // only the run's own spans are exported: no Effect.fn span, no HTTP client span of the exporter itself
      assert.sameMembers(
        [...new Set(spans.map((s) => s.name))],
        ["train.run", "train.step", "rollout.group", "agent.turn", "tool.call", "weight.sync", "train.eval"]
      )
      const [root] = named("train.run")
      assert.strictEqual(named("train.run").length, 1)
      assert.isUndefined(parentOf(root!))
      assert.isTrue(
        spans.every((s) => s.traceId === root!.traceId),
        "one trace for the run"
      )

      const steps = named("train.step")
      assert.deepStrictEqual(steps.map((s) => attribute(s, "train.step")).sort(), [1, 2])
      for (const s of steps) {
        assert.strictEqual(parentOf(s), root)
        // the step's metrics ride on its span
        assert.isNumber(attribute(s, "trainer/policy_version"))
        assert.isNumber(attribute(s, "timing/step"))
      }
      // 2 steps × 2 prompts, each group under the step that generated and trained it; the one held-out prompt's
      // group under the evaluation after training
      const groups = named("rollout.group").filter((g) => parentOf(g)?.name === "train.step")
      assert.strictEqual(groups.length, 4)
      const [evaluation] = named("train.eval")
      assert.strictEqual(parentOf(evaluation!), root)
      assert.deepStrictEqual(
        named("rollout.group")
          .filter((g) => !groups.includes(g))
          .map((g) => parentOf(g)),
        [evaluation]
      )
      for (const s of steps) assert.strictEqual(groups.filter((g) => parentOf(g) === s).length, 2)
      for (const w of named("weight.sync")) assert.strictEqual(parentOf(w)?.name, "train.step")
      assert.strictEqual(named("weight.sync").length, 2)
      // every turn under a group (2 samples per group, at least one turn each), every tool call under a turn
      const turns = named("agent.turn")
      assert.isAtLeast(turns.length, 8)
      for (const t of turns) assert.strictEqual(parentOf(t)?.name, "rollout.group")
      const calls = named("tool.call")
      assert.isAbove(calls.length, 0, "the quickstart policy calls tools")
      for (const c of calls) {
        assert.strictEqual(parentOf(c)?.name, "agent.turn")
        assert.isString(attribute(c, "tool.name"))
      }
      // the chain, end to end, from one tool call
      const chain: Array<string> = []
      for (let s: OtlpSpan | undefined = calls[0]; s !== undefined; s = parentOf(s)) chain.push(s.name)
      assert.deepStrictEqual(chain, ["tool.call", "agent.turn", "rollout.group", "train.step", "train.run"])

      // episodes.jsonl: each group's trace and span id, found among the exported groups
      const episodes = readFileSync(join(runDir, "episodes.jsonl"), "utf8")
        .split("\n")
        .filter((l) => l !== "")
        .map((l) => JSON.parse(l) as { promptUid: string; trace?: { traceId: string; spanId: string } })
      assert.strictEqual(episodes.length, 4)
      for (const e of episodes) {
        assert.strictEqual(e.trace?.traceId, root!.traceId)
        const span = byId.get(e.trace!.spanId)
        assert.strictEqual(span?.name, "rollout.group")
        assert.strictEqual(attribute(span!, "prompt.uid"), e.promptUid)
      }

      // the training metrics as OTLP gauges
      const metrics = otlp.received
        .filter((r) => r.path === "/v1/metrics")
        .flatMap((r) =>
          (r.body["resourceMetrics"] as Array<{ scopeMetrics: Array<{ metrics: Array<{ name: string }> }> }>).flatMap(
            (rm) => rm.scopeMetrics.flatMap((sm) => sm.metrics.map((m) => m.name))
          )
        )
      assert.includeMembers(metrics, ["reward/avg_raw_reward", "trainer/policy_version", "timing/step", "trainer/step"])
    } finally {
      otlp.close()
    }
  }, 120_000)

  it("async pipeline: a group is generated before its step, so it is a child of the run and its step links to it", async () => {
    const otlp = await receiver()
    try {
      const runDir = mkdtempSync(join(tmpdir(), "effect-rl-otlp-async-"))
      const run = await train([
        "--config",
        "configs/tiny-async.yaml",
        "--run-dir",
        runDir,
        "trainer.max_steps=2",
        "data.max_eval_prompts=1",
        "logging.report=false",
        "logging.progress=false",
        "logging.backends=[jsonl, otlp]",
        `logging.otlp.endpoint=http://127.0.0.1:${otlp.port}`,
        "logging.otlp.protocol=http/json",
        "logging.otlp.metrics=false"
      ])
      assert.strictEqual(run.code, 0, run.stderr.slice(-3000))
      assert.include(run.stderr, `otlp: exporting spans to http://127.0.0.1:${otlp.port}`)
      assert.isFalse(
        otlp.received.some((r) => r.path === "/v1/metrics"),
        "metrics: false sends no metrics"
      )
      const spans = spansOf(otlp.received)
      const byId = new Map(spans.map((s) => [s.spanId, s]))
      const [root] = spans.filter((s) => s.name === "train.run")
      const steps = spans.filter((s) => s.name === "train.step")
      assert.strictEqual(steps.length, 2)
      // the groups trained: those the steps link to, each exported as a child of the run, in episodes.jsonl by id
      const linked = steps.flatMap((s) => (s.links ?? []).map((l) => byId.get(l.spanId)))
      assert.strictEqual(linked.length, 4, "2 steps × 2 groups")
      for (const g of linked) {
        assert.strictEqual(g?.name, "rollout.group")
        assert.strictEqual(g!.parentSpanId, root!.spanId)
      }
      for (const s of steps) assert.strictEqual(s.parentSpanId, root!.spanId)
      const logged = new Set(
        readFileSync(join(runDir, "episodes.jsonl"), "utf8")
          .split("\n")
          .filter((l) => l !== "")
          .map((l) => (JSON.parse(l) as { trace?: { spanId: string } }).trace?.spanId)
      )
      for (const g of linked) assert.isTrue(logged.has(g!.spanId), `group ${g!.spanId} in episodes.jsonl`)
    } finally {
      otlp.close()
    }
  }, 120_000)
})
