/**
 * Tool I/O: how an env's tool calls are executed, and the record each one leaves.
 *
 * - `live`: calls go to the MCP servers (`McpClient`); every call returns a `ToolCallRecord` (server, tool,
 *   arguments, the text the model was shown, isError, ms), which `McpToolEnv` puts in its step metadata, so the
 *   episode log keeps every tool's raw I/O.
 * - `record`: live, and the service also keeps every record of the run (`recorded`), in call order.
 * - `replay`: no server is started; results come from recorded `ToolCallRecord`s (a list, or an episodes file's
 *   `trajectories[].turns[].toolCalls`), looked up by (tool, canonical arguments, occurrence): the n-th call of a
 *   tool with the same arguments in one session gets the n-th recorded result of that pair. A call with no such
 *   record fails with `ReplayMissError`: replay never invents a result.
 *
 * Tool failures are not errors here: they are records with `isError: true` and the text the model is shown
 * (`Error: division by zero`).
 */
import { Context, Effect, FileSystem, Layer, Schema, type Scope } from "effect"
import type { EnvironmentConfig } from "../config/EnvironmentConfig.ts"
import type { ToolCall, ToolCallRecord } from "../domain/ToolCall.ts"
import * as McpClient from "../mcp/McpClient.ts"

export class ReplayMissError extends Schema.TaggedError<ReplayMissError>()("ReplayMissError", {
  tool: Schema.String,
  arguments: Schema.String, // canonical JSON
  occurrence: Schema.Int, // 0-based: this was the (occurrence+1)-th such call in the session
  message: Schema.String
}) {}

/** The replay source could not be read. */
export class ReplaySourceError extends Schema.TaggedError<ReplaySourceError>()("ReplaySourceError", {
  file: Schema.String,
  message: Schema.String
}) {}

/** The tool calls of one trajectory. */
export interface ToolSession {
  readonly tools: ReadonlyArray<McpClient.McpTool>
  readonly call: (call: ToolCall) => Effect.Effect<ToolCallRecord, ReplayMissError>
}

export class ToolIo extends Context.Service<
  ToolIo,
  {
    readonly mode: "live" | "record" | "replay"
    readonly session: Effect.Effect<ToolSession, never, Scope.Scope>
    /** Every record of the run so far (`record` mode); empty in the other modes. */
    readonly recorded: Effect.Effect<ReadonlyArray<ToolCallRecord>>
  }
>()("rl/env/ToolIo") {}

/** JSON with object keys sorted at every depth: equal arguments give equal keys whatever their key order. */
export const canonicalJson = (value: unknown): string =>
  JSON.stringify(value, (_key, v: unknown) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(
          Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        )
      : v
  ) ?? "null"

const errorText = (e: McpClient.ToolCallError): string => `Error: ${e.message}`

const liveSession = (client: McpClient.McpClient["Service"], keep: ((r: ToolCallRecord) => void) | undefined) =>
  Effect.gen(function* () {
    const session = yield* client.session
    const serverOf = (name: string) => session.tools.find((t) => t.name === name)?.server
    const record = (c: ToolCall, start: number, result: string, isError: boolean, server: string | undefined) => {
      const ms = performance.now() - start
      const r: ToolCallRecord =
        server === undefined || server === ""
          ? { id: c.id, tool: c.name, arguments: c.arguments, result, isError, ms }
          : { id: c.id, server, tool: c.name, arguments: c.arguments, result, isError, ms }
      keep?.(r)
      return r
    }
    const call = (c: ToolCall): Effect.Effect<ToolCallRecord> =>
      Effect.suspend(() => {
        // a duration for metrics, not a time the program acts on: the monotonic clock, without the Clock service's
        // BigInt wall-time arithmetic (two per call, on every tool call's path)
        const start = performance.now()
        return Effect.match(session.call(c.name, c.arguments), {
          onSuccess: (ok) => record(c, start, ok.text, false, ok.server),
          onFailure: (e) => record(c, start, errorText(e), true, serverOf(c.name) ?? e.server)
        })
      })
    return { tools: session.tools, call } satisfies ToolSession
  })

/** Live tool calls through the `McpClient`. */
export const layerLive: Layer.Layer<ToolIo, never, McpClient.McpClient> = Layer.effect(
  ToolIo,
  Effect.gen(function* () {
    const client = yield* McpClient.McpClient
    return ToolIo.of({ mode: "live", session: liveSession(client, undefined), recorded: Effect.succeed([]) })
  })
)

/** Live tool calls, every record also kept in `recorded`. */
export const layerRecord: Layer.Layer<ToolIo, never, McpClient.McpClient> = Layer.effect(
  ToolIo,
  Effect.gen(function* () {
    const client = yield* McpClient.McpClient
    const records: Array<ToolCallRecord> = []
    return ToolIo.of({
      mode: "record",
      session: liveSession(client, (r) => void records.push(r)),
      recorded: Effect.sync(() => [...records])
    })
  })
)

