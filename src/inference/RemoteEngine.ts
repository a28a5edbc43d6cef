/**
 * The inference engine over HTTP: an OpenAI-compatible `/v1/completions` server — our `serve` or vLLM — token ids in,
 * token ids + behaviour log-probs out, never re-tokenised.
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
 * Versions: our server reports `policy_version_first/last` per choice; for servers that do not (vLLM) both are the
 * version this engine knows at the start and end of the call. A choice that comes back `finish_reason: "abort"` (a
 * server paused with mode abort while the trainer syncs weights) is resumed as SkyRL does: the request is sent
 * again with the tokens so far appended to the prompt and the remaining budget, and the parts are joined.
 *
 * Weights: with a `weightToken`, `updateWeights` uploads the snapshot to `/v1/weights` (WeightUpload.ts); a
 * tensor-less snapshot — or any snapshot when no token is configured, i.e. the server manages its own weights
 * (vLLM with its own weight transfer) — only advances the version this engine reports.
 * `pause`/`resume` hold new calls on the client side (calls in flight finish on the server).
 *
 * LoRA (`lora`): a snapshot carrying an adapter is written as a PEFT directory `<lora.dir>/v<version, 6 digits>`
 * (which the server must be able to read), loaded with vLLM's runtime LoRA API (`POST /v1/load_lora_adapter
 * {lora_name: "<prefix>-v<version>", lora_path}`; our `serve --enable-lora` or vLLM with `--enable-lora` and
 * `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), and calls from then on name it as their `model`; calls in flight keep the
 * adapter they started with. Then every adapter but the newest `lora.keep` is unloaded (`/v1/unload_lora_adapter`)
 * and its directory deleted. A call's policy versions are its adapter's version: exact, since that adapter sampled
 * every token of it. Re-publishing a version loads it again in place (`load_inplace`).
 *
 * Failures: no connection, timeouts, 429/503 are `InferenceError` Unreachable/Overloaded (retryable, retried with
 * backoff `maxRetries` times); other statuses and malformed bodies are BadResponse (4xx) or Internal (5xx).
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Clock, Duration, Effect, Latch, Layer, Schedule } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest } from "effect/http"
import { InferenceError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import type { FinishReason } from "../domain/Trajectory.ts"
import type { WeightSnapshot } from "../domain/WeightSnapshot.ts"
import * as Lora from "../model/Lora.ts"
import { type GenerateRequest, type GenerateResult, InferenceEngine } from "./InferenceEngine.ts"
import * as WeightUpload from "./WeightUpload.ts"

export interface RemoteEngineOptions {
  /** Base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted). */
  readonly url: string
  /** The `model` sent with each request (vLLM checks it against its served model name); default: the first of
   * the server's `/v1/models`. */
  readonly model?: string
  /** Sent as `Authorization: Bearer` on completions (vLLM `--api-key`). */
  readonly apiKey?: string
  /** The server's weight token: when set, `updateWeights` uploads snapshots to `/v1/weights`. */
  readonly weightToken?: string
  readonly chunkBytes?: number
  /** Retries of a retryable failure; default 3. */
  readonly maxRetries?: number
  /** Per completions call; default 10 minutes. */
  readonly timeout?: Duration.Input
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
  /** Called after each adapter sync with the bytes written and its wall time. */
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

