/**
 * How new full weights reach an inference server, per server kind ("dialect"), client side. RemoteEngine drives one
 * replica through `pause` → `load` → `resume` and reads back the version it serves with `servedVersion`;
 * serve/DialectRoutes.ts is the same wire seen from `serve`, so our server stands in for either.
 *
 * - `effect-rl`: our `serve`'s chunked, authenticated `POST /v1/weights` (weights/WeightUpload.ts); the weights
 *   travel in the requests. Pausing is client-side only (the server swaps weights between two decode steps).
 *   Version: `GET /health` → `{"status": "ok", "policy_version": N}`.
 * - `vllm`: the weights are written once per version as a HF directory the server can read (weights/HfWeightDir.ts)
 *   and the server is told to re-read them, with its RL endpoints (dev routes: `VLLM_SERVER_DEV_MODE=1`):
 *   1. `POST /pause?mode=abort|keep|wait` (query; `pipeline.pause_mode`) → 200 `{"status": "paused"}`
 *   2. `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` → 200 `{"results":
 *      [null, …]}` (one per worker; an empty 200 when there are none): the layerwise in-place reload vLLM documents
 *      for trainers (docs/training/layerwise.md, https://docs.vllm.ai/en/latest/training/layerwise/).
 *   3. `POST /reset_prefix_cache` → 200 `{"success": bool}` (false while blocks are held, e.g. by requests paused
 *      with mode keep; those are recomputed on resume: not an error)
 *   4. `POST /update_weight_version {"new_version": "N"}` → 200 `{"success": true, "new_version": "N"}`
 *   5. `POST /resume` → 200 `{"status": "resumed"}`
 *   Version: `GET /weight_info` → `{"weight_version": "N"}` (a vLLM without these two routes answers 404: the version
 *   is then not checked).
 *   Pinned from https://github.com/vllm-project/vllm: `vllm/entrypoints/serve/dev/rlhf/api_router.py` @
 *   0100a2129224e729af1b3b8ed42a900cdfe9a452 (/pause, /resume, /is_paused, /update_weight_version, /weight_info),
 *   `vllm/frontend/entrypoints/serve/dev/rpc/api_router.py` @ 055e47c28003156421365af985d676fc921cb075
 *   (/collective_rpc: `method`, `args`, `kwargs`, `timeout`; `{"results": [...]}`),
 *   `vllm/frontend/entrypoints/serve/dev/cache/api_router.py` @ 055e47c28003156421365af985d676fc921cb075
 *   (/reset_prefix_cache). Errors there are FastAPI's `{"detail": …}` (HTTPException) or `{"error": "…"}` (/pause).
 * - `sglang`: the same HF directory, through SGLang's native endpoints:
 *   1. `POST /pause_generation {"mode": "abort" | "retract" | "in_place"}` → 200 `{"message": "Generation paused
 *      successfully.", "status": "ok"}`. `pipeline.pause_mode` abort → abort; keep → retract (requests go back to
 *      the queue and their KV is recomputed on continue: SGLang's in_place keeps old KV and makes /flush_cache fail);
 *      wait → the engine first waits for its calls in flight to the replica, then pauses with retract.
 *   2. `POST /update_weights_from_disk {"model_path": DIR, "weight_version": "N", "flush_cache": true}` → 200
 *      `{"success": true, "message": "…", "num_paused_requests": 0}`, failure 400 with `"success": false`
 *   3. `POST /flush_cache` → 200 text (`Cache flushed.\n…`), 400 while requests run (not an error here)
 *   4. `POST /continue_generation {}` → 200 `{"message": "Generation continued successfully.", "status": "ok"}`
 *   Version: `GET /get_weight_version` → `{"weight_version": "N"}`.
 *   Pinned from https://github.com/sgl-project/sglang: `python/sglang/srt/entrypoints/http_server.py` @
 *   0025436eab0556737d615b36a4dd3e1e26e82f3d (routes, answers) and `python/sglang/srt/managers/io_struct.py` @
 *   001067fffe33427bee0ed2f007fb7551a1d76b44 (UpdateWeightFromDiskReqInput: model_path, load_format,
 *   abort_all_requests, weight_version, is_async, torch_empty_cache, keep_pause, recapture_cuda_graph, token_step,
 *   flush_cache; PauseGenerationReqInput.mode; ContinueGenerationReqInput). Older SGLang takes no pause body.
 * test/fixtures/weight-dialects-api.json keeps these shapes.
 */
import { Effect, Schedule } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import { InferenceError } from "../domain/Errors.ts"

export type Dialect = "effect-rl" | "vllm" | "sglang"
export type PauseMode = "abort" | "keep" | "wait"

/** One server: its base URL (no /v1) and the bearer token its routes take. */
export interface Target {
  readonly base: string
  readonly apiKey?: string | undefined
}

const error = (reason: InferenceError["reason"], message: string) =>
  new InferenceError({ engine: "remote", reason, message })

export interface Answer {
  readonly status: number
  readonly text: string
  readonly json: unknown
}

/**
 * One request to a control route; transport failures and 5xx/429 are retryable (retried with backoff), other
 * statuses come back for the caller to judge.
 */
