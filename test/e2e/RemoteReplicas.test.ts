/**
 * Several inference replicas and a failure: three `serve` processes (`node src/main.ts serve`, as users run them, in
 * for vLLM with `--enable-weight-reload`) behind one remote engine (`generator.engine.urls`, vLLM dialect); one is
 * killed with SIGKILL while `train` runs and started again on its port. Training completes; every prompt is trained
 * exactly once; the turns whose calls the dead replica could not answer are recorded as moved, with the replica and
 * the reason; the revived replica is let back in and ends on the run's last version.
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as net from "node:net"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { afterEach, assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as Cli from "../fixtures/Cli.ts"

const base = "data/quickstart/policy"
const steps = 12

/** A port free now (the OS's pick for port 0). */
const freePort = () =>
  new Promise<number>((resolve) => {
    const server = net.createServer()
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

// every process the test starts, killed after it even when it timed out (its own `finally` then never runs)
const children: Array<ChildProcess> = []
afterEach(() => {
  for (const child of children.splice(0)) child.kill("SIGKILL")
})

/** `serve` on `port`, resolved once it prints its listening line. */
const startServe = (port: number) =>
  Cli.serve(["--model", base, "--port", String(port), "--enable-weight-reload", "--max-batch", "8"]).then(
    ({ child }) => {
      children.push(child)
      return child
    }
  )

const readJsonl = async (file: string): Promise<Array<Record<string, unknown>>> =>
  (await fs.readFile(file, "utf8").catch(() => ""))
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Record<string, unknown>)

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describe("remote engine over three serve replicas", () => {
  it.live(
    "one killed with SIGKILL mid-run: training completes, each prompt once, its turns moved and recorded, it rejoins",
    () =>
      Effect.promise(async () => {
        const ports = [await freePort(), await freePort(), await freePort()]
        const urls = ports.map((p) => `http://127.0.0.1:${p}`)
        const servers: Array<ChildProcess> = await Promise.all(ports.map(startServe))
        const runDir = await fs.mkdtemp(path.join(tmpdir(), "effect-rl-replicas-"))
        try {
          const trainer = spawn(
            process.execPath,
            [
              "src/main.ts",
              "train",
              "--config",
              "configs/quickstart.yaml",
              "--run-dir",
              runDir,
              "generator.engine.kind=remote",
              `generator.engine.urls=[${urls.join(", ")}]`,
              "generator.engine.dialect=vllm",
              "generator.engine.request_timeout_seconds=30",
              "pipeline.weight_sync=http",
              "pipeline.mode=sync",
              "generator.n_samples_per_prompt=4",
              "generator.max_turns=3",
              "trainer.train_batch_size=3",
              "trainer.policy_mini_batch_size=3",
              "trainer.update_epochs_per_batch=1", // one optimizer step, one policy version, per training step
              "trainer.algorithm.advantage_estimator=grpo",
              "trainer.algorithm.zero_variance_filter=false",
              `trainer.max_steps=${steps}`,
              "trainer.eval_before_train=false",
              "trainer.eval_interval=0",
              "checkpoint.interval=0",
              "data.max_eval_prompts=1",
              "logging.report=false"
            ],
            { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, NO_COLOR: "1" } }
          )
          children.push(trainer)
          let stderr = ""
          trainer.stderr!.on("data", (chunk: Buffer) => {
            stderr += chunk.toString()
          })
          const exited = new Promise<number>((resolve) => trainer.on("close", (code) => resolve(code ?? -1)))

          // once step 1 is trained, kill the second replica while step 2's rollouts run, and start it again
          const metrics = path.join(runDir, "metrics.jsonl")
          while ((await readJsonl(metrics)).filter((m) => m["event"] === "train").length < 1) await sleep(100)
          servers[1]!.kill("SIGKILL")
          while (!stderr.includes(`replica ${urls[1]} taken out`)) await sleep(50)
          servers[1] = await startServe(ports[1]!)

          const code = await exited
          assert.strictEqual(code, 0, stderr.slice(-3000))

          const consumed = await readJsonl(path.join(runDir, "consumed.jsonl"))
          assert.strictEqual(consumed.length, steps * 3)
          assert.strictEqual(new Set(consumed.map((c) => c["uid"])).size, consumed.length, "each prompt trained once")

          const groups = (await readJsonl(path.join(runDir, "episodes.jsonl"))) as unknown as Array<TrajectoryGroup>
          const trajectories = groups.flatMap((g) => g.trajectories)
          assert.deepStrictEqual(
            trajectories.filter((t) => t.stopReason === "error").map((t) => t.error),
            [],
            "no trajectory lost"
          )
          const moved = trajectories.flatMap((t) => t.turns.flatMap((turn) => turn.retries ?? []))
          assert.isAbove(moved.length, 0, "the dead replica's calls went on elsewhere")
          for (const reason of moved) assert.include(reason, urls[1]!, "only the killed replica's calls moved")
          assert.match(moved[0]!, /failed: |out: /)

          // let back in, on the current version
          assert.include(stderr, `replica ${urls[1]} back in`)
          const train = (await readJsonl(metrics)).filter((m) => m["event"] === "train")
          const last = train[train.length - 1]!["trainer/policy_version"] as number
          assert.isAbove(last, 1, "the policy moved during the run")
          const info = (await fetch(`${urls[1]}/weight_info`).then((r) => r.json())) as { weight_version: string }
          assert.strictEqual(info.weight_version, String(last))
        } finally {
          for (const s of servers) s.kill("SIGKILL")
          await fs.rm(runDir, { recursive: true, force: true })
        }
      }),
    600_000
  )
})
