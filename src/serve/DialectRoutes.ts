/**
 * `serve`'s side of the vLLM and SGLang weight-update endpoints (weights/WeightDialect.ts has the client side and the
 * pinned sources), so our server stands in for either: the same routes, request bodies and answers, over the
 * LocalEngine `serve` runs. Open only with `weightReload` (`serve --enable-weight-reload`, or vLLM's
 * `VLLM_SERVER_DEV_MODE=1`), as vLLM attaches them only in dev mode: without it each answers FastAPI's 404
 * `{"detail": "Not Found"}`. Reloading reads a directory on this machine, so it is for trusted networks only.
 *
 * vLLM:
 * - `POST /pause?mode=abort|keep|wait` → `{"status": "paused"}`; a bad mode → 400 `{"error": "…"}`.
 * - `POST /resume` → `{"status": "resumed"}`; `GET /is_paused` → `{"is_paused": bool}`.
 * - `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` → `{"results": [null]}`
 *   (one worker). Without `weights_path` the served checkpoint is read again, as vLLM re-reads its `--model`. No
 *   `method` → 400 `{"detail": "Missing 'method' in request body"}`; other methods → 400 (we run no workers to call).
 * - `POST /reset_prefix_cache` → `{"success": true}` (new weights already dropped every cached prefix).
 * - `POST /update_weight_version {"new_version": "N"}` → `{"success": true, "new_version": "N"}`;
 *   `GET /weight_info` → `{"weight_version": "N"}`.
 * SGLang:
 * - `POST /update_weights_from_disk {"model_path": DIR, "weight_version"?: "N", …}` → 200 `{"success": true,
 *   "message": "Succeeded to update model weights.", "num_paused_requests": 0}` (+ ` Weight version updated to N.`),
 *   a directory that cannot be read or does not fit → 400 with `"success": false` and the reason.
 * - `GET|POST /flush_cache` → 200 `Cache flushed.\n…` (text); `POST /pause_generation {"mode"?}` and
 *   `POST /continue_generation` → `{"message": "Generation paused|continued successfully.", "status": "ok"}`;
 *   `GET /get_weight_version` → `{"weight_version": "N"}`.
 *
 * Departures: every pause mode freezes requests in flight before their next decode step (vLLM's keep, SGLang's
 * in_place) — none is aborted or waited for — and they continue on the new weights after resume; each choice's
 * `policy_version_first/last` then says which weights produced its tokens. A reload's policy version is the
 * `policy_version` metadata of the directory's weights (weights/HfWeightDir.ts writes it), else the current one + 1;
 * the weight-version label is separate, as in vLLM and SGLang, and reads as the policy version until one is set.
 */
