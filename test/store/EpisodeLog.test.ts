import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, type Path, type Scope, Stream } from "effect"
import * as PolicyVersion from "../../src/domain/PolicyVersion.ts"
import type { TrajectoryGroup } from "../../src/domain/Trajectory.ts"
import * as EpisodeLog from "../../src/store/EpisodeLog.ts"

const group = (uid: string, reward: number): TrajectoryGroup => ({
  promptUid: uid,
  cursor: 3,
  dataSource: "toolbox",
  envClass: "mcp_tool",
  trajectories: [
    {
      id: `${uid}/0`,
      promptUid: uid,
      sample: 0,
      promptIds: [1, 2, 3],
      responseIds: [4, 5, 6, 7],
      lossMask: [1, 1, 0, 1],
      rolloutLogprobs: [-0.5, -1.25, 0, -0.125],
      turns: [
        {
          start: 0,
          end: 2,
          reward: 0,
          finishReason: "stop",
          policyVersionFirst: PolicyVersion.make(1),
          policyVersionLast: PolicyVersion.make(2),
          toolCalls: [
            {
              id: "call_0",
              server: "toolbox",
              tool: "add",
              arguments: { a: 1, b: 2 },
              result: "3",
              isError: false,
              ms: 1.5
            }
          ],
          observationTokens: 1,
          llmMs: 10,
          envMs: 2
        },
        {
          start: 3,
          end: 4,
          reward,
          finishReason: "stop",
          policyVersionFirst: PolicyVersion.make(2),
          policyVersionLast: PolicyVersion.make(2),
          toolCalls: [],
          observationTokens: 0,
          llmMs: 5,
          envMs: 0
        }
      ],
      reward,
      stopReason: "env_done",
      envMetrics: { "env/tool_calls": 1 }
    }
  ]
})

const scenario = <A, E>(
  f: (dir: string, fs: FileSystem.FileSystem) => Effect.Effect<A, E, FileSystem.FileSystem | Path.Path | Scope.Scope>
) =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const dir = yield* fs.makeTempDirectoryScoped()
    return yield* f(dir, fs)
  }).pipe(Effect.provide(NodeServices.layer))

describe("EpisodeLog", () => {
  it.effect("round-trips groups token for token, in append order", () =>
    scenario((dir) =>
      Effect.gen(function* () {
        const log = yield* EpisodeLog.make(dir)
        yield* log.append(group("a", 1))
        yield* log.append(group("b", 0))
        const read = yield* Stream.runCollect(EpisodeLog.read(log.file))
        assert.deepStrictEqual(read, [group("a", 1), group("b", 0)])
      })
    )
  )

  it.effect("skips a torn last line and keeps every complete group", () =>
    scenario((dir, fs) =>
      Effect.gen(function* () {
        const log = yield* EpisodeLog.make(dir)
        yield* log.append(group("a", 1))
        yield* fs.writeFileString(log.file, '{"promptUid":"b","cursor":4,"dataSo', { flag: "a" })
        const read = yield* Stream.runCollect(EpisodeLog.read(log.file))
        assert.deepStrictEqual(
          read.map((g) => g.promptUid),
          ["a"]
        )
      })
    )
  )

  it.effect("fails naming the line when a line in the middle is corrupt", () =>
    scenario((dir, fs) =>
      Effect.gen(function* () {
        const log = yield* EpisodeLog.make(dir)
        yield* log.append(group("a", 1))
        yield* fs.writeFileString(log.file, "garbage\n", { flag: "a" })
        yield* log.append(group("c", 1))
        const error = yield* Stream.runCollect(EpisodeLog.read(log.file)).pipe(Effect.flip)
        assert.strictEqual(error.line, 2)
      })
    )
  )

  it.effect("appends to an existing log after a restart", () =>
    scenario((dir) =>
      Effect.gen(function* () {
        yield* Effect.scoped(Effect.flatMap(EpisodeLog.make(dir), (log) => log.append(group("a", 1))))
        const log = yield* EpisodeLog.make(dir)
        yield* log.append(group("b", 1))
        const read = yield* Stream.runCollect(EpisodeLog.read(log.file))
        assert.strictEqual(read.length, 2)
      })
    )
  )
})
