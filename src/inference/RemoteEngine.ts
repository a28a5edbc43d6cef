/**
 * The inference engine over HTTP: one or more OpenAI-compatible `/v1/completions` servers ("replicas": our `serve`,
 * vLLM or SGLang), token ids in, token ids + behaviour log-probs out, never re-tokenised.
 *
 * Each GenerateRequest is one completions call (the server batches concurrent calls itself), for the model given or
 * else the first one `/v1/models` lists, sent as vLLM expects:
 *   `prompt: number[]`, `max_tokens`, `temperature`, `top_p`, `top_k` (-1 = off), `seed`, `stop`, `stop_token_ids`,
 *   `ignore_eos: true` (only the request's own stop ids end it), `logprobs: 0` (the sampled token's log-prob),
 *   `return_token_ids: true` (vLLM ≥ 0.10.2: `choices[i].token_ids`), `return_tokens_as_token_ids: true` (older vLLM:
 *   `logprobs.tokens` read `token_id:<id>`, the fallback), `include_stop_str_in_output`, `skip_special_tokens: false`.
 * The response's `token_ids` (else the ids in `logprobs.tokens`) and `logprobs.token_logprobs` become the result.
 * Behaviour log-probs from vLLM are comparable to the trainer's only when vLLM runs with
 * `--logprobs-mode processed_logprobs` (its default is raw logits' log-softmax, before temperature).
 *
 * Versions: our server reports `policy_version_first/last` per choice; for servers that do not (vLLM, SGLang) both are
 * the version this engine knows at the start and end of the call. A choice that comes back `finish_reason: "abort"` (a
 * server paused with mode abort while the trainer syncs weights) is resumed as SkyRL does: the request is sent
 * again with the tokens so far appended to the prompt and the remaining budget, and the parts are joined.
 *
 * Replicas (`urls`): a request naming a trajectory (`trajectoryId`) goes to the replica that trajectory's earlier
 * turns went to (sticky, so the server's prefix cache holds its context); a new trajectory goes to the replica with
 * the fewest calls in flight. A replica whose call fails for good (no connection, no answer in `timeout`, 429/503 after
 * `maxRetries` retries) is taken out, and the call — with the tokens it has so far — goes on at another replica: the
 * result lists each move in `retries` (the replica and the reason), which the agent loop records on the turn. Replicas
 * taken out are probed (`GET /health` every `healthInterval`); one that answers is brought to the current weights
 * and version, checked, and let back in. With no replica in, calls wait for one (up to `timeout`).
 *
 * Weights (`dialect`, inference/WeightDialect.ts has the wire): a version's full tensors reach every replica in, all
 * paused, before any resumes, and each replica's served version is then read back and checked (a replica that
 * disagrees is taken out):
 * - `effect-rl` with a `weightToken`: uploaded to each replica's `/v1/weights` (WeightUpload.ts; the newest snapshot is
 *   kept in memory to bring a returning replica up to date);
 * - `vllm` / `sglang`: written once as a HF directory `<weightsDir>/v<version>` (HfWeightDir.ts; the servers must read
 *   the same path), then each replica is paused (`pauseMode`), told to reload from it, its cache reset, resumed.
 * A tensor-less snapshot only advances the version (the weights went another way: HttpWeightSync, `serve --watch`).
 * A snapshot with tensors and no way to send them fails (it used to advance the version only, leaving the server on
 * the step-0 weights forever). `pause`/`resume` hold new calls on the client side.
 *
 * LoRA (`lora`): a snapshot carrying an adapter is written as a PEFT directory `<lora.dir>/v<version, 6 digits>`
 * (which the servers must be able to read), loaded on every replica with vLLM's runtime LoRA API (`POST
 * /v1/load_lora_adapter {lora_name: "<prefix>-v<version>", lora_path}`; our `serve --enable-lora` or vLLM with
 * `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), and calls from then on name it as their `model`;
 * calls in flight keep the adapter they started with. Then every adapter but the newest `lora.keep` is unloaded
 * (`/v1/unload_lora_adapter`) and its directory deleted. A call's policy versions are its adapter's version: exact,
 * since that adapter sampled every token of it. Re-publishing a version loads it again in place (`load_inplace`).
 *
 * Chat (`chat`, the agent loop's `generator.engine.chat` path): one turn is one `/v1/chat/completions` call with
 * `messages`, `tools` + `tool_choice: "auto"` (vLLM started with `--enable-auto-tool-choice --tool-call-parser hermes`
 * reads the calls), the same sampling fields as above, `logprobs: true`, `top_logprobs: 0`, `return_token_ids: true`
 * and `return_tokens_as_token_ids: true`. The result is the response's top-level `prompt_token_ids` (the prompt the
 * server rendered), `choices[0].token_ids`, `choices[0].logprobs.content[i].logprob` and `choices[0].message`
 * (`content`, `tool_calls`); `finish_reason: "tool_calls"` is a stop. Pinned from vLLM's source, where these fields
 * are `ChatCompletionRequest.return_token_ids`, `ChatCompletionResponse.prompt_token_ids` and
 * `ChatCompletionResponseChoice.token_ids` (vLLM ≥ 0.10.2): vllm/entrypoints/openai/chat_completion/protocol.py at
 * https://github.com/vllm-project/vllm/blob/002032ee2b18e1f7bd924ec47b62504ba3866063/vllm/entrypoints/openai/chat_completion/protocol.py
 * (`ChatCompletionLogProbs.content` of `{token, logprob, bytes, top_logprobs}`). A chat turn cannot be continued from
 * part of its tokens (the server renders the prompt), so an aborted or failed-over turn is sampled again from its start.
 *
 * Failures: no connection, timeouts, 429/503 are `InferenceError` Unreachable/Overloaded (retryable, retried with
 * backoff `maxRetries` times); other statuses and malformed bodies are BadResponse (4xx) or Internal (5xx).
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Clock, Duration, Effect, Latch, Layer, Schedule, Semaphore } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest } from "effect/http"
import { InferenceError } from "../domain/Errors.ts"
import type { ToolCallWire } from "../domain/Message.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { FinishReason } from "../domain/Trajectory.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as Lora from "../model/Lora.ts"
import * as HfWeightDir from "./HfWeightDir.ts"
import {
  type ChatRequest,
  type ChatResult,
  type GenerateRequest,
  type GenerateResult,
  InferenceEngine
} from "./InferenceEngine.ts"
import * as WeightDialect from "./WeightDialect.ts"
import * as WeightUpload from "./WeightUpload.ts"

export interface RemoteEngineOptions {
  /** Base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted). */
  readonly url?: string
  /** Several replicas' base URLs (with or instead of `url`). */
  readonly urls?: ReadonlyArray<string>
  /** The `model` sent with each request (vLLM checks it against its served model name); default: the first of
   * the server's `/v1/models`. */
  readonly model?: string
  /** Sent as `Authorization: Bearer` on completions and control routes (vLLM `--api-key`). */
  readonly apiKey?: string
  /** How full weights reach the servers (see the module header); default effect-rl. */
  readonly dialect?: WeightDialect.Dialect
  /** effect-rl: the servers' weight token; `updateWeights` uploads snapshots to `/v1/weights`. */
  readonly weightToken?: string
  readonly chunkBytes?: number
  /** vllm / sglang: where each version's HF directory is written (a path the servers read as it is). */
  readonly weightsDir?: string
  /** vllm / sglang: the model's HF config.json, written beside the weights. */
  readonly hfConfig?: Readonly<Record<string, unknown>>
  /** vllm / sglang: how the servers hold generation while weights change (pipeline.pause_mode); default keep. */
  readonly pauseMode?: WeightDialect.PauseMode
  /** Retries of a retryable failure; default 3. */
  readonly maxRetries?: number
  /** Per completions call; default 10 minutes. */
  readonly timeout?: Duration.Input
  /** How often replicas taken out are probed; default 2 seconds. */
  readonly healthInterval?: Duration.Input
  readonly initialVersion?: PolicyVersion.PolicyVersion
  /** Continuations of an aborted choice before giving up (Overloaded); default 8. */
  readonly maxResumes?: number
  /** Sync LoRA adapters through the server's runtime LoRA API (see the module header). */
  readonly lora?: {
    /** Where adapter versions are written; the server reads them from the same path. */
    readonly dir: string
    /** Adapters kept loaded (≥ 1): the newest `keep` versions. */
    readonly keep: number
    /** Adapters are named `<prefix>-v<version>`; default "policy". */
    readonly prefix?: string
  }
  /** Called after each sync with the bytes written (or sent) and its wall time. */
  readonly onSynced?: (timing: { readonly version: number; readonly bytes: number; readonly seconds: number }) => void
}

