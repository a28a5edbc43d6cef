/**
 * The agent gateway: an OpenAI- and Anthropic-compatible HTTP endpoint on 127.0.0.1 through which an unmodified
 * agent program (generator/AgentProgram.ts) samples from the policy, every call recorded token-exact. Each trajectory
 * has a session at a path of its own, `/t/<session>/`, so an SDK client pointed at it (`OPENAI_BASE_URL =
 * <url>/t/<session>/v1`, `ANTHROPIC_BASE_URL = <url>/t/<session>`) needs no change:
 *
 * - `POST v1/chat/completions`, `v1/responses`, `v1/messages` (and `GET v1/models`) are serve's routes
 *   (serve/ChatCompletions.ts, Responses.ts, Messages.ts) over the run's engine, at the weights it holds now;
 * - whatever `model` the program names, the policy answers; the tools it offers reach the policy as the run's
 *   `environment.tool_prompt` and `tool_call_format` put them in training (serve/ToolPrompts.ts);
 * - the sampling is the run's, not the program's: `temperature`, `top_p`, `top_k` as the generator's, one choice,
 *   a seed per call derived from the trajectory's, at most `max_generate_length` new tokens and never past the room
 *   `max_input_length` leaves (the program's `max_tokens` may ask for fewer); the run's stop strings join the
 *   program's;
 * - the calls the program sends back are printed with their arguments in the spelling the policy was served them in
 *   (an SDK that re-serialises them would otherwise rewrite the history);
 * - every answered call is a `ServedTurn`: the conversation as chat messages, the prompt ids as rendered, the sampled
 *   ids, their log-probs and versions, the reply as the tool parser read it;
 * - past `max_turns` calls a session answers 400 (not 429, which SDK clients retry), and a request for a session that
 *   ended (or never was) 404.
 */
import { Context, Effect, Layer, type Scope } from "effect"
import { HttpRouter, HttpServer, type HttpServerRequest, type HttpServerResponse } from "effect/http"
import type { Message } from "../domain/Message.ts"
import * as ToolCallParser from "../env/ToolCallParser.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as ChatCompletions from "../serve/ChatCompletions.ts"
import * as Messages from "../serve/Messages.ts"
import * as Models from "../serve/Models.ts"
import * as OpenAiServer from "../serve/OpenAiServer.ts"
import * as Refusal from "../serve/Refusal.ts"
import type * as RequestBody from "../serve/RequestBody.ts"
import * as Responses from "../serve/Responses.ts"
import type * as Served from "../serve/Served.ts"
import { Tokenizer } from "../tokenizer/Tokenizer.ts"

/** How one trajectory's calls are sampled. */
export interface SessionOptions {
  readonly temperature: number
  readonly topP: number
  readonly topK: number
  readonly stopStrings: ReadonlyArray<string>
  readonly maxGenerateLength: number
  readonly maxInputLength: number
  /** Calls answered at most (`generator.max_turns`). */
  readonly maxCalls: number
  /** The seed of call `k`. */
  readonly seed: (call: number) => number
}

/** A refused request of a session: its status and message. */
export interface Refused {
  readonly status: number
  readonly message: string
}

/** One trajectory's endpoint, open for its scope. */
export interface Session {
  /** `OPENAI_BASE_URL` (ends in `/v1`). */
  readonly openAiBaseUrl: string
  /** `ANTHROPIC_BASE_URL` (the Anthropic SDK adds `/v1/messages`). */
  readonly anthropicBaseUrl: string
  /** The calls answered so far, in order. */
  readonly turns: ReadonlyArray<Served.ServedTurn>
  readonly refused: ReadonlyArray<Refused>
  /** A call came past `maxCalls`. */
  readonly overCalls: () => boolean
}

export class AgentGateway extends Context.Service<
  AgentGateway,
  {
    readonly url: string
    readonly open: (options: SessionOptions) => Effect.Effect<Session, never, Scope.Scope>
  }
>()("rl/generator/AgentGateway") {}

type Handler = (request: HttpServerRequest.HttpServerRequest) => Effect.Effect<HttpServerResponse.HttpServerResponse>

interface Live {
  readonly routes: Record<string, Handler>
  readonly refused: Array<Refused>
  readonly state: { calls: number }
  readonly maxCalls: number
}

const notFound = (message: string) => Refusal.respondError(new Refusal.BadRequest(message, 404, null, "NotFoundError"))

/** The message of a refusal's body (vLLM's, OpenAI's or Anthropic's), for the trajectory's record. */
const refusalMessage = (response: HttpServerResponse.HttpServerResponse): string => {
  const body = response.body
  if (body._tag !== "Uint8Array") return `status ${response.status}`
  try {
    const json = JSON.parse(new TextDecoder().decode(body.body)) as { error?: { message?: string } }
    return json.error?.message ?? `status ${response.status}`
  } catch {
    return `status ${response.status}`
  }
}