/** The completions body for one request (see the module header). */
export const requestBody = (model: string, request: GenerateRequest) => {
  const s = request.sampling
  return {
    model,
    prompt: [...request.promptIds],
    max_tokens: s.maxNewTokens,
    temperature: s.temperature,
    top_p: s.topP,
    top_k: s.topK === 0 ? -1 : s.topK,
    seed: s.seed,
    stop: [...s.stopStrings],
    stop_token_ids: [...s.stopTokenIds],
    ignore_eos: true,
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

export const make = Effect.fnUntraced(function* (options: RemoteEngineOptions) {
  const client = yield* HttpClient.HttpClient
  const base = WeightUpload.baseUrl(options.url)
  const timeout = Duration.fromInputUnsafe(options.timeout ?? Duration.minutes(10))
  const maxResumes = options.maxResumes ?? 8
  let version: PolicyVersion.PolicyVersion = options.initialVersion ?? PolicyVersion.initial
  const notPaused = yield* Latch.make(true)
  const baseModel = options.model ?? (yield* servedModel(client, base, options.apiKey))
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

  /** One completions call for `name`, retried while the failure is retryable. */
  const complete = (name: string, request: GenerateRequest) =>
    Effect.gen(function* () {
      const http = HttpClientRequest.post(`${base}/v1/completions`).pipe(
        options.apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(options.apiKey),
        HttpClientRequest.bodyJsonUnsafe(requestBody(name, request))
      )
      const response = yield* client
        .execute(http)
        .pipe(Effect.mapError((e) => error("Unreachable", `${base}: ${e.message}`)))
      const text = yield* response.text.pipe(Effect.mapError((e) => error("Unreachable", `${base}: ${e.message}`)))
      if (response.status !== 200) return yield* statusError(response.status, text)
      const body = yield* Effect.try({
        try: () => JSON.parse(text) as unknown,
        catch: () => error("BadResponse", `the response is not JSON: ${text.slice(0, 200)}`)
      })
      const choice = readChoice(body)
      if (typeof choice === "string") return yield* error("BadResponse", choice)
      return choice
    }).pipe(
      Effect.timeoutOrElse({
        duration: timeout,
        orElse: () => Effect.fail(error("Unreachable", `${base}: no answer in ${Duration.format(timeout)}`))
      }),
      retry
    )

  /** One request, resumed after aborts, all on the model named when it started. */
  const generateOne = (request: GenerateRequest) =>
    Effect.gen(function* () {
      const name = model
      const adapterVersion = adapters.find((a) => a.name === name)?.version
      const startVersion = version
      const tokens: Array<number> = []
      const logprobs: Array<number> = []
      let first: number | undefined
      let last: number | undefined
      for (let attempt = 0; ; attempt++) {
        yield* notPaused.await
        const remaining = request.sampling.maxNewTokens - tokens.length
        const choice = yield* complete(name, {
          promptIds: request.promptIds.concat(tokens),
          sampling: { ...request.sampling, maxNewTokens: remaining }
        })
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
            policyVersionLast: adapterVersion ?? PolicyVersion.make(last ?? version)
          } satisfies GenerateResult
        }
        if (attempt >= maxResumes) return yield* error("Overloaded", `aborted ${attempt + 1} times by the server`)
      }
    })

  const generate = Effect.fn("RemoteEngine.generate")(function* (requests: ReadonlyArray<GenerateRequest>) {
    const empty = requests.findIndex((r) => r.promptIds.length === 0)
    if (empty >= 0) return yield* error("BadResponse", `request ${empty} has an empty prompt`)
    return yield* Effect.forEach(requests, generateOne, { concurrency: "unbounded" })
  })

  /** POST a JSON body to one of the server's LoRA routes; the status and the body's text. */
  const postLora = (route: string, body: unknown) =>
    retry(
      Effect.gen(function* () {
        const http = HttpClientRequest.post(`${base}${route}`).pipe(
          options.apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(options.apiKey),
          HttpClientRequest.bodyJsonUnsafe(body)
        )
        const response = yield* client.execute(http)
        const text = yield* response.text
        if (response.status === 429 || response.status >= 500) return yield* statusError(response.status, text)
        return { status: response.status, text }
      }).pipe(
        Effect.catchTag("HttpClientError", (e) => Effect.fail(error("Unreachable", `${base}${route}: ${e.message}`)))
      )
    )

  /** Load the snapshot's adapter as `<prefix>-v<version>`, name it in new calls, drop all but the newest `keep`. */
  const syncAdapter = (
    lora: NonNullable<RemoteEngineOptions["lora"]>,
    snapshot: WeightSnapshot & { readonly adapter: NonNullable<WeightSnapshot["adapter"]> }
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
      const load = (inplace: boolean) =>
        postLora("/v1/load_lora_adapter", {
          lora_name: name,
          lora_path: dir,
          ...(inplace ? { load_inplace: true } : {})
        })
      const republished = adapters.some((a) => a.name === name)
      let loaded = yield* load(republished)
      // a server that kept this name from an earlier run: replace it
      if (loaded.status === 400 && !republished && loaded.text.includes("has already been loaded"))
        loaded = yield* load(true)
      if (loaded.status !== 200) {
        return yield* error(
          "BadResponse",
          `loading adapter ${name}: ${statusError(loaded.status, loaded.text).message}`
        )
      }
      model = name
      if (!republished) adapters.push({ name, version: snapshot.version, dir })
      while (adapters.length > Math.max(1, lora.keep)) {
        const old = adapters.shift()!
        const unloaded = yield* postLora("/v1/unload_lora_adapter", { lora_name: old.name })
        // 404: the server no longer has it (restarted), which is what unloading wants
        if (unloaded.status !== 200 && unloaded.status !== 404) {
          return yield* error(
            "BadResponse",
            `unloading adapter ${old.name}: ${statusError(unloaded.status, unloaded.text).message}`
          )
        }
        yield* Effect.promise(() => fs.rm(old.dir, { recursive: true, force: true }))
      }
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      options.onSynced?.({ version: snapshot.version, bytes, seconds })
    })

  const updateWeights = Effect.fn("RemoteEngine.updateWeights")(function* (snapshot: WeightSnapshot) {
    if (snapshot.version < version) {
      return yield* Effect.die(
        new Error(`RemoteEngine.updateWeights: version ${snapshot.version} is older than ${version}`)
      )
    }
    const adapter = snapshot.adapter
    if (adapter !== undefined && options.lora !== undefined) yield* syncAdapter(options.lora, { ...snapshot, adapter })
    if (snapshot.names.length > 0 && options.weightToken !== undefined) {
      yield* WeightUpload.upload(
        {
          url: base,
          token: options.weightToken,
          ...(options.chunkBytes === undefined ? {} : { chunkBytes: options.chunkBytes })
        },
        snapshot
      ).pipe(
        Effect.provideService(HttpClient.HttpClient, client),
        Effect.mapError((e) => error("BadResponse", e.message))
      )
    }
    version = snapshot.version
  })

  return InferenceEngine.of({
    generate,
    updateWeights,
    pause: Effect.asVoid(notPaused.close),
    resume: Effect.asVoid(notPaused.open),
    version: Effect.sync(() => version)
  })
})

/** Over Node's fetch. */
export const layer = (options: RemoteEngineOptions): Layer.Layer<InferenceEngine, InferenceError> =>
  Layer.effect(InferenceEngine, make(options)).pipe(Layer.provide(FetchHttpClient.layer))
