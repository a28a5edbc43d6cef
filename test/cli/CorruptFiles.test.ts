/**
 * Corrupted run and data files, as a user meets them: the CLI exits non-zero with one stderr line naming the file
 * (and the row, line or key), and no stack trace. Each case corrupts its own copy of a run directory (written by the
 * real writers, without training: test/metrics/SyntheticRun.ts), of a checkpoint (data/quickstart/policy), or a
 * small data or config file.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { parquetWriteFile } from "hyparquet-writer"
import * as Cli from "../fixtures/Cli.ts"
import * as SyntheticRun from "../metrics/SyntheticRun.ts"

const root = fs.mkdtempSync(path.join(os.tmpdir(), "effect-rl-corrupt-"))
const base = path.join(root, "base")
const steps = 2 // metrics.jsonl: eval 0, train 1, train 2, eval 2; two groups per step in episodes and consumed

const train = (runDir: string, flags: ReadonlyArray<string> = [], overrides: ReadonlyArray<string> = []) => [
  "train",
  "--config",
  "configs/tiny.yaml",
  "--run-dir",
  runDir,
  ...flags,
  "trainer.max_steps=1",
  "data.max_prompts=2",
  "data.max_eval_prompts=1",
  ...overrides
]

// in the case's own directory: `run`, its copy of the run directory; `model`, its copy of a checkpoint
const run = (dir: string) => path.join(dir, "run")
const copyRun = (dir: string) => fs.cpSync(base, run(dir), { recursive: true })
const inRun = (name: string) => (dir: string) => path.join(run(dir), name)
const latestTokenizer = (dir: string) => path.join(run(dir), "checkpoints", `step-${steps}`, "tokenizer.json")
const model = (dir: string) => path.join(dir, "model")
const copyModel = (dir: string) => fs.cpSync("data/quickstart/policy", model(dir), { recursive: true })
const inModel = (name: string) => (dir: string) => path.join(model(dir), name)

const edit = (file: string, f: (text: string) => string) => fs.writeFileSync(file, f(fs.readFileSync(file, "utf8")))
/** Line 1 cut at 40 characters; the lines after it stay. */
const tearFirstLine = (file: string) => edit(file, (text) => text.replace(/^(.{40}).*$/m, "$1"))

const rows = fs.readFileSync("data/toolbox/train.jsonl", "utf8").split("\n").slice(0, 3)
/** Three dataset rows; row 2's prompt starts with a Latin-1 "é" (0xE9), not UTF-8. Returns its offset in the file. */
const writeLatin1Row = (file: string): number => {
  const [first, second, third] = rows.map((row) => Buffer.from(`${row}\n`))
  const at = second!.indexOf('"content":"') + '"content":"'.length
  const bad = Buffer.concat([second!.subarray(0, at), Buffer.from([0xe9]), second!.subarray(at)])
  fs.writeFileSync(file, Buffer.concat([first!, bad, third!]))
  return first!.length + at
}

const promptJson = (text: string) => JSON.stringify([{ role: "user", content: text }])

const yamlWithModelPath = (modelDir: string) =>
  fs
    .readFileSync("configs/tiny.yaml", "utf8")
    .replace(/model:\n {2}init:\n(?: {4}.*\n)+/, `model:\n  path: ${modelDir}\n`)
    .replace("tokenizer:\n  kind: byte", "tokenizer:\n  kind: hf")

interface Case {
  readonly name: string
  /** Writes the corrupted file into `dir` (the case's own directory); returns the CLI arguments. */
  readonly setup: (dir: string) => ReadonlyArray<string> | Promise<ReadonlyArray<string>>
  /** Texts that one stderr line holds together: the file, and the row, line or key. */
  readonly line: (dir: string) => ReadonlyArray<string>
  /** Texts stderr holds anywhere. */
  readonly also?: ReadonlyArray<string>
  /** A torn last line is what a crash mid-write leaves: skipped with a warning, the command succeeds. */
  readonly succeeds?: true
}

let latin1At = 0