/** The run's sampling over the program's request (the module header lists what is kept and what is not). */
const rewrite =
  (options: SessionOptions, live: { calls: number }) =>
  (body: RequestBody.Json): RequestBody.Json => {
    const asked = body["max_completion_tokens"] ?? body["max_tokens"]
    const stop = body["stop"]
    const theirs = typeof stop === "string" ? [stop] : Array.isArray(stop) ? (stop as Array<string>) : []
    const { max_completion_tokens: _, ...rest } = body
    return {
      ...rest,
      n: 1,
      temperature: options.temperature,
      top_p: options.topP,
      top_k: options.topK,
      seed: options.seed(live.calls - 1),
      stop: [...new Set([...options.stopStrings, ...theirs])],
      max_tokens:
        typeof asked === "number" && Number.isInteger(asked) && asked > 0
          ? Math.min(asked, options.maxGenerateLength)
          : options.maxGenerateLength
    }
  }

/**
 * A call the program sends back prints as the policy wrote it: its arguments in the served spelling (serve's replies
 * write them with ToolCallParser.pythonJson; an SDK that parses and re-serialises them, as the AI SDK does, would
 * otherwise change the history, and the trajectory would go step-wise).
 */
const servedArguments = (messages: ReadonlyArray<Message>): ReadonlyArray<Message> =>
  messages.map((m) =>
    m.role !== "assistant" || m.tool_calls === undefined
      ? m
      : {
          ...m,
          tool_calls: m.tool_calls.map((call) => {
            try {
              const args = JSON.parse(call.function.arguments) as unknown
              return { ...call, function: { ...call.function, arguments: ToolCallParser.pythonJson(args) } }
            } catch {
              return call
            }
          })
        }
  )

export const make = Effect.fn("AgentGateway.make")(function* (
  toolPrompt: ChatCompletions.ToolPrompt,
  server: Layer.Layer<HttpServer.HttpServer, unknown>
) {
  const engine = yield* InferenceEngine
  const tokenizer = (yield* Tokenizer).impl
  const sessions = new Map<string, Live>()
  let opened = 0

  const dispatch = (request: HttpServerRequest.HttpServerRequest) =>
    Effect.gen(function* () {
      const match = /^\/t\/([^/]+)\/(?:v1\/)?([^?]*)/.exec(request.url)
      const live = match === null ? undefined : sessions.get(match[1]!)
      if (live === undefined) {
        return notFound(
          `no trajectory is rolling out at ${request.url}: its program ended, or the URL is not one effect-rl gave it`
        )
      }
      const route = live.routes[`${request.method} ${match![2]}`]
      if (route === undefined) return notFound(`the agent gateway serves no ${request.method} ${request.url}`)
      if (request.method === "POST" && ++live.state.calls > live.maxCalls) {
        // 400, not 429: SDK clients retry a 429
        const message = `this trajectory has made its ${live.maxCalls} model calls (generator.max_turns): end the agent's run`
        live.refused.push({ status: 400, message })
        return Refusal.respondError(new Refusal.BadRequest(message, 400))
      }
      const response = yield* route(request)
      if (response.status >= 400) live.refused.push({ status: response.status, message: refusalMessage(response) })
      return response
    })

  const routes = HttpRouter.use(
    Effect.fnUntraced(function* (router) {
      yield* router.add("*", "*", dispatch)
    })
  )
  const context = yield* Layer.build(
    HttpRouter.serve(routes, { disableLogger: true, disableListenLog: true }).pipe(Layer.provideMerge(server))
  ).pipe(Effect.orDie)
  const url = HttpServer.formatAddress(Context.get(context, HttpServer.HttpServer).address)

  const open = (options: SessionOptions) =>
    Effect.acquireRelease(
      Effect.sync(() => {
        const id = `s${++opened}`
        const turns: Array<Served.ServedTurn> = []
        const state = { calls: 0 }
        const served: Served.Served = {
          tokenizer,
          modelName: "policy",
          maxModelLen: options.maxInputLength,
          maxRequestBytes: OpenAiServer.defaultMaxRequestBytes(options.maxInputLength),
          maxN: 1,
          base: { engine },
          gateway: { rewrite: rewrite(options, state), messages: servedArguments, observe: (turn) => turns.push(turn) }
        }
        const refused: Array<Refused> = []
        const session: Session = {
          openAiBaseUrl: `${url}/t/${id}/v1`,
          anthropicBaseUrl: `${url}/t/${id}`,
          turns,
          refused,
          overCalls: () => state.calls > options.maxCalls
        }
        const live: Live = {
          routes: {
            "POST chat/completions": ChatCompletions.handler(served, toolPrompt),
            "POST responses": Responses.handler(served, toolPrompt, 64),
            "POST messages": Messages.handler(served, toolPrompt),
            "GET models": () => Models.list(served)
          },
          refused,
          state,
          maxCalls: options.maxCalls
        }
        sessions.set(id, live)
        return { id, session }
      }),
      ({ id }) => Effect.sync(() => sessions.delete(id))
    ).pipe(Effect.map(({ session }) => session))

  return AgentGateway.of({ url, open })
})

/** The gateway on `server` (an HTTP server on a free loopback port), over the run's engine and tokenizer. */
export const layer = (
  toolPrompt: ChatCompletions.ToolPrompt,
  server: Layer.Layer<HttpServer.HttpServer, unknown>
): Layer.Layer<AgentGateway, never, InferenceEngine | Tokenizer> => Layer.effect(AgentGateway, make(toolPrompt, server))