const engineName = "remote"

const error = (reason: InferenceError["reason"], message: string) =>
  new InferenceError({ engine: engineName, reason, message })

const statusError = (status: number, body: string) =>
  error(
    status === 429 || status === 503 ? "Overloaded" : status >= 500 ? "Internal" : "BadResponse",
    `HTTP ${status}: ${body.slice(0, 500)}`
  )

interface Choice {
  readonly tokens: ReadonlyArray<number>
  readonly logprobs: ReadonlyArray<number>
  readonly finishReason: FinishReason | "abort"
  readonly versionFirst: number | undefined
  readonly versionLast: number | undefined
}

/** Reads choice 0 of a completions response (vLLM or ours). */
export const readChoice = (body: unknown): Choice | string => {
  const choice = (body as { choices?: ReadonlyArray<Record<string, unknown>> } | null)?.choices?.[0]
  if (choice === undefined) return "no choices in the response"
  const lp = choice["logprobs"] as { tokens?: ReadonlyArray<string>; token_logprobs?: ReadonlyArray<number> } | null
  let tokens = choice["token_ids"] as ReadonlyArray<number> | undefined
  if (!Array.isArray(tokens)) {
    const named = lp?.tokens
    if (!Array.isArray(named) || named.some((t) => !/^token_id:\d+$/.test(t))) {
      return "the response has neither token_ids nor token_id:<id> logprob tokens (vLLM return_token_ids)"
    }
    tokens = named.map((t) => Number(t.slice("token_id:".length)))
  }
  const logprobs = lp?.token_logprobs
  if (!Array.isArray(logprobs) || logprobs.length !== tokens.length || logprobs.some((v) => typeof v !== "number")) {
    return `the response has ${Array.isArray(logprobs) ? logprobs.length : "no"} log-probs for ${tokens.length} tokens`
  }
  const finish = choice["finish_reason"]
  if (finish !== "stop" && finish !== "length" && finish !== "abort") return `unknown finish_reason ${String(finish)}`
  const int = (v: unknown) => (Number.isInteger(v) ? (v as number) : undefined)
  return {
    tokens,
    logprobs,
    finishReason: finish,
    versionFirst: int(choice["policy_version_first"]),
    versionLast: int(choice["policy_version_last"])
  }
}

