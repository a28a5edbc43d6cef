/**
 * `logging.backends: [jsonl, prometheus]`: Debian's Prometheus server (/usr/bin/prometheus, installed by
 * scripts/setup-system.sh) scrapes a real training run's /metrics endpoint every second, and a training metric is read
 * back through Prometheus' HTTP API, equal to what the run wrote to metrics.jsonl at the step Prometheus saw last.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"

const binary = "/usr/bin/prometheus"
const available = existsSync(binary)
if (!available) console.warn(`skipping the Prometheus test: ${binary} is absent (scripts/setup-system.sh installs it)`)

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = createServer()
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
  })

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const exited = (child: ChildProcess) =>
  new Promise<number | null>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve(child.exitCode)
    else child.on("exit", (code) => resolve(code))
  })

interface Sample {
  readonly metric: Record<string, string>
  readonly value: [number, string]
}

/** An instant query through Prometheus' HTTP API. */
const query = async (base: string, promql: string): Promise<ReadonlyArray<Sample>> => {
  const response = await fetch(`${base}/api/v1/query?query=${encodeURIComponent(promql)}`)
  const body = (await response.json()) as { status: string; data: { result: Array<Sample> } }
  assert.strictEqual(body.status, "success", JSON.stringify(body))
  return body.data.result
}

describe.skipIf(!available)("logging.backends prometheus (needs /usr/bin/prometheus)", () => {
  it("a real Prometheus scrapes the run's /metrics and answers a training metric's latest value", async () => {
    const dir = mkdtempSync(join(tmpdir(), "effect-rl-prometheus-"))
    const [promPort, metricsPort] = [await freePort(), await freePort()]
    writeFileSync(
      join(dir, "prometheus.yml"),
      [
        "global:",
        "  scrape_interval: 1s",
        "scrape_configs:",
        "  - job_name: effect-rl",
        "    static_configs:",
        `      - targets: ["127.0.0.1:${metricsPort}"]`,
        ""
      ].join("\n")
    )
    const prometheus = spawn(
      binary,
      [
        `--config.file=${join(dir, "prometheus.yml")}`,
        `--storage.tsdb.path=${join(dir, "data")}`,
        `--web.listen-address=127.0.0.1:${promPort}`
      ],
      { cwd: dir, stdio: ["ignore", "ignore", "pipe"] }
    )
    let promLog = ""
    prometheus.stderr!.on("data", (c) => {
      promLog += String(c)
    })
    const base = `http://127.0.0.1:${promPort}`
    try {
      for (let i = 0; ; i++) {
        const ready = await fetch(`${base}/-/ready`).then(
          (r) => r.ok,
          () => false
        )
        if (ready) break
        assert.isBelow(i, 100, `prometheus did not get ready:\n${promLog.slice(-2000)}`)
        await sleep(100)
      }
      // Prometheus hands discovered targets to its scrape loop at most every 5 s: wait until it scrapes ours (down, as
      // nothing listens yet), so the short run below is scraped from its start
      for (let i = 0; ; i++) {
        const targets = (await fetch(`${base}/api/v1/targets`).then((r) => r.json())) as {
          data: { activeTargets: Array<{ health: string }> }
        }
        if (targets.data.activeTargets.some((t) => t.health !== "unknown")) break
        assert.isBelow(i, 300, `prometheus never scraped the target:\n${promLog.slice(-2000)}`)
        await sleep(100)
      }

      const runDir = join(dir, "run")
      const train = spawn(
        process.execPath,
        [
          "src/main.ts",
          "train",
          "--config",
          "configs/tiny.yaml",
          "--run-dir",
          runDir,
          "trainer.max_steps=4",
          "trainer.eval_before_train=false",
          "data.max_eval_prompts=1",
          "logging.progress=false",
          "logging.report=false",
          "logging.backends=[jsonl, prometheus]",
          `logging.prometheus.port=${metricsPort}`
        ],
        { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, NO_COLOR: "1" } }
      )
      let stderr = ""
      train.stderr!.on("data", (c) => {
        stderr += String(c)
      })
      const code = exited(train)
      assert.strictEqual(await code, 0, stderr.slice(-3000))
      // the last values Prometheus scraped while the run served them (its endpoint is gone now, so the series are
      // marked stale and an instant query of them answers nothing; last_over_time reads the samples before that)
      const last = (name: string) => query(base, `last_over_time(${name}{job="effect-rl"}[5m])`)
      const samples: Array<Sample> = [
        ...(await last("effect_rl_trainer_step")).map((s) => ({
          ...s,
          metric: { ...s.metric, __name__: "effect_rl_trainer_step" }
        })),
        ...(await last("effect_rl_reward_avg_raw_reward")).map((s) => ({
          ...s,
          metric: { ...s.metric, __name__: "effect_rl_reward_avg_raw_reward" }
        }))
      ]
      assert.include(stderr, `prometheus: serving metrics on http://127.0.0.1:${metricsPort}/metrics`)
      assert.strictEqual(samples.length, 2, `no sample of the run in Prometheus:\n${promLog.slice(-2000)}`)
      const value = (name: string) => Number(samples.find((s) => s.metric["__name__"] === name)!.value[1])
      assert.strictEqual(samples[0]!.metric["job"], "effect-rl")
      const step = value("effect_rl_trainer_step")
      const written = readFileSync(join(runDir, "metrics.jsonl"), "utf8")
        .split("\n")
        .filter((l) => l !== "")
        .map((l) => JSON.parse(l) as Record<string, number | string>)
        .filter((m) => m["event"] === "train")
      const atStep = written.find((m) => m["step"] === step)
      assert.isDefined(atStep, `step ${step} is not in metrics.jsonl`)
      assert.closeTo(value("effect_rl_reward_avg_raw_reward"), atStep!["reward/avg_raw_reward"] as number, 1e-9)
      // the run's endpoint is closed with the run
      const after = await fetch(`http://127.0.0.1:${metricsPort}/metrics`).then(
        () => "open",
        () => "closed"
      )
      assert.strictEqual(after, "closed")
    } finally {
      prometheus.kill("SIGTERM")
      await exited(prometheus)
    }
  }, 180_000)
})
