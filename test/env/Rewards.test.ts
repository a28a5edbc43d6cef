import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import type { ToolCallRecord } from "../../src/domain/ToolCall.ts"
import * as Rewards from "../../src/env/Rewards.ts"

// ---------------------------------------------------------------------------------------------------------------
// Worked episodes.

const call = (
  tool: string,
  args: Record<string, unknown> = {},
  extra: Partial<ToolCallRecord> = {}
): ToolCallRecord => ({
  id: "call_0",
  tool,
  arguments: args,
  result: "ok",
  isError: false,
  ms: 1,
  ...extra
})
const failed = (tool: string, args: Record<string, unknown> = {}) => call(tool, args, { isError: true, result: "bad" })

const finished = (finalAnswer: string | undefined, calls: ReadonlyArray<ToolCallRecord> = []): Rewards.Episode => ({
  calls,
  finalAnswer,
  turn: 3,
  done: true
})

/** The final reward of a finished episode under a rule ground truth. */
const rule = (groundTruth: unknown, episode: Rewards.Episode) =>
  Rewards.evaluate({ method: "rule", ground_truth: groundTruth }, episode).pipe(Effect.map((r) => r.reward))

const truth = (groundTruth: unknown) => Schema.decodeUnknownSync(Rewards.RuleGroundTruth)(groundTruth)

// ---------------------------------------------------------------------------------------------------------------

describe("Rewards.evaluate: answers", () => {
  it.effect('normalized (the default): "  $1,234.50 " is 1234.5, but not 1234.6', () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* rule({ answer: 1234.5 }, finished("  $1,234.50 ")), 1)
      assert.strictEqual(yield* rule({ answer: "1234.5" }, finished("$1,234.50")), 1)
      assert.strictEqual(yield* rule({ answer: 1234.5 }, finished("$1,234.60")), 0)
    })
  )

  it.effect("normalized ignores case, spacing, quotes and a final full stop, not the words", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* rule({ answer: "New  York" }, finished(' "new york." ')), 1)
      assert.strictEqual(yield* rule({ answer: "New York" }, finished("York")), 0)
    })
  )

  it.effect("exact compares the trimmed text as written", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* rule({ answer: "Paris", answer_match: "exact" }, finished(" Paris\n")), 1)
      assert.strictEqual(yield* rule({ answer: "Paris", answer_match: "exact" }, finished("paris")), 0)
    })
  )

  it.effect("numeric reads \\boxed{}, then '#### n', else the last number in the answer", () =>
    Effect.gen(function* () {
      const numeric = (answer: number) => ({ answer, answer_match: "numeric" })
      assert.strictEqual(yield* rule(numeric(42), finished("3 + 39 = \\boxed{42}, not 41")), 1)
      assert.strictEqual(yield* rule(numeric(1000), finished("so #### 1,000\nthanks 2")), 1)
      assert.strictEqual(yield* rule(numeric(7), finished("first 3, then 7")), 1)
      assert.strictEqual(yield* rule(numeric(3), finished("first 3, then 7")), 0)
      assert.strictEqual(yield* rule(numeric(3), finished("no number here")), 0)
    })
  )

  it.effect("tolerance is relative or absolute: 1% of 100 admits 100.9, not 101.5", () =>
    Effect.gen(function* () {
      const gt = { answer: 100, answer_match: "numeric", tolerance: { relative: 0.01 } }
      assert.strictEqual(yield* rule(gt, finished("100.9")), 1)
      assert.strictEqual(yield* rule(gt, finished("101.5")), 0)
      const absolute = { answer: 0, answer_match: "numeric", tolerance: { absolute: 0.5 } }
      assert.strictEqual(yield* rule(absolute, finished("-0.4")), 1)
      // the default 1e-6 (both): 0.1 + 0.2 is 0.3
      assert.strictEqual(yield* rule({ answer: 0.3 }, finished(String(0.1 + 0.2))), 1)
    })
  )

  it.effect("a bare string or number as ground truth is the answer (SkyRL's gsm8k rows)", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* rule("72", finished("72")), 1)
      assert.strictEqual(yield* rule(72, finished("71")), 0)
    })
  )

  it.effect("an array lists accepted answers; any one of them is correct", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* rule({ answer: ["NYC", "New York City"] }, finished("new york city")), 1)
      assert.strictEqual(yield* rule(["NYC", 10], finished("10.0")), 1)
      assert.strictEqual(yield* rule({ answer: ["NYC", "New York City"] }, finished("Boston")), 0)
    })
  )

  it.effect("an episode cut off before answering earns 0", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* rule({ answer: 5 }, finished(undefined)), 0)
    })
  )
})

