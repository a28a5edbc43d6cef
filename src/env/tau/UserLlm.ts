/**
 * The simulated user's language model: chat completions over any OpenAI-compatible endpoint, and the record each
 * call leaves, so that an episode with an LLM user replays without the endpoint (as `ToolIo` does for tools).
 *
 * - `live`: POST `<url>/chat/completions` with `{model, messages, temperature}`; the reply is
 *   `choices[0].message.content`. Every call returns a `ToolCallRecord` (server `tau_user`, tool `chat`, arguments
 *   `{messages}`, result = the reply), which `TauEnv` puts in its step metadata, so the episode log keeps it.
 * - `record`: live, and every record of the run is also kept in `recorded`.
 * - `replay`: no endpoint; the n-th call with the same messages in one session gets the n-th recorded reply for
 *   those messages. A call with no such record fails (`UserLlmError`, reason `ReplayMiss`): replay never invents.
 * - `none`: for the scripted user; any call fails (reason `NotConfigured`).
 *
 * Transport failures are retried twice (the conversation is not stateful on the server side, so a retry is safe).
 */
import {
  Clock,
  Config,
  Context,
  Effect,
  type FileSystem,
  Layer,
  Option,
  Redacted,
  Schedule,
  Schema,
  type Scope
} from "effect"
import type { EnvironmentConfig } from "../../config/EnvironmentConfig.ts"
import type { ToolCallRecord } from "../../domain/ToolCall.ts"
import { canonicalJson, ReplaySourceError, readEpisodeRecords } from "../ToolIo.ts"

export const server = "tau_user"

export interface ChatMessage {
  readonly role: "system" | "user" | "assistant"
  readonly content: string
}

