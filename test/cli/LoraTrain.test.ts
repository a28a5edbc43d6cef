/**
 * LoRA RL end to end (configs/tiny.yaml with adapters): checkpoints hold the PEFT adapter with its optimizer state,
 * resuming from a checkpoint continues bit-identically, `model export --merge` writes the merged model, and `eval
 * --model` scores the run's adapter over its base.
 */
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Cli from "../fixtures/Cli.ts"
import { readJsonl } from "../fixtures/Jsonl.ts"

const lora = [
  "model.lora.rank=4",
  "model.lora.alpha=8",
  "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
  "trainer.max_steps=3",
  "trainer.eval_before_train=false",
  "checkpoint.interval=1",
  "checkpoint.keep_n=5"
]

describe("train with LoRA (configs/tiny.yaml, end to end)", () => {
  it("checkpoints the adapter alone, resumes bit-identically, exports merged and evaluates over the base", () => {
    const runDir = mkdtempSync(join(tmpdir(), "effect-rl-lora-train-"))
    const first = Cli.run(["train", "--config", "configs/tiny.yaml", "--run-dir", runDir, ...lora], {
      timeoutMs: 600_000
    })
    assert.strictEqual(first.code, 0, first.stderr.slice(-3000))
    const step3 = join(runDir, "checkpoints", "step-3")
    assert.sameMembers(readdirSync(join(step3, "adapter")), ["adapter_config.json", "adapter_model.safetensors"])
    assert.isFalse(existsSync(join(step3, "model.safetensors")), "no copy of the base per checkpoint")
    const config = JSON.parse(readFileSync(join(step3, "adapter", "adapter_config.json"), "utf8"))
    assert.strictEqual(config.r, 4)
    assert.strictEqual(config.lora_alpha, 8)
    const optimizer = readFileSync(join(step3, "optimizer.safetensors"))
    const header = JSON.parse(optimizer.subarray(8, 8 + Number(optimizer.readBigUInt64LE(0))).toString("utf8"))
    const moments = Object.keys(header).filter((k) => k !== "__metadata__")
    assert.isTrue(moments.length > 0 && moments.every((k) => /lora_[AB]$/.test(k)), moments.join(", "))

    // a copy of the run stopped after step 2: resuming it trains step 3 to the same adapter, bit for bit
    const resumedDir = mkdtempSync(join(tmpdir(), "effect-rl-lora-resume-"))
    cpSync(runDir, resumedDir, { recursive: true })
    rmSync(join(resumedDir, "checkpoints", "step-3"), { recursive: true })
    writeFileSync(join(resumedDir, "checkpoints", "latest"), "step-2")
    const resumed = Cli.run(
      ["train", "--config", "configs/tiny.yaml", "--run-dir", resumedDir, "--resume", "latest", ...lora],
      { timeoutMs: 600_000 }
    )
    assert.strictEqual(resumed.code, 0, resumed.stderr.slice(-3000))
    assert.include(resumed.stderr, "resumed from")
    const adapterBytes = (dir: string) =>
      readFileSync(join(dir, "checkpoints", "step-3", "adapter", "adapter_model.safetensors"))
    assert.isTrue(adapterBytes(resumedDir).equals(adapterBytes(runDir)), "the resumed adapter differs")
    assert.isFalse(
      adapterBytes(runDir).equals(
        readFileSync(join(runDir, "checkpoints", "step-2", "adapter", "adapter_model.safetensors"))
      ),
      "step 3 changed the adapter"
    )
    const last = readJsonl(join(resumedDir, "metrics.jsonl"))
      .filter((m) => m["event"] === "train")
      .pop()!
    assert.strictEqual(last["step"], 3)
    assert.strictEqual(last["sync/bytes"], 0, "the local engine shares the trainer's adapter: nothing is copied")

    // model export --merge: the base (model.init, from the run's config.yaml) with the adapter folded in
    const out = join(runDir, "merged")
    const refused = Cli.run(["model", "export", "--model", runDir, "--out", out])
    assert.notStrictEqual(refused.code, 0)
    assert.include(refused.stderr, "--merge")
    const exported = Cli.run(["model", "export", "--model", runDir, "--out", out, "--merge"])
    assert.strictEqual(exported.code, 0, exported.stderr)
    for (const file of ["config.json", "model.safetensors", "tokenizer.json"])
      assert.isTrue(existsSync(join(out, file)))

    // eval --model RUN_DIR scores the adapter over the base; the merged export scores the same
    const evalArgs = ["eval", "--config", "configs/tiny.yaml", ...lora.slice(0, 3)]
    const overBase = Cli.run([...evalArgs, "--model", runDir], { timeoutMs: 300_000 })
    assert.strictEqual(overBase.code, 0, overBase.stderr.slice(-3000))
    const merged = Cli.run(["eval", "--config", "configs/tiny.yaml", "--model", out], { timeoutMs: 300_000 })
    assert.strictEqual(merged.code, 0, merged.stderr.slice(-3000))
    assert.deepStrictEqual(JSON.parse(overBase.lastLine).report.all, JSON.parse(merged.lastLine).report.all)
  }, 900_000)
})