describe("Rewards.evaluate: tool_sequence", () => {
  const searchThenRead = (order: string) => ({
    tool_sequence: [{ tool: "search" }, { tool: "read" }],
    order,
    weights: { answer: 0, tool_sequence: 1 } // partial credit only, to show the match fraction
  })

  it.effect("subsequence (the default): in order, other calls between allowed; score = LCS / expected", () =>
    Effect.gen(function* () {
      const gt = searchThenRead("subsequence")
      assert.strictEqual(yield* rule(gt, finished("x", [call("search"), call("list"), call("read")])), 1)
      assert.strictEqual(yield* rule(gt, finished("x", [call("read"), call("search")])), 0.5) // LCS 1 of 2
      assert.strictEqual(yield* rule(gt, finished("x", [])), 0)
    })
  )

  it.effect("strict: exactly the sequence; score = matched prefix / max(expected, made)", () =>
    Effect.gen(function* () {
      const gt = searchThenRead("strict")
      assert.strictEqual(yield* rule(gt, finished("x", [call("search"), call("read")])), 1)
      assert.strictEqual(yield* rule(gt, finished("x", [call("search"), call("list"), call("read")])), 1 / 3)
      assert.strictEqual(yield* rule(gt, finished("x", [call("read"), call("search")])), 0)
    })
  )

  it.effect("any: each expected call matched by a distinct call, in any order (a true matching, not greedy)", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* rule(searchThenRead("any"), finished("x", [call("read"), call("search")])), 1)
      // greedy would give the argument-free step call 1 and leave {a: 1} unmatched (0.5); the matching finds 1
      const gt = {
        tool_sequence: [{ tool: "add" }, { tool: "add", arguments: { a: 1 } }],
        order: "any",
        weights: { answer: 0, tool_sequence: 1 }
      }
      assert.strictEqual(yield* rule(gt, finished("x", [call("add", { a: 1 }), call("add", { a: 2 })])), 1)
      assert.strictEqual(yield* rule(gt, finished("x", [call("add", { a: 1 })])), 0.5) // one call serves one step
    })
  )

  it.effect("calls the tool rejected do not count", () =>
    Effect.gen(function* () {
      const gt = searchThenRead("subsequence")
      assert.strictEqual(yield* rule(gt, finished("x", [call("search"), failed("read")])), 0.5)
    })
  )

  it.effect("arguments match as a subset, numbers within tolerance, numeric strings as numbers", () =>
    Effect.gen(function* () {
      const gt = {
        tool_sequence: [{ tool: "convert", arguments: { value: 2, opts: { unit: "m" }, tags: ["a", 1] } }]
      }
      const made = (args: Record<string, unknown>) => finished("x", [call("convert", args)])
      // extra keys (b, opts.x) are allowed; 2.0000001 is 2 within 1e-6 relative
      assert.strictEqual(
        yield* rule(gt, made({ value: 2.0000001, b: 9, opts: { unit: "m", x: 1 }, tags: ["a", 1] })),
        1
      )
      assert.strictEqual(yield* rule(gt, made({ value: "2", opts: { unit: "m" }, tags: ["a", "1"] })), 1)
      assert.strictEqual(yield* rule(gt, made({ value: 2.1, opts: { unit: "m" }, tags: ["a", 1] })), 0)
      assert.strictEqual(yield* rule(gt, made({ value: 2, opts: { unit: "km" }, tags: ["a", 1] })), 0)
      assert.strictEqual(yield* rule(gt, made({ value: 2, opts: { unit: "m" }, tags: ["a", 1, 2] })), 0) // arrays: same length
      assert.strictEqual(yield* rule(gt, made({ opts: { unit: "m" }, tags: ["a", 1] })), 0) // value missing
    })
  )

  it.effect("namespaced names: server__tool matches the record's server and tool, either way round", () =>
    Effect.gen(function* () {
      const expect = (tool: string, server?: string) => ({
        tool_sequence: [server === undefined ? { tool } : { tool, server }]
      })
      const math = call("add", {}, { server: "math" })
      assert.strictEqual(yield* rule(expect("math__add"), finished("x", [math])), 1)
      assert.strictEqual(yield* rule(expect("math__add"), finished("x", [call("math__add")])), 1)
      assert.strictEqual(yield* rule(expect("add", "math"), finished("x", [call("math__add")])), 1)
      assert.strictEqual(yield* rule(expect("add"), finished("x", [call("calc__add")])), 1) // no server expected
      assert.strictEqual(yield* rule(expect("add", "math"), finished("x", [call("calc__add")])), 0)
      assert.strictEqual(yield* rule(expect("math__add"), finished("x", [call("add", {}, { server: "calc" })])), 0)
    })
  )
})

