/**
 * The LLM judge a run's `environment.judge` asks for (rows with `reward_spec.method: judge`): a `ChatClient` on the
 * judge's endpoint, or, with `environment.tool_io: replay`, answering from the judge calls recorded in `replay_from`'s
 * groups with no endpoint, and the `GroupJudge` over it, which the Generator runs on every finished judge group.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect, Stream } from "effect"
import type { RunConfig } from "../config/RunConfig.ts"
import { ConfigError } from "../domain/Errors.ts"
import * as ChatClient from "../env/ChatClient.ts"
import * as GroupJudge from "../env/GroupJudge.ts"
import * as EpisodeLog from "../store/EpisodeLog.ts"

/** The judge, or undefined when the config sets none. */
export const fromConfig = (c: RunConfig): Effect.Effect<GroupJudge.GroupJudge | undefined, ConfigError> =>
  Effect.gen(function* () {
    const j = c.environment.judge
    if (j === undefined) return undefined
    const replay = c.environment.tool_io === "replay"
    const records =
      replay && c.environment.replay_from !== undefined
        ? GroupJudge.recordsOf(
            yield* EpisodeLog.read(c.environment.replay_from).pipe(
              Stream.runCollect,
              Effect.mapError(
                (e) => new ConfigError({ path: "environment.replay_from", message: `judge records: ${e.message}` })
              )
            )
          )
        : []
    const apiKey = yield* ChatClient.apiKey(j.api_key).pipe(
      Effect.mapError((e) => new ConfigError({ path: "environment.judge.api_key", message: e.message }))
    )
    const client = ChatClient.make({
      url: j.url,
      model: j.model,
      apiKey,
      temperature: j.temperature,
      maxTokens: j.max_tokens,
      seed: j.seed,
      maxConcurrency: j.max_concurrency,
      retries: j.http_retries,
      backoffMs: j.backoff_ms,
      timeoutMs: j.timeout_ms,
      prices: { prompt: j.prices.prompt_per_token, completion: j.prices.completion_per_token },
      mode: replay ? "replay" : "live",
      records
    })
    return yield* GroupJudge.make(client, j)
  }).pipe(Effect.provide(NodeServices.layer))
