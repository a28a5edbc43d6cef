import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import * as ChatClient from "../../src/env/ChatClient.ts"
import * as ChatServer from "../fixtures/ChatServer.ts"

const withServer = <A, E>(
  answer: Parameters<typeof ChatServer.start>[0],
  body: (server: ChatServer.ChatServer) => Effect.Effect<A, E>
) =>
  Effect.acquireUseRelease(
    Effect.promise(() => ChatServer.start(answer)),
    body,
    (s) => Effect.promise(() => s.close())
  )

const ask = (text: string): ChatClient.ChatRequest => ({ messages: [{ role: "user", content: text }] })

describe("ChatClient", () => {
  it.live("posts the request with the key as a bearer token and response_format as given; usage at the prices", () =>
    withServer(
      () => ({ content: '{"ok":true}', usage: { prompt_tokens: 120, completion_tokens: 8 } }),
      (server) =>
        Effect.gen(function* () {
          const client = ChatClient.make({
            url: `${server.url}/`,
            model: "judge-1",
            apiKey: Redacted.make("sk-test-123"),
            temperature: 0,
            prices: { prompt: 0.001, completion: 0.002 }
          })
          const format = { type: "json_schema", json_schema: { name: "x", schema: { type: "object" }, strict: true } }
          const r = yield* client.complete({ ...ask("hi"), responseFormat: format, maxTokens: 64, seed: 7 })
          assert.strictEqual(r.content, '{"ok":true}')
          assert.strictEqual(r.promptTokens, 120)
          assert.strictEqual(r.completionTokens, 8)
          assert.closeTo(r.cost, 120 * 0.001 + 8 * 0.002, 1e-12) // 0.136
          assert.isFalse(r.replayed)
          const seen = server.seen[0]!
          assert.strictEqual(seen.headers.authorization, "Bearer sk-test-123")
          assert.deepStrictEqual(seen.body, {
            model: "judge-1",
            messages: [{ role: "user", content: "hi" }],
            response_format: format,
            temperature: 0,
            max_tokens: 64,
            seed: 7
          })
          // the record holds the body as sent, never the key or the URL
          assert.deepStrictEqual(r.record.request, seen.body)
          assert.notInclude(JSON.stringify(r.record), "sk-test")
          assert.notInclude(JSON.stringify(r.record), "127.0.0.1")
        })
    )
  )

  it.live("retries 429 and 503 with backoff, then succeeds", () =>
    withServer(
      (_s, n) =>
        n === 0
          ? { status: 429, body: { error: "slow down" } }
          : n === 1
            ? { status: 503, body: "" }
            : { content: "fine" },
      (server) =>
        Effect.gen(function* () {
          const client = ChatClient.make({ url: server.url, model: "m", backoffMs: 5 })
          const r = yield* client.complete(ask("x"))
          assert.strictEqual(r.content, "fine")
          assert.strictEqual(server.seen.length, 3)
        })
    )
  )

  it.live("gives up after the bounded retries with a typed error naming the endpoint", () =>
    withServer(
      () => ({ status: 503, body: { error: "loading" } }),
      (server) =>
        Effect.gen(function* () {
          const client = ChatClient.make({ url: server.url, model: "m", retries: 2, backoffMs: 5 })
          const e = yield* Effect.flip(client.complete(ask("x")))
          assert.strictEqual(e._tag, "ChatClientError")
          if (e._tag !== "ChatClientError") return
          assert.strictEqual(e.reason, "Unavailable")
          assert.strictEqual(e.endpoint, `${server.url}/chat/completions`)
          assert.include(e.message, `${server.url}/chat/completions`)
          assert.include(e.message, "gave up after 3 attempts")
          assert.strictEqual(server.seen.length, 3) // 1 + 2 retries
        })
    )
  )

  it.live("does not retry a 400, and names a body without a completion", () =>
    withServer(
      (_s, n) => (n === 0 ? { status: 400, body: { error: "bad model" } } : { body: { choices: [] } }),
      (server) =>
        Effect.gen(function* () {
          const client = ChatClient.make({ url: server.url, model: "m", backoffMs: 5 })
          const e1 = yield* Effect.flip(client.complete(ask("x")))
          assert.strictEqual(e1._tag === "ChatClientError" && e1.reason, "Http")
          assert.strictEqual(server.seen.length, 1)
          const e2 = yield* Effect.flip(client.complete(ask("x")))
          assert.strictEqual(e2._tag === "ChatClientError" && e2.reason, "BadResponse")
          assert.include(e2.message, "choices[0].message.content")
        })
    )
  )

  it.live("a refused connection is retried, then a Connection error naming the endpoint", () =>
    Effect.gen(function* () {
      // a port that was just free: start a server, take its port, close it
      const s = yield* Effect.promise(() => ChatServer.start(() => ({ content: "" })))
      yield* Effect.promise(() => s.close())
      const client = ChatClient.make({ url: s.url, model: "m", retries: 1, backoffMs: 5 })
      const e = yield* Effect.flip(client.complete(ask("x")))
      assert.strictEqual(e._tag === "ChatClientError" && e.reason, "Connection")
      assert.include(e.message, s.url)
      assert.include(e.message, "gave up after 2 attempts")
    })
  )

  it.live("keeps at most maxConcurrency calls in flight", () =>
    withServer(
      () => ({ content: "ok", delayMs: 40 }),
      (server) =>
        Effect.gen(function* () {
          const client = ChatClient.make({ url: server.url, model: "m", maxConcurrency: 2 })
          yield* Effect.forEach([1, 2, 3, 4, 5, 6], (i) => client.complete(ask(`q${i}`)), { concurrency: "unbounded" })
          assert.strictEqual(server.seen.length, 6)
          assert.strictEqual(server.maxInFlight(), 2)
        })
    )
  )

  it.live("replays a recorded run with no endpoint: same answers per request and occurrence; a miss is typed", () =>
    Effect.gen(function* () {
      // the server answers each call with its call number, so two calls of one request get different answers
      const recorded = yield* withServer(
        (_s, n) => ({ content: `answer ${n}`, usage: { prompt_tokens: 10 + n, completion_tokens: n } }),
        (server) =>
          Effect.gen(function* () {
            const client = ChatClient.make({ url: server.url, model: "m", mode: "record", temperature: 1 })
            const out = [
              yield* client.complete(ask("a")),
              yield* client.complete(ask("b")),
              yield* client.complete(ask("a"))
            ]
            assert.deepStrictEqual(
              out.map((r) => r.content),
              ["answer 0", "answer 1", "answer 2"]
            )
            return yield* client.recorded
          })
      )
      assert.strictEqual(recorded.length, 3)
      // the server is gone; the replay is asked the same requests in another order, and from another URL
      const replay = ChatClient.make({
        url: "http://unreachable.invalid/v1",
        model: "m",
        mode: "replay",
        temperature: 1,
        records: recorded,
        prices: { prompt: 1, completion: 10 }
      })
      const b = yield* replay.complete(ask("b"))
      const a0 = yield* replay.complete(ask("a"))
      const a1 = yield* replay.complete(ask("a"))
      assert.deepStrictEqual([a0.content, b.content, a1.content], ["answer 0", "answer 1", "answer 2"])
      assert.isTrue(a1.replayed)
      assert.deepStrictEqual([a1.promptTokens, a1.completionTokens, a1.cost], [12, 2, 12 + 20])
      const miss = yield* Effect.flip(replay.complete(ask("a")))
      assert.strictEqual(miss._tag, "ReplayMissError")
      if (miss._tag === "ReplayMissError") assert.strictEqual(miss.occurrence, 2)
      // another model or temperature is another request
      const other = ChatClient.make({
        url: "http://x/v1",
        model: "m",
        mode: "replay",
        temperature: 0,
        records: recorded
      })
      assert.strictEqual((yield* Effect.flip(other.complete(ask("b"))))._tag, "ReplayMissError")
    })
  )
})