describe("Rewards.evaluate: must_call_tool, format and partial credit", () => {
  it.effect("must_call_tool: a right answer without the required tool earns 0", () =>
    Effect.gen(function* () {
      const gt = { answer: 5, must_call_tool: ["add", "math__mul"] }
      const both = [call("add"), call("mul", {}, { server: "math" })]
      assert.strictEqual(yield* rule(gt, finished("5", both)), 1)
      assert.strictEqual(yield* rule(gt, finished("5", [call("add")])), 0)
      assert.strictEqual(yield* rule(gt, finished("5", [call("add"), failed("math__mul")])), 0)
      assert.strictEqual(yield* rule({ must_call_tool: "add" }, finished(undefined, [call("add")])), 1)
    })
  )

  it.effect("format_reward pays for a non-empty answer with no unparsable call attempt", () =>
    Effect.gen(function* () {
      const gt = { answer: 5, format_reward: 0.1 }
      assert.strictEqual(yield* rule(gt, finished("4")), 0.1)
      assert.strictEqual(yield* rule(gt, finished("5")), 1.1)
      assert.strictEqual(yield* rule(gt, { ...finished("4"), parseFailures: 1 }), 0)
      assert.strictEqual(yield* rule(gt, finished("   ")), 0)
      assert.strictEqual(yield* rule({ answer: 5, weights: { format: 0.2 } }, finished("4")), 0.2)
    })
  )

  it.effect("weights give partial credit: 0.5·outcome + 0.5·(2 of 4 steps) = 0.25", () =>
    Effect.gen(function* () {
      const gt = {
        answer: 10,
        tool_sequence: [{ tool: "a" }, { tool: "b" }, { tool: "c" }, { tool: "d" }],
        weights: { answer: 0.5, tool_sequence: 0.5 }
      }
      // the answer is right but the sequence is incomplete, so the outcome (every criterion) is 0
      assert.strictEqual(yield* rule(gt, finished("10", [call("a"), call("c")])), 0.25)
      assert.strictEqual(yield* rule(gt, finished("10", [call("a"), call("b"), call("c"), call("d")])), 1)
      assert.strictEqual(yield* rule(gt, finished("9", [call("a"), call("b"), call("c"), call("d")])), 0.5)
    })
  )

  it.effect("per-turn rewards are paid for the step's calls, before and on the last step", () =>
    Effect.gen(function* () {
      const spec = {
        method: "rule",
        ground_truth: { answer: 5, per_turn: { successful_call: 0.1, failed_call: -0.2 } }
      }
      const step = yield* Rewards.evaluate(spec, {
        calls: [call("add"), failed("mul")],
        stepCalls: [call("add"), failed("mul")],
        finalAnswer: undefined,
        turn: 0,
        done: false
      })
      assert.closeTo(step.reward, 0.1 - 0.2, 1e-12)
      assert.deepStrictEqual(step.metrics, {})
      const last = yield* Rewards.evaluate(spec, { ...finished("5", [call("add")]), stepCalls: [call("add")] })
      assert.closeTo(last.reward, 1 + 0.1, 1e-12)
      const quiet = yield* Rewards.evaluate(spec, { calls: [], finalAnswer: undefined, turn: 1, done: false })
      assert.strictEqual(quiet.reward, 0)
    })
  )

  it.effect("the last step reports reward/* metrics for the criteria the row names", () =>
    Effect.gen(function* () {
      const result = yield* Rewards.evaluate(
        { method: "rule", ground_truth: { answer: 5, tool_sequence: [{ tool: "add" }, { tool: "mul" }] } },
        finished("5", [call("add")])
      )
      assert.deepStrictEqual(result, {
        reward: 0,
        metrics: {
          "reward/rule": 0,
          "reward/outcome": 0,
          "reward/format_ok": 1,
          "reward/answer_correct": 1,
          "reward/tool_sequence_match": 0.5
        }
      })
    })
  )

  it.effect("a row without reward_spec earns 0", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* Rewards.evaluate(undefined, finished("5")), { reward: 0, metrics: {} })
    })
  )
})

describe("Rewards.score", () => {
  it("breaks the reward into parts, leaving out criteria the row does not name", () => {
    assert.deepStrictEqual(Rewards.score(truth({ answer: 3 }), finished("3")), {
      outcome: 1,
      format_ok: 1,
      answer_correct: 1
    })
    assert.deepStrictEqual(
      Rewards.score(
        truth({ must_call_tool: "add", tool_sequence: [{ tool: "add" }] }),
        finished(undefined, [call("add")])
      ),
      { outcome: 1, format_ok: 0, tool_sequence_match: 1, must_call_ok: 1 }
    )
  })
})