export interface ReplayOptions {
  readonly records: ReadonlyArray<ToolCallRecord>
  /** The tools the env lists in its prompt; default: the recorded tool names with an open object schema. */
  readonly tools?: ReadonlyArray<McpClient.McpTool>
}

/** Serves recorded results; starts no server. */
/**
 * Recorded answers by key, in record order, and how replay looks them up: within one session (a trajectory's tool
 * calls, a run's LLM calls), the n-th lookup of a key gets that key's n-th record; `hit` is undefined past the last.
 */
export const replayTable = <R>(records: ReadonlyArray<R>, keyOf: (record: R) => string) => {
  const table = new Map<string, Array<R>>()
  for (const r of records) {
    const key = keyOf(r)
    const list = table.get(key)
    if (list === undefined) table.set(key, [r])
    else list.push(r)
  }
  return {
    keys: table.size,
    session: () => {
      const seen = new Map<string, number>()
      return (key: string): { readonly hit: R | undefined; readonly occurrence: number } => {
        const occurrence = seen.get(key) ?? 0
        seen.set(key, occurrence + 1)
        return { hit: table.get(key)?.[occurrence], occurrence }
      }
    }
  }
}

export const makeReplay = (options: ReplayOptions): ToolIo["Service"] => {
  const table = replayTable(options.records, (r) => `${r.tool}\u0000${canonicalJson(r.arguments)}`)
  const tools =
    options.tools ??
    [...new Map(options.records.map((r) => [r.tool, r])).values()].map(
      (r): McpClient.McpTool => ({
        name: r.tool,
        server: r.server ?? "replay",
        remoteName: r.tool.includes("__") ? r.tool.slice(r.tool.indexOf("__") + 2) : r.tool,
        description: "",
        inputSchema: { type: "object" },
        readOnly: true,
        idempotent: true
      })
    )
  const session = Effect.sync((): ToolSession => {
    const next = table.session()
    return {
      tools,
      call: (c) =>
        Effect.suspend(() => {
          const args = canonicalJson(c.arguments)
          const { hit, occurrence } = next(`${c.name}\u0000${args}`)
          if (hit === undefined) {
            return Effect.fail(
              new ReplayMissError({
                tool: c.name,
                arguments: args,
                occurrence,
                message: `no recorded result for call #${occurrence + 1} of ${c.name}(${args})`
              })
            )
          }
          return Effect.succeed({ ...hit, id: c.id })
        })
    }
  })
  return ToolIo.of({ mode: "replay", session, recorded: Effect.succeed([]) })
}

export const layerReplay = (options: ReplayOptions): Layer.Layer<ToolIo> => Layer.succeed(ToolIo, makeReplay(options))

/** Every `turns[].toolCalls[]` record of an episodes file (JSONL of trajectory groups; a torn last line is skipped). */
export const readEpisodeRecords = Effect.fn("ToolIo.readEpisodeRecords")(function* (file: string) {
  const fs = yield* FileSystem.FileSystem
  const text = yield* fs
    .readFileString(file)
    .pipe(Effect.mapError((cause) => new ReplaySourceError({ file, message: cause.message })))
  const lines = text.split("\n").filter((l) => l.trim().length > 0)
  const records: Array<ToolCallRecord> = []
  for (const [i, line] of lines.entries()) {
    let group: unknown
    try {
      group = JSON.parse(line)
    } catch {
      if (i === lines.length - 1) break // a torn last line: the writer died mid-append
      return yield* new ReplaySourceError({ file, message: `line ${i + 1} is not JSON` })
    }
    const trajectories = (group as { trajectories?: ReadonlyArray<unknown> }).trajectories ?? []
    for (const t of trajectories) {
      for (const turn of (t as { turns?: ReadonlyArray<unknown> }).turns ?? []) {
        for (const call of (turn as { toolCalls?: ReadonlyArray<ToolCallRecord> }).toolCalls ?? []) records.push(call)
      }
    }
  }
  return records
})

export const layerReplayFile = (file: string): Layer.Layer<ToolIo, ReplaySourceError, FileSystem.FileSystem> =>
  Layer.effect(ToolIo, readEpisodeRecords(file).pipe(Effect.map((records) => makeReplay({ records }))))

/** The ToolIo an `environment` section asks for (`tool_io`, `replay_from`, `mcp_servers`). */
export const layerFromConfig = (
  env: EnvironmentConfig
): Layer.Layer<ToolIo, McpClient.McpConnectError | ReplaySourceError, FileSystem.FileSystem> => {
  if (env.tool_io === "replay") {
    if (env.replay_from === undefined) {
      return Layer.effect(
        ToolIo,
        Effect.fail(new ReplaySourceError({ file: "", message: "tool_io: replay needs environment.replay_from" }))
      )
    }
    return layerReplayFile(env.replay_from)
  }
  return (env.tool_io === "record" ? layerRecord : layerLive).pipe(Layer.provide(McpClient.layerFromConfig(env)))
}