import { Effect } from "effect"
import { HttpRouter, type HttpServerRequest, HttpServerResponse } from "effect/http"
import type { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as HfWeightDir from "../weights/HfWeightDir.ts"

export interface DialectRoutesOptions {
  /** The served engine (its `updateWeights` also refreshes LoRA adapters' engines). */
  readonly engine: InferenceEngine["Service"]
  /** The checkpoint served: what a reload without a path reads again. */
  readonly modelDir: string
  /** Open the routes; false: each answers 404. */
  readonly weightReload: boolean
}

const maxBodyBytes = 1024 * 1024

const json = (body: unknown, status = 200) => HttpServerResponse.jsonUnsafe(body, { status })
const notFound = () => json({ detail: "Not Found" }, 404)

/** The body as a JSON object (an empty body: `{}`), or the reason it is not one. */
const readBody = (request: HttpServerRequest.HttpServerRequest) =>
  Effect.gen(function* () {
    if (Number(request.headers["content-length"]) > maxBodyBytes) return "the body is too large"
    const text = yield* request.text.pipe(Effect.orElseSucceed(() => ""))
    if (text.trim() === "") return {} as Record<string, unknown>
    try {
      const body = JSON.parse(text) as unknown
      return typeof body === "object" && body !== null && !Array.isArray(body)
        ? (body as Record<string, unknown>)
        : "the body must be a JSON object"
    } catch (cause) {
      return `JSON decode error: ${(cause as Error).message}`
    }
  })

const message = (cause: unknown) => (cause instanceof Error ? cause.message : String(cause))

export const routes = (options: DialectRoutesOptions) =>
  HttpRouter.use(
    Effect.fnUntraced(function* (router) {
      const { engine } = options
      let paused = false
      /** The weight-version label (vLLM's and SGLang's `weight_version`); undefined: the policy version. */
      let label: string | undefined
      const open = <E, R>(
        handler: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
      ): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R> =>
        options.weightReload ? handler : Effect.succeed(notFound())

      const pause = Effect.suspend(() => {
        paused = true
        return engine.pause
      })
      const resume = Effect.suspend(() => {
        paused = false
        return engine.resume
      })
      /** Load the HF directory into the engine; undefined, or why it failed. */
      const reload = (dir: string) =>
        Effect.gen(function* () {
          const current = yield* engine.version
          const snapshot = yield* Effect.tryPromise({
            try: () => HfWeightDir.read(dir, current + 1),
            catch: (cause) => `cannot read ${dir}: ${message(cause)}`
          })
          if (snapshot.version < current) return `${dir} holds version ${snapshot.version}, older than ${current}`
          yield* engine.updateWeights(snapshot).pipe(Effect.mapError((e) => e.message))
          label = undefined
          return undefined
        }).pipe(Effect.catch((reason: string) => Effect.succeed(reason)))
      const weightVersion = Effect.map(engine.version, (v) => label ?? String(v))

      // vLLM
      yield* router.add("POST", "/pause", (request) =>
        open(
          Effect.gen(function* () {
            const mode = new URL(request.url, "http://server").searchParams.get("mode") ?? "abort"
            if (!["abort", "keep", "wait"].includes(mode)) {
              return json({ error: `Invalid pause mode: ${mode}. Expected one of abort, keep, wait.` }, 400)
            }
            yield* pause
            return json({ status: "paused" })
          })
        )
      )
      yield* router.add("POST", "/resume", open(Effect.as(resume, json({ status: "resumed" }))))
      yield* router.add("GET", "/is_paused", open(Effect.sync(() => json({ is_paused: paused }))))
      yield* router.add("POST", "/collective_rpc", (request) =>
        open(
          Effect.gen(function* () {
            const body = yield* readBody(request)
            if (typeof body === "string") return json({ detail: body }, 400)
            const method = body["method"]
            if (method === undefined || method === null)
              return json({ detail: "Missing 'method' in request body" }, 400)
            if (method !== "reload_weights") {
              return json({ detail: `collective_rpc method ${JSON.stringify(method)} is not supported here` }, 400)
            }
            const kwargs = (body["kwargs"] ?? {}) as Record<string, unknown>
            const dir = typeof kwargs["weights_path"] === "string" ? kwargs["weights_path"] : options.modelDir
            const failed = yield* reload(dir)
            if (failed !== undefined) return json({ error: `Failed to reload weights: ${failed}` }, 500)
            return json({ results: [null] })
          })
        )
      )
      yield* router.add("POST", "/reset_prefix_cache", open(Effect.succeed(json({ success: true }))))
      yield* router.add("POST", "/update_weight_version", (request) =>
        open(
          Effect.gen(function* () {
            const body = yield* readBody(request)
            if (typeof body === "string") return json({ detail: body }, 400)
            const next = body["new_version"]
            if (typeof next !== "string") return json({ detail: "'new_version' (a string) is required" }, 400)
            label = next
            return json({ success: true, new_version: next })
          })
        )
      )
      yield* router.add("GET", "/weight_info", open(Effect.map(weightVersion, (v) => json({ weight_version: v }))))

      // SGLang
      yield* router.add("POST", "/update_weights_from_disk", (request) =>
        open(
          Effect.gen(function* () {
            const body = yield* readBody(request)
            if (typeof body === "string")
              return json({ object: "error", message: body, type: "Bad Request", code: 400 }, 400)
            const dir = body["model_path"]
            if (typeof dir !== "string" || dir === "") {
              return json({ object: "error", message: "'model_path' is required", type: "Bad Request", code: 400 }, 400)
            }
            const failed = yield* reload(dir)
            if (failed !== undefined) {
              return json(
                { success: false, message: `Failed to update weights: ${failed}.`, num_paused_requests: 0 },
                400
              )
            }
            let text = "Succeeded to update model weights."
            const next = body["weight_version"]
            if (typeof next === "string") {
              label = next
              text += ` Weight version updated to ${next}.`
            }
            return json({ success: true, message: text, num_paused_requests: 0 })
          })
        )
      )
      const flushed = open(
        Effect.succeed(
          HttpServerResponse.text(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"
          )
        )
      )
      yield* router.add("GET", "/flush_cache", flushed)
      yield* router.add("POST", "/flush_cache", flushed)
      yield* router.add(
        "POST",
        "/pause_generation",
        open(Effect.as(pause, json({ message: "Generation paused successfully.", status: "ok" })))
      )
      yield* router.add(
        "POST",
        "/continue_generation",
        open(Effect.as(resume, json({ message: "Generation continued successfully.", status: "ok" })))
      )
      yield* router.add(
        "GET",
        "/get_weight_version",
        open(Effect.map(weightVersion, (v) => json({ weight_version: v })))
      )
    })
  )