export class UserLlmError extends Schema.TaggedError<UserLlmError>()("UserLlmError", {
  reason: Schema.Literals(["Http", "BadResponse", "ReplayMiss", "NotConfigured"]),
  message: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {
  get isRetryable() {
    return this.reason === "Http"
  }
}

export interface Completion {
  readonly content: string
  readonly record: ToolCallRecord
}

/** The calls of one trajectory. */
export interface UserLlmSession {
  readonly complete: (messages: ReadonlyArray<ChatMessage>) => Effect.Effect<Completion, UserLlmError>
}

export class UserLlm extends Context.Service<
  UserLlm,
  {
    readonly mode: "live" | "record" | "replay" | "none"
    readonly session: Effect.Effect<UserLlmSession, never, Scope.Scope>
    /** Every record of the run so far (`record` mode). */
    readonly recorded: Effect.Effect<ReadonlyArray<ToolCallRecord>>
  }
>()("rl/env/tau/UserLlm") {}

export interface HttpOptions {
  /** Base URL of the API, e.g. `http://localhost:8000/v1`. */
  readonly url: string
  readonly model: string
  readonly apiKey?: Redacted.Redacted<string>
  readonly temperature?: number
  readonly timeoutMs?: number
}

const post = (options: HttpOptions, messages: ReadonlyArray<ChatMessage>) =>
  Effect.tryPromise({
    try: async (signal) => {
      const response = await fetch(`${options.url.replace(/\/+$/, "")}/chat/completions`, {
        method: "POST",
        signal: AbortSignal.any([signal, AbortSignal.timeout(options.timeoutMs ?? 120_000)]),
        headers: {
          "content-type": "application/json",
          ...(options.apiKey === undefined ? {} : { authorization: `Bearer ${Redacted.value(options.apiKey)}` })
        },
        body: JSON.stringify({ model: options.model, messages, temperature: options.temperature ?? 0 })
      })
      const text = await response.text()
      return { status: response.status, text }
    },
    catch: (cause) => new UserLlmError({ reason: "Http", message: `user LLM request failed: ${cause}`, cause })
  }).pipe(
    Effect.flatMap(({ status, text }) => {
      if (status >= 500 || status === 429) {
        return Effect.fail(
          new UserLlmError({ reason: "Http", message: `user LLM: HTTP ${status}: ${text.slice(0, 200)}` })
        )
      }
      if (status >= 400) {
        return Effect.fail(
          new UserLlmError({ reason: "BadResponse", message: `user LLM: HTTP ${status}: ${text.slice(0, 200)}` })
        )
      }
      try {
        const body = JSON.parse(text) as { choices?: ReadonlyArray<{ message?: { content?: unknown } }> }
        const content = body.choices?.[0]?.message?.content
        if (typeof content === "string") return Effect.succeed(content)
      } catch {
        // fall through
      }
      return Effect.fail(
        new UserLlmError({
          reason: "BadResponse",
          message: `user LLM: no choices[0].message.content in ${text.slice(0, 200)}`
        })
      )
    }),
    Effect.retry({ schedule: Schedule.exponential("200 millis"), times: 2, while: (e) => e.isRetryable })
  )

const liveSession = (options: HttpOptions, keep: ((r: ToolCallRecord) => void) | undefined) =>
  Effect.sync((): UserLlmSession => {
    let n = 0
    return {
      complete: (messages) =>
        Effect.gen(function* () {
          const start = yield* Clock.currentTimeMillis
          const content = yield* post(options, messages)
          const record: ToolCallRecord = {
            id: `user_${n++}`,
            server,
            tool: "chat",
            arguments: { messages },
            result: content,
            isError: false,
            ms: (yield* Clock.currentTimeMillis) - start
          }
          keep?.(record)
          return { content, record }
        })
    }
  })

/** Live calls to the endpoint. */
export const layerHttp = (options: HttpOptions): Layer.Layer<UserLlm> =>
  Layer.succeed(
    UserLlm,
    UserLlm.of({ mode: "live", session: liveSession(options, undefined), recorded: Effect.succeed([]) })
  )

/** Live calls, every record also kept in `recorded`. */
export const makeRecord = (options: HttpOptions): UserLlm["Service"] => {
  const records: Array<ToolCallRecord> = []
  return UserLlm.of({
    mode: "record",
    session: liveSession(options, (r) => void records.push(r)),
    recorded: Effect.sync(() => [...records])
  })
}

export const layerRecord = (options: HttpOptions): Layer.Layer<UserLlm> =>
  Layer.sync(UserLlm, () => makeRecord(options))

const keyOf = (messages: unknown): string => canonicalJson(messages)

/** Serves recorded replies (records of other servers are ignored); calls no endpoint. */
export const makeReplay = (records: ReadonlyArray<ToolCallRecord>): UserLlm["Service"] => {
  const table = new Map<string, Array<ToolCallRecord>>()
  for (const r of records) {
    if (r.server !== server) continue
    const key = keyOf((r.arguments as { messages?: unknown } | null)?.messages)
    const list = table.get(key)
    if (list === undefined) table.set(key, [r])
    else list.push(r)
  }
  const session = Effect.sync((): UserLlmSession => {
    const seen = new Map<string, number>()
    return {
      complete: (messages) =>
        Effect.suspend(() => {
          const key = keyOf(messages)
          const occurrence = seen.get(key) ?? 0
          seen.set(key, occurrence + 1)
          const hit = table.get(key)?.[occurrence]
          if (hit === undefined) {
            return Effect.fail(
              new UserLlmError({
                reason: "ReplayMiss",
                message: `no recorded user reply for call #${occurrence + 1} with these ${messages.length} messages`
              })
            )
          }
          return Effect.succeed({ content: hit.result, record: hit })
        })
    }
  })
  return UserLlm.of({ mode: "replay", session, recorded: Effect.succeed([]) })
}

export const layerReplay = (records: ReadonlyArray<ToolCallRecord>): Layer.Layer<UserLlm> =>
  Layer.succeed(UserLlm, makeReplay(records))

/** For the scripted user: any call fails. */
export const layerNone: Layer.Layer<UserLlm> = Layer.succeed(
  UserLlm,
  UserLlm.of({
    mode: "none",
    session: Effect.succeed({
      complete: () =>
        Effect.fail(
          new UserLlmError({
            reason: "NotConfigured",
            message: "this tau env has no user LLM: set environment.tau.user_llm (url, model) for LLM user strategies"
          })
        )
    }),
    recorded: Effect.succeed([])
  })
)

/** Reads an API key named by a config `{ env: NAME }` reference through Effect's Config (environment by default). */
export const apiKey = (
  ref: { readonly env: string } | undefined
): Effect.Effect<Option.Option<Redacted.Redacted<string>>, Config.ConfigError> =>
  ref === undefined ? Effect.succeed(Option.none()) : Config.option(Config.Redacted(ref.env))

/**
 * The user LLM an `environment` section asks for: none for the scripted user; else recorded replies from
 * `replay_from` when `tool_io` is `replay`, live calls (kept, with `record`) otherwise.
 */
export const layerFromConfig = (
  env: EnvironmentConfig
): Layer.Layer<UserLlm, ReplaySourceError | Config.ConfigError, FileSystem.FileSystem> => {
  const tau = env.tau
  if (tau === undefined || tau.user === "scripted") return layerNone
  if (env.tool_io === "replay") {
    if (env.replay_from === undefined) {
      return Layer.effect(
        UserLlm,
        Effect.fail(new ReplaySourceError({ file: "", message: "tool_io: replay needs environment.replay_from" }))
      )
    }
    return Layer.effect(UserLlm, Effect.map(readEpisodeRecords(env.replay_from), makeReplay))
  }
  const llm = tau.user_llm
  if (llm === undefined) {
    return Layer.effect(UserLlm, Effect.die(new Error(`tau user "${tau.user}" needs environment.tau.user_llm`)))
  }
  return Layer.effect(
    UserLlm,
    Effect.map(apiKey(llm.api_key), (key) => {
      const options: HttpOptions = {
        url: llm.url,
        model: llm.model,
        temperature: llm.temperature,
        timeoutMs: llm.timeout_ms,
        ...(Option.isSome(key) ? { apiKey: key.value } : {})
      }
      return env.tool_io === "record"
        ? makeRecord(options)
        : UserLlm.of({ mode: "live", session: liveSession(options, undefined), recorded: Effect.succeed([]) })
    })
  )
}