interface ChatChoice extends Choice {
  readonly promptIds: ReadonlyArray<number>
  readonly content: string | null
  readonly toolCalls: ReadonlyArray<ToolCallWire>
}

/** Reads choice 0 of a chat completions response (vLLM ≥ 0.10.2 with `return_token_ids`, or ours). */
export const readChatChoice = (body: unknown): ChatChoice | string => {
  const promptIds = (body as { prompt_token_ids?: unknown } | null)?.prompt_token_ids
  if (!Array.isArray(promptIds) || !promptIds.every(Number.isInteger)) {
    return "the chat response has no prompt_token_ids (vLLM ≥ 0.10.2 with return_token_ids)"
  }
  const choice = (body as { choices?: ReadonlyArray<Record<string, unknown>> } | null)?.choices?.[0]
  if (choice === undefined) return "no choices in the response"
  const tokens = choice["token_ids"]
  if (!Array.isArray(tokens) || !tokens.every(Number.isInteger)) {
    return "the chat response has no choices[0].token_ids (vLLM ≥ 0.10.2 with return_token_ids)"
  }
  const content = (choice["logprobs"] as { content?: ReadonlyArray<{ logprob?: unknown }> } | null)?.content
  const logprobs = Array.isArray(content) ? content.map((c) => c.logprob) : undefined
  if (logprobs === undefined || logprobs.length !== tokens.length || logprobs.some((v) => typeof v !== "number")) {
    return `the chat response has ${logprobs === undefined ? "no" : logprobs.length} log-probs for ${tokens.length} tokens`
  }
  const finish = choice["finish_reason"]
  if (finish !== "stop" && finish !== "length" && finish !== "abort" && finish !== "tool_calls") {
    return `unknown finish_reason ${String(finish)}`
  }
  const message = (choice["message"] ?? {}) as { content?: unknown; tool_calls?: unknown }
  const calls = Array.isArray(message.tool_calls) ? (message.tool_calls as ReadonlyArray<ToolCallWire>) : []
  if (calls.some((c) => typeof c?.function?.name !== "string" || typeof c.function.arguments !== "string")) {
    return "a tool call in the chat response has no function name or arguments"
  }
  const int = (v: unknown) => (Number.isInteger(v) ? (v as number) : undefined)
  return {
    promptIds: promptIds as ReadonlyArray<number>,
    tokens: tokens as ReadonlyArray<number>,
    logprobs: logprobs as ReadonlyArray<number>,
    finishReason: finish === "tool_calls" ? "stop" : finish,
    content: typeof message.content === "string" ? message.content : null,
    toolCalls: calls.map((c, i) => ({
      id: typeof c.id === "string" && c.id !== "" ? c.id : `call_${i}`,
      type: "function",
      function: { name: c.function.name, arguments: c.function.arguments }
    })),
    versionFirst: int(choice["policy_version_first"]),
    versionLast: int(choice["policy_version_last"])
  }
}

/** The sampling fields both request bodies send, in vLLM's names (only the request's own stop ids end it). */
const samplingFields = (s: GenerateRequest["sampling"]) => ({
  max_tokens: s.maxNewTokens,
  temperature: s.temperature,
  top_p: s.topP,
  top_k: s.topK === 0 ? -1 : s.topK,
  seed: s.seed,
  stop: [...s.stopStrings],
  stop_token_ids: [...s.stopTokenIds],
  ignore_eos: true
})