describe("Rewards.decodeGroundTruth", () => {
  const message = (groundTruth: unknown) =>
    Rewards.decodeGroundTruth(groundTruth).pipe(
      Effect.flip,
      Effect.map((e) => `${e.reason}: ${e.message}`)
    )

  it.effect("names the offending key of a bad row", () =>
    Effect.gen(function* () {
      assert.strictEqual(
        yield* message({ answer: 1, must_call_tools: "add" }),
        'BadGroundTruth: ground_truth: Expected no excess property\n  at ["must_call_tools"]'
      )
      assert.include(
        yield* message({ answer: 1, order: "sorted" }),
        'Expected "strict" | "subsequence" | "any"\n  at ["order"]'
      )
      assert.include(
        yield* message({ tool_sequence: [{ server: "m" }] }),
        'Missing key\n  at ["tool_sequence"][0]["tool"]'
      )
      assert.include(yield* message({ answer: 1, weights: { answer: -1 } }), 'at ["weights"]["answer"]')
    })
  )

  it.effect("rejects a row that names no criterion, or the format weight twice", () =>
    Effect.gen(function* () {
      assert.include(
        yield* message({ format_reward: 0.1 }),
        "names no criterion: give answer, tool_sequence or must_call_tool"
      )
      assert.include(
        yield* message({ answer: 1, format_reward: 0.1, weights: { format: 0.2 } }),
        'give format_reward or weights.format, not both\n  at ["format_reward"]'
      )
      assert.strictEqual(yield* message(undefined), 'BadGroundTruth: method "rule" needs a ground_truth')
    })
  )
})

describe("Rewards.register", () => {
  Rewards.register("test/length", (groundTruth, episode) =>
    episode.done ? Math.min(1, (episode.finalAnswer ?? "").length / Number(groundTruth)) : 0
  )
  Rewards.register("test/effectful", (_groundTruth, episode) =>
    Effect.succeed({ reward: episode.calls.length, done: true, metrics: { "reward/calls": episode.calls.length } })
  )
  Rewards.register("test/throws", () => {
    throw new Error("judge offline")
  })
  Rewards.register("test/nan", () => Number.NaN)

  it.effect("routes other methods to the function registered under that name", () =>
    Effect.gen(function* () {
      const long = yield* Rewards.evaluate({ method: "test/length", ground_truth: 4 }, finished("ab"))
      assert.deepStrictEqual(long, { reward: 0.5, metrics: {} })
      const effectful = yield* Rewards.evaluate({ method: "test/effectful" }, finished("x", [call("a"), call("b")]))
      assert.deepStrictEqual(effectful, { reward: 2, done: true, metrics: { "reward/calls": 2 } })
    })
  )

  it.effect("an unknown method fails, listing the registered ones", () =>
    Effect.gen(function* () {
      const error = yield* Effect.flip(Rewards.evaluate({ method: "llm_judge" }, finished("x")))
      assert.strictEqual(error.reason, "UnknownMethod")
      assert.strictEqual(
        error.message,
        'unknown reward method "llm_judge"; registered: "rule", "judge", "test/effectful", "test/length", "test/nan", "test/throws"'
      )
    })
  )

  it.effect("a function that throws or returns a non-finite reward fails with FunctionFailed", () =>
    Effect.gen(function* () {
      const thrown = yield* Effect.flip(Rewards.evaluate({ method: "test/throws" }, finished("x")))
      assert.strictEqual(thrown.reason, "FunctionFailed")
      assert.strictEqual((thrown.cause as Error).message, "judge offline")
      const nan = yield* Effect.flip(Rewards.evaluate({ method: "test/nan" }, finished("x")))
      assert.strictEqual(nan.message, 'reward function "test/nan" returned a non-finite reward (NaN)')
    })
  )

  it('refuses to replace the built-in "rule" and "judge"', () => {
    assert.throws(() => Rewards.register("rule", () => 0), /built-in rule reward/)
    assert.throws(() => Rewards.register("judge", () => 0), /built-in LLM group judge/)
  })

  it.effect('"judge" pays nothing per episode: the group judge pays once the group is done', () =>
    Effect.gen(function* () {
      const result = yield* Rewards.evaluate({ method: "judge", ground_truth: { answer: 5 } }, finished("5"))
      assert.deepStrictEqual(result, { reward: 0, metrics: {} })
    })
  )
})
