import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { PromptRow } from "../../src/domain/PromptRow.ts"
import type { ToolCallRecord } from "../../src/domain/ToolCall.ts"
import type { Trajectory, TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as ChatClient from "../../src/env/ChatClient.ts"
import * as GroupJudge from "../../src/env/GroupJudge.ts"
import * as ChatServer from "../fixtures/ChatServer.ts"
import * as JudgeServer from "../fixtures/JudgeServer.ts"
import { turn } from "../fixtures/Trajectories.ts"

// Token ids are char codes here, so the judge reads the turns' text back with String.fromCharCode.
const decode = (ids: ReadonlyArray<number>) => String.fromCharCode(...ids)

const row: PromptRow = {
  uid: "row-1",
  data_source: "toolbox",
  env_class: "mcp_tool",
  prompt: [{ role: "user", content: "Compute 2 + 3." }],
  reward_spec: {
    method: "judge",
    ground_truth: {
      tool_sequence: [{ tool: "add", arguments: { a: 2, b: 3 } }],
      answer: 5,
      answer_match: "numeric",
      weights: { answer: 0.8, tool_sequence: 0.2 }
    }
  }
}

const add = (result: string): ToolCallRecord => ({
  id: "call_0",
  tool: "add",
  arguments: { a: 2, b: 3 },
  result,
  isError: false,
  ms: 1
})

/** A trajectory whose turns write `texts`, the k-th turn making the calls `calls[k]`. */
const trajectory = (
  sample: number,
  texts: ReadonlyArray<string>,
  calls: ReadonlyArray<ReadonlyArray<ToolCallRecord>> = []
) => {
  const responseIds: Array<number> = []
  const turns = texts.map((text, k) => {
    const start = responseIds.length
    for (const ch of text) responseIds.push(ch.charCodeAt(0))
    return { ...turn(start, responseIds.length, 0), toolCalls: [...(calls[k] ?? [])] }
  })
  return {
    id: `row-1/${sample}`,
    promptUid: "row-1",
    sample,
    promptIds: [1, 2, 3],
    responseIds,
    lossMask: responseIds.map(() => 1 as const),
    rolloutLogprobs: responseIds.map(() => -1),
    turns,
    reward: 0,
    stopReason: "stop",
    envMetrics: { "env/turns": texts.length }
  } satisfies Trajectory
}

const callAdd = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
// rule scores with weights 0.8 answer / 0.2 tool sequence: t0 called add and answered 5 → 1; t1 answered 7 without
// calls → 0; t2 answered 5 without calls → 0 (the outcome needs the sequence too); t3 called add, answered 6 → 0.2
const group: TrajectoryGroup = {
  promptUid: "row-1",
  cursor: 0,
  dataSource: "toolbox",
  envClass: "mcp_tool",
  trajectories: [
    trajectory(0, [callAdd, "5"], [[add("5")]]),
    trajectory(1, ["7"]),
    trajectory(2, ["5"]),
    trajectory(3, [callAdd, "6"], [[add("5")]])
  ]
}

const settings: GroupJudge.Settings = {
  rubric: "the config rubric",
  max_attempts: 3,
  fallback_score: 0,
  max_trajectory_chars: 6000,
  structured_output: true,
  cache: true
}

const judgeWith = (client: ChatClient.ChatClient, s: Partial<GroupJudge.Settings> = {}) =>
  GroupJudge.make(client, { ...settings, ...s }).pipe(Effect.provide(NodeServices.layer))

const scripted = <A, E>(answers: ReadonlyArray<string>, body: (server: ChatServer.ChatServer) => Effect.Effect<A, E>) =>
  Effect.acquireUseRelease(
    Effect.promise(() => ChatServer.start((_s, n) => ({ content: answers[Math.min(n, answers.length - 1)]! }))),
    body,
    (s) => Effect.promise(() => s.close())
  )

describe("GroupJudge.parseVerdict", () => {
  const ids = ["t0", "t1"]
  it("reads the scores object, also fenced or inside prose", () => {
    assert.deepStrictEqual(GroupJudge.parseVerdict('{"scores": {"t1": 0.25, "t0": 1}}', ids), {
      ok: true,
      scores: [1, 0.25]
    })
    assert.isTrue(GroupJudge.parseVerdict('```json\n{"scores": {"t0": 0, "t1": 1}}\n```', ids).ok)
    assert.isTrue(GroupJudge.parseVerdict('Here: {"scores": {"t0": 0, "t1": 1}} done', ids).ok)
  })
  it("names malformed, missing (or extra) and out-of-range answers", () => {
    const kind = (text: string) => {
      const v = GroupJudge.parseVerdict(text, ids)
      return v.ok ? "ok" : v.kind
    }
    assert.strictEqual(kind('{"scores": {"t0": 0.'), "malformed")
    assert.strictEqual(kind('{"score": {"t0": 0, "t1": 1}}'), "malformed")
    assert.strictEqual(kind('{"scores": [0, 1]}'), "malformed")
    assert.strictEqual(kind('{"scores": {"t0": 0}}'), "missing")
    assert.strictEqual(kind('{"scores": {"t0": 0, "t1": 1, "t2": 1}}'), "missing")
    assert.strictEqual(kind('{"scores": {"t0": 0, "t1": 1.2}}'), "out_of_range")
    assert.strictEqual(kind('{"scores": {"t0": -0.1, "t1": 1}}'), "out_of_range")
    assert.strictEqual(kind('{"scores": {"t0": "0.5", "t1": 1}}'), "out_of_range")
  })
})

describe("GroupJudge", () => {
  it.live("sends the group in one call and pays each trajectory its score on its last generated turn", () =>
    Effect.acquireUseRelease(
      Effect.promise(() => JudgeServer.start({ faultRate: 0, format: "hermes" })),
      (server) =>
        Effect.gen(function* () {
          const seen: Array<Record<string, unknown>> = []
          const client = ChatClient.make({ url: server.url, model: "fixture-judge", temperature: 0 })
          const spy: ChatClient.ChatClient = {
            ...client,
            complete: (r) =>
              Effect.tap(client.complete(r), () =>
                Effect.sync(() => seen.push(ChatClient.requestBody({ url: "", model: "m" }, r)))
              )
          }
          const judge = yield* judgeWith(spy)
          assert.isTrue(judge.applies(row))
          assert.isFalse(judge.applies({ ...row, reward_spec: { method: "rule", ground_truth: 5 } }))
          const out = yield* judge.judge(row, group, decode)
          assert.deepStrictEqual(out.judge?.scores, [1, 0, 0, 0.2])
          assert.deepStrictEqual(
            out.trajectories.map((t) => t.reward),
            [1, 0, 0, 0.2]
          )
          // t0's score sits on its second (last) turn; envMetrics gain reward/judge
          assert.deepStrictEqual(
            out.trajectories[0]!.turns.map((t) => t.reward),
            [0, 1]
          )
          assert.strictEqual(out.trajectories[3]!.envMetrics["reward/judge"], 0.2)
          assert.strictEqual(out.trajectories[3]!.envMetrics["env/turns"], 2)
          assert.strictEqual(server.stats.calls, 1)
          assert.strictEqual(out.judge?.calls.length, 1)
          assert.isTrue((out.judge?.promptTokens ?? 0) > 0)
          assert.isUndefined(out.judge?.failed)
          // the request: the config rubric, the reference, every trajectory, and a schema requiring each id
          const messages = seen[0]!["messages"] as Array<{ content: string }>
          assert.include(messages[0]!.content, "Rubric: the config rubric")
          assert.include(messages[1]!.content, "Reference (ground truth, JSON):")
          assert.include(messages[1]!.content, "Trajectory t3:")
          const format = seen[0]!["response_format"] as {
            json_schema: { schema: { properties: { scores: { required: Array<string> } } } }
          }
          assert.deepStrictEqual(format.json_schema.schema.properties.scores.required, ["t0", "t1", "t2", "t3"])
        }),
      (s) => Effect.promise(() => s.close())
    )
  )

  it.live("a row's rubric replaces the config's", () =>
    scripted(['{"scores": {"t0": 1, "t1": 0, "t2": 0, "t3": 0}}'], (server) =>
      Effect.gen(function* () {
        const judge = yield* judgeWith(ChatClient.make({ url: server.url, model: "m" }))
        const own = { ...row, reward_spec: { ...row.reward_spec!, rubric: "only the answer counts" } }
        yield* judge.judge(own, group, decode)
        const system = (server.seen[0]!.body["messages"] as Array<{ content: string }>)[0]!.content
        assert.include(system, "Rubric: only the answer counts")
        assert.notInclude(system, "the config rubric")
      })
    )
  )

  it.live("asks again after a malformed answer, with the reason, and uses the next valid one", () =>
    scripted(['{"scores": {"t0": 1,', '{"scores": {"t0": 0.5, "t1": 0.25, "t2": 0, "t3": 1}}'], (server) =>
      Effect.gen(function* () {
        const judge = yield* judgeWith(ChatClient.make({ url: server.url, model: "m" }))
        const out = yield* judge.judge(row, group, decode)
        assert.deepStrictEqual(out.judge?.scores, [0.5, 0.25, 0, 1])
        assert.strictEqual(out.judge?.malformed, 1)
        assert.strictEqual(out.judge?.calls.length, 2)
        assert.isUndefined(out.judge?.failed)
        const retry = server.seen[1]!.body["messages"] as Array<{ role: string; content: string }>
        assert.strictEqual(retry.length, 4)
        assert.strictEqual(retry[2]!.content, '{"scores": {"t0": 1,')
        assert.include(retry[3]!.content, "cannot be used")
      })
    )
  )

  it.live(
    "malformed, out-of-range and incomplete answers up to max_attempts: a JudgeError, the fallback score, counts",
    () =>
      scripted(
        [
          "not json at all",
          '{"scores": {"t0": 1.3, "t1": 0, "t2": 0, "t3": 0}}',
          '{"scores": {"t0": 1, "t1": 0, "t2": 0}}'
        ],
        (server) =>
          Effect.gen(function* () {
            const judge = yield* judgeWith(ChatClient.make({ url: server.url, model: "m" }), { fallback_score: 0.5 })
            const out = yield* judge.judge(row, group, decode)
            assert.deepStrictEqual(out.judge?.scores, [0.5, 0.5, 0.5, 0.5])
            assert.deepStrictEqual(
              out.trajectories.map((t) => t.reward),
              [0.5, 0.5, 0.5, 0.5]
            )
            assert.match(out.judge?.failed ?? "", /^Missing: judge of row-1: no usable answer in 3 attempts/)
            assert.include(out.judge?.failed ?? "", server.url)
            const m = GroupJudge.stepMetrics([out, group])
            assert.strictEqual(m["judge/groups"], 1)
            assert.strictEqual(m["judge/calls"], 3)
            assert.strictEqual(m["judge/malformed"], 1)
            assert.strictEqual(m["judge/out_of_range"], 1)
            assert.strictEqual(m["judge/missing"], 1)
            assert.strictEqual(m["judge/failed_groups"], 1)
            assert.strictEqual(m["judge/score_mean"], 0.5)
            // a failed verdict is not cached: the same group is asked again
            yield* judge.judge(row, group, decode)
            assert.strictEqual(server.seen.length, 6)
          })
      )
  )

  it.live("an endpoint that is down is a failed group, not a crash", () =>
    Effect.gen(function* () {
      const s = yield* Effect.promise(() => ChatServer.start(() => ({ content: "" })))
      yield* Effect.promise(() => s.close())
      const judge = yield* judgeWith(ChatClient.make({ url: s.url, model: "m", retries: 1, backoffMs: 5 }))
      const out = yield* judge.judge(row, group, decode)
      assert.match(out.judge?.failed ?? "", /^Endpoint: /)
      assert.deepStrictEqual(out.judge?.scores, [0, 0, 0, 0])
      assert.strictEqual(GroupJudge.stepMetrics([out])["judge/failed_groups"], 1)
    })
  )

  it.live("caches verdicts by transcripts, rubric and model, in memory and in cache_file across judges", () =>
    scripted(['{"scores": {"t0": 1, "t1": 0, "t2": 0, "t3": 0.5}}'], (server) =>
      Effect.gen(function* () {
        const file = join(mkdtempSync(join(tmpdir(), "judge-cache-")), "cache.jsonl")
        const judge = yield* judgeWith(ChatClient.make({ url: server.url, model: "m" }), { cache_file: file })
        yield* judge.judge(row, group, decode)
        const again = yield* judge.judge(row, group, decode)
        assert.isTrue(again.judge?.cacheHit)
        assert.deepStrictEqual(again.judge?.calls, [])
        assert.deepStrictEqual(again.judge?.scores, [1, 0, 0, 0.5])
        assert.strictEqual(server.seen.length, 1)
        // another rubric or another judge model is another verdict
        yield* judge.judge({ ...row, reward_spec: { ...row.reward_spec!, rubric: "other" } }, group, decode)
        assert.strictEqual(server.seen.length, 2)
        assert.strictEqual(readFileSync(file, "utf8").trim().split("\n").length, 2)
        const fresh = yield* judgeWith(ChatClient.make({ url: server.url, model: "m" }), { cache_file: file })
        assert.isTrue((yield* fresh.judge(row, group, decode)).judge?.cacheHit)
        const otherModel = yield* judgeWith(ChatClient.make({ url: server.url, model: "m2" }), { cache_file: file })
        assert.isFalse((yield* otherModel.judge(row, group, decode)).judge?.cacheHit)
        assert.strictEqual(server.seen.length, 3)
      })
    )
  )

  it.live(
    "replays a judged group from its recorded calls with no endpoint, bit-identical; an unrecorded group fails typed",
    () =>
      Effect.gen(function* () {
        // faults on every other call, so the recorded verdicts include retries
        const recorded = yield* Effect.acquireUseRelease(
          Effect.promise(() => JudgeServer.start({ faultRate: 0.5, seed: 3, format: "hermes" })),
          (server) =>
            Effect.gen(function* () {
              const judge = yield* judgeWith(ChatClient.make({ url: server.url, model: "j", seed: 1 }), {
                cache: false
              })
              const groups = [yield* judge.judge(row, group, decode), yield* judge.judge(row, group, decode)]
              assert.isAbove(server.stats.calls, 2) // some answers were rejected and asked again
              return groups
            }),
          (s) => Effect.promise(() => s.close())
        )
        const replay = ChatClient.make({
          url: "http://127.0.0.1:9/v1",
          model: "j",
          seed: 1,
          mode: "replay",
          records: GroupJudge.recordsOf(recorded)
        })
        const judge = yield* judgeWith(replay, { cache: false })
        const replayed = [yield* judge.judge(row, group, decode), yield* judge.judge(row, group, decode)]
        assert.strictEqual(JSON.stringify(replayed), JSON.stringify(recorded))
        const third = yield* judge.judge(row, group, decode)
        assert.match(third.judge?.failed ?? "", /^ReplayMiss: /)
      })
  )
})