/** The chat completions body for one turn (see the module header). */
export const chatBody = (model: string, request: ChatRequest) => {
  const s = request.sampling
  const tools = request.tools ?? []
  return {
    model,
    messages: request.messages.map((m) => ({
      role: m.role,
      content: m.content,
      ...(m.tool_calls === undefined || m.tool_calls.length === 0 ? {} : { tool_calls: m.tool_calls }),
      ...(m.tool_call_id === undefined ? {} : { tool_call_id: m.tool_call_id }),
      ...(m.name === undefined ? {} : { name: m.name })
    })),
    ...(tools.length === 0 ? {} : { tools, tool_choice: "auto" }),
    ...samplingFields(s),
    logprobs: true,
    top_logprobs: 0,
    return_token_ids: true,
    return_tokens_as_token_ids: true,
    include_stop_str_in_output: true,
    n: 1
  }
}

/** The completions body for one request (see the module header). */
export const requestBody = (model: string, request: GenerateRequest) => {
  const s = request.sampling
  return {
    model,
    prompt: [...request.promptIds],
    ...samplingFields(s),
    logprobs: 0,
    return_token_ids: true,
    return_tokens_as_token_ids: true,
    include_stop_str_in_output: true,
    skip_special_tokens: false,
    n: 1
  }
}

/** The first model a server lists at `/v1/models`. */
const servedModel = (client: HttpClient.HttpClient, base: string, apiKey: string | undefined) =>
  Effect.gen(function* () {
    const request = HttpClientRequest.get(`${base}/v1/models`).pipe(
      apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(apiKey)
    )
    const response = yield* client.execute(request)
    const body = (yield* response.json) as { data?: ReadonlyArray<{ id?: unknown }> } | null
    const id = body?.data?.[0]?.id
    if (response.status !== 200 || typeof id !== "string") {
      return yield* error("BadResponse", `${base}/v1/models lists no model (HTTP ${response.status})`)
    }
    return id
  }).pipe(
    Effect.catchTag("HttpClientError", (e) => Effect.fail(error("Unreachable", `${base}: ${e.message}`))),
    Effect.retry({ times: 3, schedule: Schedule.exponential("200 millis"), while: (e) => e.isRetryable })
  )

/** One server of the engine, and what the engine knows of it. */
interface Replica {
  readonly index: number
  readonly target: WeightDialect.Target
  /** Taken in: calls are routed to it. */
  up: boolean
  /** Why it was taken out, while out. */
  reason: string | undefined
  /** Calls in flight to it. */
  inFlight: number
  /** The newest version sent to it (full weights or adapter). */
  version: number
}

/** Sticky routes kept: trajectories finish and are never named again; the oldest entries go first. */
const maxStickyRoutes = 16_384

