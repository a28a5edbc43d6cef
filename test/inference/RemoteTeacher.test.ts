/**
 * A distillation teacher behind an OpenAI-compatible server: against our own `serve` (the quickstart policy, in
 * process) it gives the local teacher's log-probs; a server that answers garbage or fails is a TeacherError naming
 * why, which ends the group's trajectories `error` while the run goes on. The wire is vLLM's `prompt_logprobs`.
 */
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Duration, Effect } from "effect"
import { FetchHttpClient, HttpClient } from "effect/http"
import * as Teacher from "../../src/inference/Teacher.ts"
import * as Checkpoint from "../../src/model/Checkpoint.ts"
import * as Transformer from "../../src/model/Transformer.ts"
import { policyDir, useQuickstartServe } from "../fixtures/QuickstartServe.ts"
import * as Trajectories from "../fixtures/Trajectories.ts"

const served = useQuickstartServe()

const remoteAt = (base: string, retries = 0) =>
  Effect.map(Effect.service(HttpClient.HttpClient), (client) =>
    Teacher.remote(
      { client, apiKey: undefined, timeout: Duration.seconds(30), maxRetries: retries },
      { base, model: "quickstart", source: `${base}/v1`, concurrency: 4 }
    )
  ).pipe(Effect.provide(FetchHttpClient.layer))

/** A server that answers every POST with `status` and `body`, counting the requests. */
let garbage: { server: Server; url: string; body: string; status: number; requests: number }
beforeAll(async () => {
  garbage = { server: createServer(), url: "", body: "", status: 200, requests: 0 }
  garbage.server.on("request", (req, res) => {
    garbage.requests++
    req.resume()
    req.on("end", () => res.writeHead(garbage.status, { "content-type": "application/json" }).end(garbage.body))
  })
  await new Promise<void>((resolve) => garbage.server.listen(0, "127.0.0.1", resolve))
  garbage.url = `http://127.0.0.1:${(garbage.server.address() as AddressInfo).port}`
})
afterAll(() => garbage.server.close())

const sequences = [
  [258, 117, 10, 72, 105, 33],
  [258, 117, 10, 55, 56]
]

describe("Teacher.remote", () => {
  it("gives the local teacher's log-probs through serve's prompt_logprobs (1e-5)", async () => {
    const teacher = await Effect.runPromise(remoteAt(served.url))
    const remote = await Effect.runPromise(teacher.score(sequences))
    const { model } = await Checkpoint.load(policyDir)
    try {
      const local = await Effect.runPromise(Teacher.local(model, { source: "local", temperature: 1 }).score(sequences))
      for (const [b, row] of local.entries()) {
        assert.strictEqual(remote[b]!.length, row.length)
        for (const [i, v] of row.entries()) assert.closeTo(remote[b]![i]!, v, 1e-5)
      }
    } finally {
      Transformer.dispose(model)
    }
  })

  it("fails with a TeacherError naming what is wrong when the server answers garbage or an error", async () => {
    const teacher = await Effect.runPromise(remoteAt(garbage.url))
    const failure = async () => {
      const error = await Effect.runPromise(Effect.flip(teacher.score([sequences[1]!])))
      assert.strictEqual(error._tag, "TeacherError")
      return error.message
    }
    garbage.body = JSON.stringify({ choices: [{ text: "" }] })
    assert.include(await failure(), "no choices[0].prompt_logprobs")
    garbage.body = JSON.stringify({ choices: [{ prompt_logprobs: [null, { "117": { logprob: -1 } }] }] })
    assert.include(await failure(), "has 2 entries for a prompt of 5 tokens")
    const entries = [null, { "117": { logprob: -1 } }, { "10": { logprob: 0.5 } }, { "55": { logprob: -2 } }, null]
    garbage.body = JSON.stringify({ choices: [{ prompt_logprobs: entries }] })
    assert.include(await failure(), "prompt_logprobs[2] holds no log-prob ≤ 0 of token 10")
    garbage.body = "not json"
    assert.include(await failure(), "not JSON")
    garbage.status = 400
    garbage.body = JSON.stringify({ error: { message: "token id 999999 is out of vocabulary" } })
    assert.include(await failure(), "out of vocabulary")
  })

  it("ends the trajectories of a group it could not score `error`, after its retries, and the scorer goes on", async () => {
    garbage.status = 503
    garbage.body = "{}"
    garbage.requests = 0
    const teacher = await Effect.runPromise(remoteAt(garbage.url, 2))
    const trajectory = Trajectories.oneTurn({
      uid: "p",
      sample: 0,
      prompt: [258, 117, 10],
      response: [55, 56],
      reward: 0,
      rolloutLogprob: -1
    })
    const group = { promptUid: "p", cursor: 0, dataSource: "t", envClass: "t", trajectories: [trajectory] }
    const scored = await Effect.runPromise(Teacher.scorer(teacher, { cacheSize: 16, pricePerToken: 0 })(group))
    assert.strictEqual(garbage.requests, 3, "the first request and two retries")
    assert.strictEqual(scored.trajectories[0]!.stopReason, "error")
    assert.match(scored.trajectories[0]!.error!, new RegExp(`^teacher ${garbage.url}/v1: `))
    assert.deepInclude(scored.teacher!, { calls: 1, failed: 1 })
  })
})