const cases: ReadonlyArray<Case> = [
  {
    name: "report: metrics.jsonl torn in the middle",
    setup: (dir) => {
      copyRun(dir)
      tearFirstLine(inRun("metrics.jsonl")(dir))
      return ["report", run(dir)]
    },
    line: (dir) => [`${inRun("metrics.jsonl")(dir)}:1: not a metrics record`]
  },
  {
    name: "report: metrics.jsonl torn at its last line (a crash mid-write) is skipped with a warning",
    setup: (dir) => {
      copyRun(dir)
      edit(inRun("metrics.jsonl")(dir), (text) => text.trimEnd().slice(0, -20))
      return ["report", run(dir)]
    },
    line: (dir) => [`${inRun("metrics.jsonl")(dir)}:4: skipping torn last line`],
    succeeds: true
  },
  {
    name: "report: episodes.jsonl torn in the middle",
    setup: (dir) => {
      copyRun(dir)
      tearFirstLine(inRun("episodes.jsonl")(dir))
      return ["report", run(dir)]
    },
    line: (dir) => [`${inRun("episodes.jsonl")(dir)}:1: not a valid trajectory group`]
  },
  {
    name: "report: consumed.jsonl torn in the middle",
    setup: (dir) => {
      copyRun(dir)
      tearFirstLine(inRun("consumed.jsonl")(dir))
      return ["report", run(dir)]
    },
    line: (dir) => [`${inRun("consumed.jsonl")(dir)}:1: not a consumed-prompt line`]
  },
  {
    name: "report: config.yaml that is not YAML",
    setup: (dir) => {
      copyRun(dir)
      fs.writeFileSync(inRun("config.yaml")(dir), "trainer:\n  max_steps: [1\n")
      return ["report", run(dir)]
    },
    line: (dir) => [`${inRun("config.yaml")(dir)}: not valid YAML`]
  },
  {
    name: "report: the latest checkpoint's tokenizer.json that is not JSON",
    setup: (dir) => {
      copyRun(dir)
      fs.writeFileSync(latestTokenizer(dir), '{"version": "1.0", "mod')
      return ["report", run(dir)]
    },
    line: (dir) => [`${latestTokenizer(dir)}: cannot load the tokenizer`]
  },
  {
    name: "data inspect: a JSONL row with invalid UTF-8",
    setup: (dir) => {
      latin1At = writeLatin1Row(path.join(dir, "rows.jsonl"))
      return ["data", "inspect", path.join(dir, "rows.jsonl")]
    },
    line: (dir) => [`${path.join(dir, "rows.jsonl")}:2: not valid UTF-8 at byte ${latin1At} of the file`]
  },
  {
    name: "data inspect: a Parquet string with invalid UTF-8",
    setup: async (dir) => {
      const file = path.join(dir, "rows.parquet")
      const text = (s: string) => new TextEncoder().encode(promptJson(s))
      // `[{"role":"user","content":"caf` is 30 bytes: the Latin-1 "é" is byte 30 of the value
      const bad = Buffer.concat([
        Buffer.from('[{"role":"user","content":"caf'),
        Buffer.from([0xe9]),
        Buffer.from('"}]')
      ])
      await parquetWriteFile({
        filename: file,
        schema: [
          { name: "root", num_children: 3 },
          { name: "data_source", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
          { name: "env_class", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" },
          { name: "prompt", type: "BYTE_ARRAY", converted_type: "UTF8", repetition_type: "REQUIRED" }
        ],
        columnData: [
          { name: "data_source", data: ["a", "b", "c"] },
          { name: "env_class", data: ["mcp_tool", "mcp_tool", "mcp_tool"] },
          { name: "prompt", data: [text("x"), new Uint8Array(bad), text("y")] }
        ]
      })
      return ["data", "inspect", file]
    },
    line: (dir) => [`${path.join(dir, "rows.parquet")}:2: prompt: not valid UTF-8 at byte 30 of the value`]
  },
  {
    name: "data inspect: a truncated Parquet file",
    setup: async (dir) => {
      const file = path.join(dir, "rows.parquet")
      await parquetWriteFile({
        filename: file,
        columnData: [
          { name: "data_source", data: ["a", "b"], type: "STRING" },
          { name: "env_class", data: ["mcp_tool", "mcp_tool"], type: "STRING" },
          { name: "prompt", data: [promptJson("x"), promptJson("y")], type: "STRING" }
        ]
      })
      fs.truncateSync(file, Math.floor(fs.statSync(file).size / 2))
      return ["data", "inspect", file]
    },
    line: (dir) => [`${path.join(dir, "rows.parquet")}: not a Parquet file`]
  },
  {
    name: "data inspect: bad JSON in row 2",
    setup: (dir) => {
      fs.writeFileSync(path.join(dir, "rows.jsonl"), [rows[0], rows[1]!.slice(0, 60), rows[2]].join("\n"))
      return ["data", "inspect", path.join(dir, "rows.jsonl")]
    },
    line: (dir) => [`${path.join(dir, "rows.jsonl")}:2: not valid JSON`]
  },
  {
    name: "data inspect: row 2 without its env_class",
    setup: (dir) => {
      fs.writeFileSync(
        path.join(dir, "rows.jsonl"),
        [rows[0], rows[1]!.replace('"env_class":"mcp_tool",', "")].join("\n")
      )
      return ["data", "inspect", path.join(dir, "rows.jsonl")]
    },
    line: (dir) => [`${path.join(dir, "rows.jsonl")}:2: env_class: Missing key`]
  },
  {
    name: "train: a data.train row with invalid UTF-8",
    setup: (dir) => {
      latin1At = writeLatin1Row(path.join(dir, "rows.jsonl"))
      return train(run(dir), [], [`data.train=[${path.join(dir, "rows.jsonl")}]`])
    },
    line: (dir) => [`${path.join(dir, "rows.jsonl")}:2: not valid UTF-8 at byte ${latin1At} of the file`]
  },
  {
    name: "config check: a config that is not YAML",
    setup: (dir) => {
      fs.writeFileSync(path.join(dir, "run.yaml"), "trainer:\n  max_steps: [1\n")
      return ["config", "check", "--config", path.join(dir, "run.yaml")]
    },
    line: (dir) => [path.join(dir, "run.yaml")],
    also: ["not valid YAML"]
  },
  {
    name: "config check: a key of the wrong type",
    setup: (dir) => {
      const text = fs.readFileSync("configs/tiny.yaml", "utf8").replace("max_steps: 3", "max_steps: three")
      fs.writeFileSync(path.join(dir, "run.yaml"), text)
      return ["config", "check", "--config", path.join(dir, "run.yaml")]
    },
    line: (dir) => [path.join(dir, "run.yaml")],
    also: ['trainer.max_steps: Expected number (got "three")']
  },
  {
    name: "model info: a checkpoint without model.safetensors",
    setup: (dir) => {
      copyModel(dir)
      fs.rmSync(inModel("model.safetensors")(dir))
      return ["model", "info", "--model", model(dir)]
    },
    line: (dir) => [model(dir), "has neither model.safetensors nor model.safetensors.index.json"]
  },
  {
    name: "model info: a truncated model.safetensors",
    setup: (dir) => {
      copyModel(dir)
      fs.truncateSync(inModel("model.safetensors")(dir), 5000)
      return ["model", "info", "--model", model(dir)]
    },
    line: (dir) => [inModel("model.safetensors")(dir)]
  },
  {
    name: "model info: a config.json that is not JSON",
    setup: (dir) => {
      copyModel(dir)
      fs.writeFileSync(inModel("config.json")(dir), '{"architectures": ["Qwen3')
      return ["model", "info", "--model", model(dir)]
    },
    line: (dir) => [`${inModel("config.json")(dir)}: not valid JSON`]
  },
  {
    name: "eval: a model.path whose tokenizer.json is not JSON",
    setup: (dir) => {
      copyModel(dir)
      fs.writeFileSync(inModel("tokenizer.json")(dir), '{"version": "1.0", "mod')
      fs.writeFileSync(path.join(dir, "run.yaml"), yamlWithModelPath(model(dir)))
      return ["eval", "--config", path.join(dir, "run.yaml"), "data.max_eval_prompts=1"]
    },
    line: (dir) => [`${inModel("tokenizer.json")(dir)} is not JSON`]
  },
  {
    name: "train --resume: a trainer_state.json that is not JSON",
    setup: (dir) => {
      copyModel(dir)
      fs.writeFileSync(inModel("trainer_state.json")(dir), '{"step": 1, "vers')
      return train(run(dir), ["--resume", model(dir)], ["trainer.max_steps=2"])
    },
    line: (dir) => [model(dir), "trainer_state.json is not valid JSON"]
  },
  {
    name: "train --resume: a trainer_state.json without optimizerNames",
    setup: (dir) => {
      copyModel(dir)
      const state = { step: 1, version: 1, optimizerStep: 1, klCoef: 0, data: {} }
      fs.writeFileSync(inModel("trainer_state.json")(dir), JSON.stringify(state))
      return train(run(dir), ["--resume", model(dir)], ["trainer.max_steps=2"])
    },
    line: (dir) => [model(dir), "trainer_state.json: optimizerNames: Missing key"]
  }
]

const noStack = (text: string) => assert.notMatch(text, /^\s+at /m, `stderr holds a stack trace:\n${text.slice(-1500)}`)

describe("corrupted files", () => {
  beforeAll(() => Effect.runPromise(SyntheticRun.write(base, steps).pipe(Effect.provide(NodeServices.layer))))
  afterAll(() => fs.rmSync(root, { recursive: true, force: true }))

  for (const [i, c] of cases.entries()) {
    it(`${c.name}: ${c.succeeds ? "a warning names the file and line" : "exits non-zero naming the file, without a stack"}`, async () => {
      const dir = path.join(root, `case-${i}`)
      fs.mkdirSync(dir)
      const result = Cli.run(await c.setup(dir), { timeoutMs: 60_000 })
      const detail = `exit ${result.code}, stderr:\n${result.stderr.slice(-2000)}`
      if (c.succeeds) assert.strictEqual(result.code, 0, detail)
      else assert.notStrictEqual(result.code, 0, detail)
      const parts = c.line(dir)
      assert.isTrue(
        result.stderr.split("\n").some((l) => parts.every((part) => l.includes(part))),
        `no stderr line holds ${JSON.stringify(parts)}; ${detail}`
      )
      for (const text of c.also ?? []) assert.include(result.stderr, text, detail)
      noStack(result.stderr)
    })
  }
})