export const call = (
  target: Target,
  method: "GET" | "POST",
  route: string,
  body?: unknown
): Effect.Effect<Answer, InferenceError, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const client = yield* HttpClient.HttpClient
    const url = `${target.base}${route}`
    const request = (method === "GET" ? HttpClientRequest.get(url) : HttpClientRequest.post(url)).pipe(
      target.apiKey === undefined ? (r) => r : HttpClientRequest.bearerToken(target.apiKey),
      body === undefined ? (r) => r : HttpClientRequest.bodyJsonUnsafe(body)
    )
    const response = yield* client.execute(request)
    const text = yield* response.text
    if (response.status === 429 || response.status >= 500) {
      return yield* error(
        response.status === 429 || response.status === 503 ? "Overloaded" : "Internal",
        `${method} ${url}: HTTP ${response.status}: ${text.slice(0, 300)}`
      )
    }
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      json = undefined
    }
    return { status: response.status, text, json }
  }).pipe(
    Effect.catchTag("HttpClientError", (e) =>
      Effect.fail(error("Unreachable", `${method} ${target.base}${route}: ${e.message}`))
    ),
    Effect.retry({ times: 2, schedule: Schedule.exponential("200 millis"), while: (e) => e.isRetryable })
  )

const expectOk = (what: string, answer: Answer) =>
  answer.status === 200
    ? Effect.succeed(answer)
    : Effect.fail(error("BadResponse", `${what}: HTTP ${answer.status}: ${answer.text.slice(0, 300)}`))

/** The SGLang pause mode for a `pipeline.pause_mode` (see the module header). */
export const sglangPauseMode = (mode: PauseMode): "abort" | "retract" => (mode === "abort" ? "abort" : "retract")

/** Stop the server generating before its weights change (a no-op for effect-rl: it swaps between decode steps). */
export const pause = (dialect: Dialect, target: Target, mode: PauseMode) => {
  switch (dialect) {
    case "effect-rl":
      return Effect.void
    case "vllm":
      return Effect.asVoid(
        Effect.flatMap(call(target, "POST", `/pause?mode=${mode}`), (a) => expectOk("vLLM /pause", a))
      )
    case "sglang":
      return Effect.asVoid(
        Effect.flatMap(call(target, "POST", "/pause_generation", { mode: sglangPauseMode(mode) }), (a) =>
          expectOk("SGLang /pause_generation", a)
        )
      )
  }
}

/** Let the server generate again. */
export const resume = (dialect: Dialect, target: Target) => {
  switch (dialect) {
    case "effect-rl":
      return Effect.void
    case "vllm":
      return Effect.asVoid(Effect.flatMap(call(target, "POST", "/resume"), (a) => expectOk("vLLM /resume", a)))
    case "sglang":
      return Effect.asVoid(
        Effect.flatMap(call(target, "POST", "/continue_generation", {}), (a) =>
          expectOk("SGLang /continue_generation", a)
        )
      )
  }
}

/**
 * Make a paused vLLM or SGLang server serve the HF directory `dir` (as the server sees the path) as `version`: reload,
 * drop cached prefixes, label the version.
 */
export const loadFromDisk = (dialect: "vllm" | "sglang", target: Target, dir: string, version: number) =>
  Effect.gen(function* () {
    if (dialect === "vllm") {
      yield* expectOk(
        "vLLM /collective_rpc reload_weights",
        yield* call(target, "POST", "/collective_rpc", { method: "reload_weights", kwargs: { weights_path: dir } })
      )
      // false while paused requests hold blocks: those are recomputed on resume
      yield* expectOk("vLLM /reset_prefix_cache", yield* call(target, "POST", "/reset_prefix_cache"))
      const labelled = yield* call(target, "POST", "/update_weight_version", { new_version: String(version) })
      if (labelled.status !== 404) yield* expectOk("vLLM /update_weight_version", labelled)
      return
    }
    const loaded = yield* call(target, "POST", "/update_weights_from_disk", {
      model_path: dir,
      weight_version: String(version),
      flush_cache: true
    })
    const body = loaded.json as { success?: unknown; message?: unknown } | undefined
    if (loaded.status !== 200 || body?.success !== true) {
      return yield* error(
        "BadResponse",
        `SGLang /update_weights_from_disk ${dir}: HTTP ${loaded.status}: ${String(body?.message ?? loaded.text).slice(0, 300)}`
      )
    }
    // 400 while requests run (it then flushes nothing): the update above flushed already
    yield* call(target, "POST", "/flush_cache")
  })

/**
 * The policy version a server says it serves, or undefined when it cannot say (a vLLM without `/weight_info`, a
 * label that is not a version).
 */
export const servedVersion = (dialect: Dialect, target: Target) =>
  Effect.gen(function* () {
    const route = dialect === "effect-rl" ? "/health" : dialect === "vllm" ? "/weight_info" : "/get_weight_version"
    const answer = yield* call(target, "GET", route)
    if (answer.status === 404 && dialect === "vllm") return undefined
    yield* expectOk(`${route}`, answer)
    const body = answer.json as { policy_version?: unknown; weight_version?: unknown } | undefined
    const raw = dialect === "effect-rl" ? body?.policy_version : body?.weight_version
    const version = typeof raw === "number" ? raw : typeof raw === "string" ? Number(raw) : Number.NaN
    return Number.isInteger(version) ? version : undefined
  })

/** Whether a server answers its health route (vLLM and ours `/health`; SGLang `/health` too). */
export const healthy = (target: Target) =>
  call(target, "GET", "/health").pipe(
    Effect.map((a) => a.status === 200),
    Effect.catch(() => Effect.succeed(false))
  )
