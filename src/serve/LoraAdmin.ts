/**
 * vLLM's routes that load and unload LoRA adapters at run time (`adapters`, serve/AdapterRegistry.ts) on the
 * OpenAI-compatible server (OpenAiServer.ts), as vLLM serves them with `--enable-lora` and
 * `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; without `adapters` both routes answer FastAPI's 404 `{"detail": "Not
 * Found"}`, as vLLM's do when they are not attached.
 *
 * `POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace?}` reads the PEFT directory at `lora_path` (as the
 * server sees it) and answers 200 with the plain text `Success: LoRA adapter '<name>' added successfully.`;
 * `POST /v1/unload_lora_adapter {lora_name}` (`lora_int_id` is ignored) answers `Success: LoRA adapter '<name>'
 * removed successfully.`. Refusals, in vLLM's error body: a name or path missing, 400 `InvalidUserInput` ("Both
 * 'lora_name' and 'lora_path' must be provided." / "'lora_name' needs to be provided to unload a LoRA adapter.");
 * a name loaded already without `load_inplace: true`, 400 `InvalidUserInput`; unloading a name not loaded, 404
 * `NotFoundError` ("The lora adapter '<name>' cannot be found."); a path with no adapter_config.json, 404
 * `NotFoundError` ("Loading lora <name> failed: No adapter found for <path>"); an adapter that cannot be read or
 * does not fit the base (rank, shapes, modules), 400 `BadRequestError` naming the file (vLLM up to 0.10 answered
 * 400 `BadRequestError` with its loader's message; later versions answer 500); past `--max-loras`, 400 (our
 * limit: vLLM instead evicts the least recently used adapter from its `--max-cpu-loras` cache and reads it again
 * on use, which a trainer that deletes old versions' directories cannot allow).
 * An adapter named `<anything>-v<N>` reports policy version N; others report the base's version.
 * Pinned from vLLM's source (https://github.com/vllm-project/vllm): the routes and their plain-text success in
 * `vllm/entrypoints/serve/lora/api_router.py` (attached only with `VLLM_ALLOW_RUNTIME_LORA_UPDATING`; commit
 * 27873cab97e41ef32a6a8bcf83fa475a23e6e921), the request bodies in `vllm/entrypoints/serve/lora/protocol.py`
 * (7fd1b43852e1c71c7cde24ab80ccbe46c2c68a18) and, with `load_inplace` (vllm-project/vllm#31326, 2026),
 * `OpenAIServingModels` in `vllm/entrypoints/openai/models/serving.py` (00153c8b7948077ebdfc5bfa14e403da41aaea6d):
 * the checks, messages and statuses above, the adapter model cards (`id` the name, `root` the path, `parent` the
 * base), `check_model`'s 404; the not-found text is `LoRAAdapterNotFoundError` (`vllm/exceptions.py`); the 400 for
 * unreadable adapters is `vllm/entrypoints/openai/serving_models.py` as of v0.8-v0.10
 * (0f1457b0e1303e64ea1c1f3a3e6e0bf348348dc2). test/fixtures/vllm-lora-api.json keeps these shapes.
 */
import { Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import type { AdapterError } from "./AdapterRegistry.ts"
import * as Refusal from "./Refusal.ts"
import * as RequestBody from "./RequestBody.ts"
import type * as Served from "./Served.ts"

/** What vLLM answers for each refused load or unload (see the module header). */
const fromAdapterError = (e: AdapterError, path: string) => {
  switch (e.reason) {
    case "AlreadyLoaded":
      return new Refusal.BadRequest(
        `The lora adapter '${e.name}' has already been loaded. If you want to load the adapter in place, set ` +
          `'load_inplace' to True.`,
        400,
        null,
        "InvalidUserInput"
      )
    case "NotFound":
      return new Refusal.BadRequest(`The lora adapter '${e.name}' cannot be found.`, 404)
    case "NoAdapter":
      return new Refusal.BadRequest(`Loading lora ${e.name} failed: No adapter found for ${path}`, 404)
    case "Unreadable":
      return new Refusal.BadRequest(`Loading lora ${e.name} failed: ${e.detail}`)
    case "TooMany":
      return new Refusal.BadRequest(`Loading lora ${e.name} failed: ${e.detail}`)
  }
}

/** FastAPI's answer for a route that is not there: what vLLM's LoRA routes are without runtime updating. */
const routeNotFound = () => HttpServerResponse.jsonUnsafe({ detail: "Not Found" }, { status: 404 })

/** `POST /v1/load_lora_adapter`. */
export const load = (server: Served.Served) => (request: HttpServerRequest.HttpServerRequest) =>
  Refusal.handle(
    Effect.gen(function* () {
      const adapters = server.adapters
      if (adapters === undefined) return routeNotFound()
      const body = yield* RequestBody.readJsonBody(request, server.maxRequestBytes)
      const name = RequestBody.nonEmpty(body["lora_name"])
      const dir = RequestBody.nonEmpty(body["lora_path"])
      if (name === undefined || dir === undefined) {
        return yield* Refusal.fail("Both 'lora_name' and 'lora_path' must be provided.", 400, null, "InvalidUserInput")
      }
      yield* adapters
        .load(name, dir, body["load_inplace"] === true)
        .pipe(Effect.mapError((e) => fromAdapterError(e, dir)))
      return HttpServerResponse.text(`Success: LoRA adapter '${name}' added successfully.`)
    })
  )

/** `POST /v1/unload_lora_adapter`. */
export const unload = (server: Served.Served) => (request: HttpServerRequest.HttpServerRequest) =>
  Refusal.handle(
    Effect.gen(function* () {
      const adapters = server.adapters
      if (adapters === undefined) return routeNotFound()
      const body = yield* RequestBody.readJsonBody(request, server.maxRequestBytes)
      const name = RequestBody.nonEmpty(body["lora_name"])
      if (name === undefined) {
        return yield* Refusal.fail(
          "'lora_name' needs to be provided to unload a LoRA adapter.",
          400,
          null,
          "InvalidUserInput"
        )
      }
      yield* adapters.unload(name).pipe(Effect.mapError((e) => fromAdapterError(e, "")))
      return HttpServerResponse.text(`Success: LoRA adapter '${name}' removed successfully.`)
    })
  )