export const make = Effect.fnUntraced(function* (options: RemoteEngineOptions) {
  const client = yield* HttpClient.HttpClient
  const urls = [...(options.url === undefined ? [] : [options.url]), ...(options.urls ?? [])].map(WeightUpload.baseUrl)
  if (urls.length === 0) return yield* error("BadResponse", "RemoteEngine needs a url")
  const dialect = options.dialect ?? "effect-rl"
  const timeout = Duration.fromInputUnsafe(options.timeout ?? Duration.minutes(10))
  const healthInterval = Duration.fromInputUnsafe(options.healthInterval ?? Duration.seconds(2))
  const maxResumes = options.maxResumes ?? 8
  const withClient = Effect.provideService(HttpClient.HttpClient, client)
  let version: PolicyVersion.PolicyVersion = options.initialVersion ?? PolicyVersion.initial
  const replicas: Array<Replica> = [...new Set(urls)].map((base, index) => ({
    index,
    target: { base, apiKey: options.apiKey },
    up: true,
    reason: undefined,
    inFlight: 0,
    version
  }))
  const notPaused = yield* Latch.make(true)
  /** One weight change at a time: a version's update, or a replica brought back to the current one. */
  const syncing = yield* Semaphore.make(1)
  /** The newest full weights sent, to bring a returning replica up to date: a HF directory, or (effect-rl) tensors. */
  let currentWeights: { readonly dir: string } | { readonly snapshot: WeightSnapshot.WeightSnapshot } | undefined
  const sticky = new Map<string, Replica>()
  const baseModel = options.model ?? (yield* servedModel(client, replicas[0]!.target.base, options.apiKey))
  /** The model new calls name: the base, or the newest adapter loaded. */
  let model = baseModel
  /** The adapters loaded by this engine, oldest first. */
  const adapters: Array<{
    readonly name: string
    readonly version: PolicyVersion.PolicyVersion
    readonly dir: string
  }> = []
  const retry = <A>(effect: Effect.Effect<A, InferenceError>) =>
    effect.pipe(
      Effect.retry({
        times: options.maxRetries ?? 3,
        schedule: Schedule.exponential("200 millis"),
        while: (e) => e.isRetryable
      })
    )

  const takeOut = (replica: Replica, reason: string) =>
    Effect.suspend(() => {
      if (!replica.up) return Effect.void
      replica.up = false
      replica.reason = reason
      return Effect.logWarning(`replica ${replica.target.base} taken out: ${reason}`)
    })

  /** The replica for a call: the trajectory's own while it is in, else the least loaded in; waits while none is. */
  const route = (trajectoryId: string | undefined) =>
    Effect.gen(function* () {
      const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(timeout)
      for (;;) {
        const own = trajectoryId === undefined ? undefined : sticky.get(trajectoryId)
        if (own?.up === true) return { replica: own, moved: undefined }
        const candidates = replicas.filter((r) => r.up)
        if (candidates.length > 0) {
          const replica = candidates.reduce((best, r) => (r.inFlight < best.inFlight ? r : best))
          if (trajectoryId !== undefined) {
            sticky.delete(trajectoryId)
            sticky.set(trajectoryId, replica)
            if (sticky.size > maxStickyRoutes) sticky.delete(sticky.keys().next().value!)
          }
          const moved = own === undefined ? undefined : `replica ${own.target.base} out: ${own.reason ?? "down"}`
          return { replica, moved }
        }
        if ((yield* Clock.currentTimeMillis) > deadline) {
          return yield* error("Unreachable", `no replica in for ${Duration.format(timeout)}: ${outReasons()}`)
        }
        yield* Effect.sleep("100 millis")
      }
    })

  const outReasons = () =>
    replicas
      .filter((r) => !r.up)
      .map((r) => `${r.target.base} (${r.reason ?? "down"})`)
      .join(", ")

  /** POST `body` to `route` on `replica` and read the answer with `read`, retried while the failure is retryable. */
  const call = <A>(replica: Replica, route: string, body: unknown, read: (body: unknown) => A | string) =>
    Effect.gen(function* () {
      const base = replica.target.base
      const http = HttpClientRequest.post(`${base}${route}`).pipe(
        options.apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(options.apiKey),
        HttpClientRequest.bodyJsonUnsafe(body)
      )
      const response = yield* client
        .execute(http)
        .pipe(Effect.mapError((e) => error("Unreachable", `${base}: ${e.message}`)))
      const text = yield* response.text.pipe(Effect.mapError((e) => error("Unreachable", `${base}: ${e.message}`)))
      if (response.status !== 200) return yield* statusError(response.status, text)
      const parsed = yield* Effect.try({
        try: () => JSON.parse(text) as unknown,
        catch: () => error("BadResponse", `the response is not JSON: ${text.slice(0, 200)}`)
      })
      const value = read(parsed)
      if (typeof value === "string") return yield* error("BadResponse", value)
      return value
    }).pipe(
      Effect.timeoutOrElse({
        duration: timeout,
        orElse: () =>
          Effect.fail(error("Unreachable", `${replica.target.base}: no answer in ${Duration.format(timeout)}`))
      }),
      retry
    )

  /** One completions call for `name` on `replica`. */
  const complete = (replica: Replica, name: string, request: GenerateRequest) =>
    call(replica, "/v1/completions", requestBody(name, request), readChoice)

  /**
   * `f` on the replica of `trajectoryId`; a replica that cannot answer is taken out and `f` runs again at another,
   * each move pushed onto `retries`. Other failures are the call's.
   */
  const onReplica = <A>(
    trajectoryId: string | undefined,
    retries: Array<string>,
    f: (replica: Replica) => Effect.Effect<A, InferenceError>
  ) =>
    Effect.gen(function* () {
      for (;;) {
        yield* notPaused.await
        const { replica, moved } = yield* route(trajectoryId)
        if (moved !== undefined) retries.push(moved)
        replica.inFlight++
        const outcome = yield* f(replica).pipe(
          Effect.ensuring(Effect.sync(() => replica.inFlight--)),
          Effect.map((value) => ({ ok: true as const, value })),
          // a replica that cannot answer is taken out and the call goes on elsewhere; other failures are the call's
          Effect.catchIf(
            (e) => e.isRetryable && replicas.length > 1,
            (e) => Effect.succeed({ ok: false as const, failed: e.message })
          )
        )
        if (outcome.ok) return outcome.value
        yield* takeOut(replica, outcome.failed)
        retries.push(`replica ${replica.target.base} failed: ${outcome.failed}`)
        if (trajectoryId !== undefined) sticky.delete(trajectoryId) // the move is recorded here
        if (retries.length > 4 * replicas.length) {
          return yield* error("Unreachable", `moved ${retries.length} times: ${retries.join("; ")}`)
        }
      }
    })

  /** One request, resumed after aborts and failovers, all on the model named when it started. */
  const generateOne = (request: GenerateRequest) =>
    Effect.gen(function* () {
      const name = model
      const adapterVersion = adapters.find((a) => a.name === name)?.version
      const startVersion = version
      const tokens: Array<number> = []
      const logprobs: Array<number> = []
      const retries: Array<string> = []
      let first: number | undefined
      let last: number | undefined
      let aborts = 0
      for (;;) {
        const remaining = request.sampling.maxNewTokens - tokens.length
        const choice = yield* onReplica(request.trajectoryId, retries, (replica) =>
          complete(replica, name, {
            promptIds: request.promptIds.concat(tokens),
            sampling: { ...request.sampling, maxNewTokens: remaining }
          })
        )
        if (tokens.length === 0 || first === undefined) first = choice.versionFirst
        // a loop, not push(...): a server's answer may be long enough to overflow the stack as call arguments
        for (const t of choice.tokens) tokens.push(t)
        for (const l of choice.logprobs) logprobs.push(l)
        last = choice.versionLast ?? last
        const finished = choice.finishReason !== "abort" ? choice.finishReason : undefined
        if (finished !== undefined || tokens.length >= request.sampling.maxNewTokens) {
          return {
            tokens,
            logprobs,
            finishReason: finished ?? "length",
            policyVersionFirst: adapterVersion ?? PolicyVersion.make(first ?? startVersion),
            policyVersionLast: adapterVersion ?? PolicyVersion.make(last ?? version),
            ...(retries.length === 0 ? {} : { retries })
          } satisfies GenerateResult
        }
        if (aborts++ >= maxResumes) return yield* error("Overloaded", `aborted ${aborts} times by the server`)
      }
    })

  /** One chat turn: sampled again from its start after an abort or a failover (see the module header). */
  const chat = Effect.fn("RemoteEngine.chat")(function* (request: ChatRequest) {
    if (request.messages.length === 0) return yield* error("BadResponse", "a chat request needs messages")
    const name = model
    const adapterVersion = adapters.find((a) => a.name === name)?.version
    const startVersion = version
    const retries: Array<string> = []
    for (let aborts = 0; ; aborts++) {
      const choice = yield* onReplica(request.trajectoryId, retries, (replica) =>
        call(replica, "/v1/chat/completions", chatBody(name, request), readChatChoice)
      )
      if (choice.finishReason !== "abort") {
        return {
          promptIds: choice.promptIds,
          tokens: choice.tokens,
          logprobs: choice.logprobs,
          finishReason: choice.finishReason,
          content: choice.content,
          toolCalls: choice.toolCalls,
          policyVersionFirst: adapterVersion ?? PolicyVersion.make(choice.versionFirst ?? startVersion),
          policyVersionLast: adapterVersion ?? PolicyVersion.make(choice.versionLast ?? version),
          ...(retries.length === 0 ? {} : { retries })
        } satisfies ChatResult
      }
      if (aborts >= maxResumes) return yield* error("Overloaded", `aborted ${aborts + 1} times by the server`)
    }
  })

  const generate = Effect.fn("RemoteEngine.generate")(function* (requests: ReadonlyArray<GenerateRequest>) {
    const empty = requests.findIndex((r) => r.promptIds.length === 0)
    if (empty >= 0) return yield* error("BadResponse", `request ${empty} has an empty prompt`)
    return yield* Effect.forEach(requests, generateOne, { concurrency: "unbounded" })
  })

  /** POST a JSON body to one of a replica's LoRA routes; the status and the body's text. */
  const postLora = (replica: Replica, route: string, body: unknown) =>
    retry(
      Effect.gen(function* () {
        const base = replica.target.base
        const http = HttpClientRequest.post(`${base}${route}`).pipe(
          options.apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(options.apiKey),
          HttpClientRequest.bodyJsonUnsafe(body)
        )
        const response = yield* client.execute(http)
        const text = yield* response.text
        if (response.status === 429 || response.status >= 500) return yield* statusError(response.status, text)
        return { status: response.status, text }
      }).pipe(
        Effect.catchTag("HttpClientError", (e) =>
          Effect.fail(error("Unreachable", `${replica.target.base}${route}: ${e.message}`))
        )
      )
    )

  /** Load adapter `name` from `dir` on one replica (in place when `republished`, or when it kept the name). */
  const loadAdapter = (replica: Replica, name: string, dir: string, republished: boolean) =>
    Effect.gen(function* () {
      const load = (inplace: boolean) =>
        postLora(replica, "/v1/load_lora_adapter", {
          lora_name: name,
          lora_path: dir,
          ...(inplace ? { load_inplace: true } : {})
        })
      let loaded = yield* load(republished)
      // a server that kept this name from an earlier run (or from before it was taken out): replace it
      if (loaded.status === 400 && !republished && loaded.text.includes("has already been loaded"))
        loaded = yield* load(true)
      if (loaded.status !== 200) {
        return yield* error(
          "BadResponse",
          `loading adapter ${name}: ${statusError(loaded.status, loaded.text).message}`
        )
      }
    })

  /** Load the snapshot's adapter as `<prefix>-v<version>` everywhere, name it in new calls, keep the newest `keep`. */
  const syncAdapter = (
    lora: NonNullable<RemoteEngineOptions["lora"]>,
    snapshot: WeightSnapshot.WeightSnapshot & {
      readonly adapter: NonNullable<WeightSnapshot.WeightSnapshot["adapter"]>
    }
  ) =>
    Effect.gen(function* () {
      const startedAt = yield* Clock.currentTimeMillis
      const name = `${lora.prefix ?? "policy"}-v${snapshot.version}`
      const dir = path.resolve(lora.dir, `v${String(snapshot.version).padStart(6, "0")}`)
      const bytes = yield* Effect.tryPromise({
        try: () => Lora.writeDir(dir, snapshot.adapter),
        catch: (cause) =>
          error("Internal", `cannot write adapter v${snapshot.version} to ${dir}: ${(cause as Error).message}`)
      })
      const republished = adapters.some((a) => a.name === name)
      yield* onEveryReplica((replica) => loadAdapter(replica, name, dir, republished))
      model = name
      if (!republished) adapters.push({ name, version: snapshot.version, dir })
      while (adapters.length > Math.max(1, lora.keep)) {
        const old = adapters.shift()!
        yield* onEveryReplica((replica) =>
          Effect.gen(function* () {
            const unloaded = yield* postLora(replica, "/v1/unload_lora_adapter", { lora_name: old.name })
            // 404: the server no longer has it (restarted), which is what unloading wants
            if (unloaded.status !== 200 && unloaded.status !== 404) {
              return yield* error(
                "BadResponse",
                `unloading adapter ${old.name}: ${statusError(unloaded.status, unloaded.text).message}`
              )
            }
          })
        )
        yield* Effect.promise(() => fs.rm(old.dir, { recursive: true, force: true }))
      }
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      options.onSynced?.({ version: snapshot.version, bytes, seconds })
    })

  /**
   * Run `f` on every replica in, in parallel. With one replica its failure is the caller's; with several, a replica
   * that fails for good is taken out (it is brought up to date when it returns) unless none is left.
   */
  const onEveryReplica = (f: (replica: Replica) => Effect.Effect<void, InferenceError>) =>
    Effect.gen(function* () {
      const inNow = replicas.filter((r) => r.up)
      if (replicas.length === 1) return yield* f(replicas[0]!)
      const failures = yield* Effect.forEach(
        inNow,
        (replica) =>
          f(replica).pipe(
            Effect.as(undefined),
            Effect.catch((e: InferenceError) => Effect.succeed({ replica, e }))
          ),
        { concurrency: "unbounded" }
      )
      for (const failure of failures) if (failure !== undefined) yield* takeOut(failure.replica, failure.e.message)
      if (inNow.length > 0 && replicas.every((r) => !r.up)) {
        return yield* error("Unreachable", `no replica took the update: ${outReasons()}`)
      }
    })

  /** Send the newest full weights to one paused-or-idle replica and label them `target`. */
  const sendWeights = (replica: Replica, target: number) =>
    Effect.gen(function* () {
      const weights = currentWeights
      if (weights === undefined) return
      if ("dir" in weights) {
        yield* WeightDialect.loadFromDisk(dialect as "vllm" | "sglang", replica.target, weights.dir, target)
        return
      }
      yield* WeightUpload.upload(
        {
          url: replica.target.base,
          token: options.weightToken!,
          ...(options.chunkBytes === undefined ? {} : { chunkBytes: options.chunkBytes })
        },
        weights.snapshot
      ).pipe(Effect.mapError((e) => error("BadResponse", e.message)))
    }).pipe(withClient)

  /** The replica's served version against `expected`: a disagreement fails (undefined: the server cannot say). */
  const checkVersion = (replica: Replica, expected: number) =>
    Effect.gen(function* () {
      const served = yield* WeightDialect.servedVersion(dialect, replica.target).pipe(withClient)
      if (served !== undefined && served !== expected) {
        return yield* error("BadResponse", `serves version ${served}, expected ${expected}`)
      }
      replica.version = expected
    })

  /** Wait until no call of this engine is in flight to the replica (pause mode wait). */
  const drained = (replica: Replica) =>
    Effect.gen(function* () {
      while (replica.inFlight > 0) yield* Effect.sleep("20 millis")
    })

  /** Full weights to every replica in: all paused, all loaded and checked, then all resumed. */
  const syncFull = (snapshot: WeightSnapshot.WeightSnapshot) =>
    Effect.gen(function* () {
      const startedAt = yield* Clock.currentTimeMillis
      let bytes = WeightSnapshot.byteSize(snapshot)
      if (dialect === "effect-rl") {
        if (options.weightToken === undefined) {
          return yield* error(
            "Internal",
            `weights v${snapshot.version} cannot reach the server: dialect effect-rl needs a weight token ` +
              `(generator.engine.weight_token), or choose dialect vllm or sglang`
          )
        }
        currentWeights = { snapshot }
      } else {
        if (options.weightsDir === undefined) {
          return yield* error("Internal", `weights v${snapshot.version}: dialect ${dialect} needs a weights directory`)
        }
        const written = yield* Effect.tryPromise({
          try: () =>
            HfWeightDir.write(options.weightsDir!, snapshot, {
              ...(options.hfConfig === undefined ? {} : { config: options.hfConfig })
            }),
          catch: (cause) => error("Internal", `cannot write weights v${snapshot.version}: ${(cause as Error).message}`)
        })
        currentWeights = { dir: written.dir }
        bytes = written.bytes
      }
      const mode = options.pauseMode ?? "keep"
      yield* Effect.acquireUseRelease(
        notPaused.close,
        () =>
          Effect.gen(function* () {
            yield* onEveryReplica((replica) =>
              Effect.gen(function* () {
                if (mode === "wait") yield* drained(replica)
                yield* WeightDialect.pause(dialect, replica.target, mode).pipe(withClient)
              })
            )
            yield* onEveryReplica((replica) =>
              Effect.andThen(sendWeights(replica, snapshot.version), checkVersion(replica, snapshot.version))
            )
          }),
        // every replica is resumed, also after a failure (one taken out is resumed when it returns)
        () =>
          Effect.andThen(
            Effect.forEach(
              replicas.filter((r) => r.up),
              (replica) => WeightDialect.resume(dialect, replica.target).pipe(withClient, Effect.ignore),
              { concurrency: "unbounded", discard: true }
            ),
            notPaused.open
          )
      )
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      options.onSynced?.({ version: snapshot.version, bytes, seconds })
    })

  const updateWeights = Effect.fn("RemoteEngine.updateWeights")(function* (snapshot: WeightSnapshot.WeightSnapshot) {
    if (snapshot.version < version) {
      return yield* Effect.die(
        new Error(`RemoteEngine.updateWeights: version ${snapshot.version} is older than ${version}`)
      )
    }
    yield* syncing.withPermit(
      Effect.gen(function* () {
        const adapter = snapshot.adapter
        if (adapter !== undefined && options.lora !== undefined)
          yield* syncAdapter(options.lora, { ...snapshot, adapter })
        if (snapshot.names.length > 0) yield* syncFull(snapshot)
        version = snapshot.version
        for (const r of replicas) if (r.up) r.version = version
      })
    )
  })

  /** A replica taken out that answers again: brought to the current weights and version, checked, let back in. */
  const rejoin = (replica: Replica) =>
    syncing
      .withPermit(
        Effect.gen(function* () {
          // a server that kept running while out may still be paused by an update it missed the end of
          yield* WeightDialect.resume(dialect, replica.target).pipe(withClient, Effect.ignore)
          yield* sendWeights(replica, version)
          for (const a of adapters) yield* loadAdapter(replica, a.name, a.dir, false)
          if (currentWeights !== undefined) yield* checkVersion(replica, version)
          replica.version = version
          replica.up = true
          replica.reason = undefined
          yield* Effect.logInfo(`replica ${replica.target.base} back in at version ${version}`)
        })
      )
      .pipe(Effect.catch((e: InferenceError) => Effect.logWarning(`replica ${replica.target.base}: ${e.message}`)))

  if (replicas.length > 1) {
    yield* Effect.forkScoped(
      Effect.forever(
        Effect.gen(function* () {
          yield* Effect.sleep(healthInterval)
          for (const replica of replicas) {
            if (replica.up) continue
            if (yield* WeightDialect.healthy(replica.target).pipe(withClient)) yield* rejoin(replica)
          }
        })
      )
    )
  }

  return InferenceEngine.of({
    generate,
    chat,
    updateWeights,
    pause: Effect.asVoid(notPaused.close),
    resume: Effect.asVoid(notPaused.open),
    version: Effect.sync(() => version)
  })
})

/** Over Node's fetch; probes replicas taken out for as long as the layer lives. */
export const layer = (options: RemoteEngineOptions): Layer.Layer<InferenceEngine, InferenceError> =>
  Layer.effect(InferenceEngine, make(options)).pipe(Layer.provide(FetchHttpClient.layer))
