import { createServer } from "node:http"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { PromptRow } from "../../../src/domain/PromptRow.ts"
import type { ToolCallRecord } from "../../../src/domain/ToolCall.ts"
import type { Env, StepResult } from "../../../src/env/Env.ts"
import * as EnvRegistry from "../../../src/env/EnvRegistry.ts"
import * as ToolCallParser from "../../../src/env/ToolCallParser.ts"
import * as Db from "../../../src/env/tau/Db.ts"
import * as TauEnv from "../../../src/env/tau/TauEnv.ts"
import * as UserLlm from "../../../src/env/tau/UserLlm.ts"
import * as UserSimulator from "../../../src/env/tau/UserSimulator.ts"
import * as AgentLoop from "../../../src/generator/AgentLoop.ts"
import * as ByteTokenizer from "../../../src/tokenizer/ByteTokenizer.ts"
import * as Tokenizer from "../../../src/tokenizer/Tokenizer.ts"
import * as ScriptedEngine from "../../fixtures/ScriptedEngine.ts"

const dataDir = path.resolve("../shared/tau-bench")

const options = (user: UserSimulator.Strategy = "scripted", maxSteps = 30): TauEnv.TauEnvOptions => ({
  dataDir,
  domain: "retail",
  user,
  maxSteps,
  toolCallFormat: "auto"
})

/** A converter-style row for a task of the shared data. */
const rowOf = (domain: Db.Domain, split: string, id: number) =>
  Effect.map(Db.loadDomain(dataDir, domain), (data): PromptRow => {
    const task = data.tasks.find((t) => t.split === split && t.id === id)!
    return {
      data_source: `tau_bench/${domain}`,
      env_class: "tau_bench",
      prompt: [{ role: "system", content: data.wiki }],
      reward_spec: { method: "tau_bench", ground_truth: { actions: task.actions, outputs: task.outputs } },
      extra_info: { domain, split, task_id: id, instruction: task.instruction }
    }
  })

const callText = (name: string, args: Readonly<Record<string, unknown>>) =>
  ToolCallParser.toText({ name, arguments: args }, "hermes")

/** Drives an env with a scripted agent; stops at done or when the script ends. */
const drive = (env: Env, script: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const steps: Array<StepResult> = []
    for (const text of script) {
      const out = yield* env.step(text)
      steps.push(out)
      if (out.done) break
    }
    return steps
  })

const groundTruth = (row: PromptRow) =>
  (row.reward_spec!.ground_truth as { actions: ReadonlyArray<Db.Action> }).actions.map((a) =>
    callText(a.name, a.kwargs)
  )

const scriptedLayer = (o: TauEnv.TauEnvOptions) =>
  TauEnv.layer(o).pipe(
    Layer.provideMerge(EnvRegistry.layer()),
    Layer.provide(UserLlm.layerNone),
    Layer.provideMerge(NodeServices.layer)
  )

layer(scriptedLayer(options()))("TauEnv with the scripted user", (it) => {
  it.effect("init: wiki as the system prompt, the instruction as the user's first message, tools.json as tools", () =>
    Effect.gen(function* () {
      const row = yield* rowOf("retail", "test", 40)
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("tau_bench", row)
      const init = yield* env.init(row.prompt)
      const data = yield* Db.loadDomain(dataDir, "retail")
      assert.deepStrictEqual(
        init.messages.map((m) => m.role),
        ["system", "user"]
      )
      assert.strictEqual(init.messages[0]!.content, data.wiki)
      assert.strictEqual(init.messages[1]!.content, (row.extra_info as { instruction: string }).instruction)
      assert.strictEqual(init.metadata.tools?.length, 16)
    }).pipe(Effect.scoped)
  )

  it.effect("an agent that follows the ground truth and says the outputs gets reward 1; the user stops", () =>
    Effect.gen(function* () {
      const row = yield* rowOf("retail", "test", 40)
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("tau_bench", row)
      yield* env.init(row.prompt)
      const steps = yield* drive(env, [
        ...groundTruth(row),
        "Your gift card has a balance of $60; the order was paid with your Mastercard."
      ])
      assert.strictEqual(steps.length, 5)
      assert.isTrue(steps.slice(0, 4).every((s) => !s.done && s.reward === 0 && s.observations[0]!.role === "tool"))
      assert.strictEqual(steps[3]!.metadata.toolCalls[0]!.tool, "modify_pending_order_payment")
      const last = steps[4]!
      assert.isTrue(last.done)
      assert.strictEqual(last.reward, 1)
      assert.strictEqual(last.metadata.stopReason, "user_stop")
      const metrics = yield* env.metrics
      assert.strictEqual(metrics["tau/db_match"], 1)
      assert.strictEqual(metrics["tau/outputs_match"], 1)
      assert.strictEqual(metrics["env/tool_calls"], 4)
    }).pipe(Effect.scoped)
  )

  it.effect("one wrong mutation (paypal instead of visa) gets 0: the user does not stop, the transfer ends it", () =>
    Effect.gen(function* () {
      const row = yield* rowOf("retail", "test", 40)
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("tau_bench", row)
      yield* env.init(row.prompt)
      const script = groundTruth(row)
      script[3] = callText("modify_pending_order_payment", {
        order_id: "#W4923227",
        payment_method_id: "paypal_1621947"
      })
      const steps = yield* drive(env, [
        ...script,
        "Your gift card has $60 and you paid with mastercard. Would you like to proceed with anything else?",
        callText("transfer_to_human_agents", { summary: "wrong change" })
      ])
      const reply = steps[4]!
      assert.isFalse(reply.done)
      assert.deepStrictEqual(reply.observations, [{ role: "user", content: "Yes, please proceed." }])
      const last = steps[5]!
      assert.isTrue(last.done)
      assert.strictEqual(last.metadata.stopReason, "transfer")
      assert.strictEqual(last.reward, 0)
      assert.strictEqual((yield* env.metrics)["tau/db_match"], 0)
    }).pipe(Effect.scoped)
  )

  it.effect('the right DB without a required output gets 0 ("sixty" is not "60"); the user restates the need', () =>
    Effect.gen(function* () {
      const row = yield* rowOf("retail", "test", 40)
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("tau_bench", row)
      yield* env.init(row.prompt)
      const steps = yield* drive(env, [
        ...groundTruth(row),
        "Your gift card has sixty dollars, paid by Mastercard.",
        callText("transfer_to_human_agents", { summary: "s" })
      ])
      assert.deepStrictEqual(steps[4]!.observations[0]!.content.startsWith("Here is what I need: "), true)
      assert.strictEqual(steps[5]!.reward, 0)
      const metrics = yield* env.metrics
      assert.strictEqual(metrics["tau/db_match"], 1)
      assert.strictEqual(metrics["tau/outputs_match"], 0)
    }).pipe(Effect.scoped)
  )

  it.effect("airline: the ground truth of test 9 (3 bookings) with its outputs said gets reward 1", () =>
    Effect.gen(function* () {
      const row = yield* rowOf("airline", "test", 9)
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("tau_bench", row)
      const init = yield* env.init(row.prompt)
      assert.strictEqual(init.metadata.tools?.length, 14)
      const steps = yield* drive(env, [...groundTruth(row), "The totals are 327, 1,000 and 1,286 dollars."])
      assert.strictEqual(steps.at(-1)!.reward, 1)
    }).pipe(Effect.scoped)
  )

  it.effect("only the first tool call of a turn runs; unknown tools and bad arguments are observations", () =>
    Effect.gen(function* () {
      const row = yield* rowOf("retail", "test", 40)
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("tau_bench", row)
      yield* env.init(row.prompt)
      const two = `${callText("think", { thought: "a" })}\n${callText("transfer_to_human_agents", { summary: "b" })}`
      const [first, unknown, missing] = yield* drive(env, [
        two,
        callText("refund_everything", {}),
        callText("get_order_details", {})
      ])
      assert.isFalse(first!.done)
      assert.deepStrictEqual(
        first!.metadata.toolCalls.map((c) => c.tool),
        ["think"]
      )
      assert.strictEqual(unknown!.observations[0]!.content, "Unknown action refund_everything")
      assert.strictEqual(
        missing!.observations[0]!.content,
        "Error: GetOrderDetails.invoke() missing 1 required positional argument: 'order_id'"
      )
      assert.strictEqual((yield* env.metrics)["env/tool_errors"], 2)
    }).pipe(Effect.scoped)
  )
})

layer(scriptedLayer(options("scripted", 3)))("TauEnv max steps", (it) => {
  it.effect("the episode is cut after max_steps actions with reward 0, even when the DB is right", () =>
    Effect.gen(function* () {
      const row = yield* rowOf("retail", "test", 17) // one read, then the address change
      const env = yield* (yield* EnvRegistry.EnvRegistry).make("tau_bench", row)
      yield* env.init(row.prompt)
      const steps = yield* drive(env, [...groundTruth(row), callText("think", { thought: "x" }), "done"])
      const last = steps.at(-1)!
      assert.strictEqual(steps.length, 3)
      assert.isTrue(last.done)
      assert.strictEqual(last.metadata.stopReason, "max_turns")
      assert.strictEqual(last.reward, 0)
    }).pipe(Effect.scoped)
  )
})

// ---------------------------------------------------------------------------------------------------------------
// LLM user over HTTP: a local OpenAI-compatible endpoint that answers by rule, then a replay without it.

const withEndpoint = <A, E, R>(
  body: (url: string, requests: Array<unknown>) => Effect.Effect<A, E, R>,
  special: (last: string) => string | undefined = () => undefined
) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ url: string; close: () => void; requests: Array<unknown> }>((resolve) => {
          const requests: Array<unknown> = []
          const server = createServer((req, res) => {
            let body = ""
            req.on("data", (c) => (body += c))
            req.on("end", () => {
              const request = JSON.parse(body) as { messages: ReadonlyArray<{ role: string; content: string }> }
              requests.push(request)
              const last = request.messages.at(-1)!.content
              const content =
                special(last) ??
                (last.startsWith("You are a supervisor")
                  ? "true"
                  : last.includes("$60")
                    ? "###STOP###"
                    : last === "Hi! How can I help you today?"
                      ? "Hi, I want to know my gift card balance."
                      : "My email is isabella.lopez3271@example.com.")
              res.setHeader("content-type", "application/json")
              res.end(JSON.stringify({ choices: [{ message: { role: "assistant", content } }] }))
            })
          })
          server.listen(0, "127.0.0.1", () => {
            const address = server.address() as { port: number }
            resolve({ url: `http://127.0.0.1:${address.port}/v1`, close: () => server.close(), requests })
          })
        })
    ),
    (s) => Effect.sync(() => s.close())
  ).pipe(Effect.flatMap((s) => body(s.url, s.requests)))

const llmEpisode = (userLayer: Layer.Layer<UserLlm.UserLlm>, strategy: UserSimulator.Strategy) =>
  Effect.gen(function* () {
    const row = yield* rowOf("retail", "test", 40)
    const registry = yield* EnvRegistry.EnvRegistry
    const env = yield* registry.make("tau_bench", row)
    const init = yield* env.init(row.prompt)
    const steps = yield* drive(env, [
      "How can I help?",
      ...groundTruth(row),
      "Your balance is $60 and you used the mastercard."
    ])
    return { init, steps }
  }).pipe(
    Effect.scoped,
    Effect.provide(
      TauEnv.layer(options(strategy)).pipe(
        Layer.provideMerge(EnvRegistry.layer()),
        Layer.provide(userLayer),
        Layer.provide(NodeServices.layer)
      )
    )
  )

describe("TauEnv with an LLM user", () => {
  it.effect(
    "llm: the user speaks through the endpoint, with upstream's prompt; a recorded episode replays without it",
    () =>
      withEndpoint((url, requests) =>
        Effect.gen(function* () {
          const service = UserLlm.makeRecord({ url, model: "user-model" })
          const live = yield* llmEpisode(Layer.succeed(UserLlm.UserLlm, service), "llm")
          assert.strictEqual(live.init.messages[1]!.content, "Hi, I want to know my gift card balance.")
          assert.strictEqual(live.steps[0]!.observations[0]!.content, "My email is isabella.lopez3271@example.com.")
          const last = live.steps.at(-1)!
          assert.isTrue(last.done)
          assert.strictEqual(last.metadata.stopReason, "user_stop")
          assert.strictEqual(last.reward, 1)
          const first = requests[0] as { model: string; messages: ReadonlyArray<{ role: string; content: string }> }
          assert.strictEqual(first.model, "user-model")
          assert.isTrue(
            first.messages[0]!.content.startsWith(
              "You are a user interacting with an agent.\n\nInstruction: You are Isabella Lopez"
            )
          )
          assert.strictEqual(first.messages[1]!.content, "Hi! How can I help you today?")
          // the step metadata carries every user LLM call (the first one rides on the first step)
          const logged: Array<ToolCallRecord> = live.steps.flatMap((s) =>
            s.metadata.toolCalls.filter((c) => c.server === UserLlm.server)
          )
          assert.strictEqual(logged.length, 3)
          assert.deepStrictEqual(logged, [...(yield* service.recorded)])
          const replayed = yield* llmEpisode(UserLlm.layerReplay(logged), "llm")
          assert.strictEqual(requests.length, 3) // replay called no endpoint
          assert.deepStrictEqual(
            replayed.steps.map((s) => s.observations),
            live.steps.map((s) => s.observations)
          )
          assert.strictEqual(replayed.steps.at(-1)!.reward, 1)
        })
      ).pipe(Effect.scoped, Effect.provide(NodeServices.layer))
  )

  it.effect("verify: every reply is judged by the supervisor prompt; a replay miss is an EnvError", () =>
    withEndpoint((url, requests) =>
      Effect.gen(function* () {
        const live = yield* llmEpisode(UserLlm.layerHttp({ url, model: "m" }), "verify")
        assert.strictEqual(live.steps.at(-1)!.reward, 1)
        assert.strictEqual(requests.length, 6) // 3 replies, each judged once
        const judge = requests[1] as { messages: ReadonlyArray<{ content: string }> }
        assert.isTrue(judge.messages[0]!.content.includes("# Transcript:\nSystem: You are a user interacting"))
        const miss = yield* Effect.flip(llmEpisode(UserLlm.layerReplay([]), "verify"))
        assert.strictEqual(miss._tag === "EnvError" ? miss.reason : miss._tag, "ReplayMiss")
      })
    ).pipe(Effect.scoped, Effect.provide(NodeServices.layer))
  )
})

// ---------------------------------------------------------------------------------------------------------------
// Driven by the generator, as in training: the env's observations go through the chat template.

describe("TauEnv under AgentLoop", () => {
  it.effect(
    "a policy that makes the ground-truth calls and says the outputs: reward 1 on the last turn, env_done",
    () =>
      Effect.gen(function* () {
        const row = yield* rowOf("retail", "test", 40).pipe(Effect.provide(NodeServices.layer))
        const script = [...groundTruth(row), "Your gift card balance is $60; you paid with your mastercard."]
        const tokenizer = ByteTokenizer.make()
        const services = Layer.mergeAll(
          ScriptedEngine.layer(tokenizer, (_, call) => script[call] ?? "nothing more"),
          Tokenizer.layerImpl(tokenizer),
          scriptedLayer(options())
        )
        const t = yield* AgentLoop.run(row, 0, {
          maxTurns: 10,
          maxGenerateLength: 512,
          maxInputLength: 200_000,
          temperature: 1,
          topP: 1,
          topK: 0,
          stopStrings: [],
          seed: 0
        }).pipe(Effect.provide(services))
        assert.strictEqual(t.error, undefined)
        assert.strictEqual(t.stopReason, "env_done")
        assert.strictEqual(t.turns.length, 5)
        assert.deepStrictEqual(
          t.turns.map((turn) => turn.reward),
          [0, 0, 0, 0, 1]
        )
        assert.strictEqual(t.reward, 1)
        assert.deepStrictEqual(
          t.turns[0]!.toolCalls.map((c) => [c.tool, c.result]),
          [["find_user_id_by_email", "isabella_lopez_6490"]]
        )
        // the tool result reached the policy's context as template tokens with loss mask 0
        const between = t.responseIds.slice(t.turns[0]!.end, t.turns[1]!.start)
        assert.include(tokenizer.decode(between), "isabella_lopez_6490")
        assert.isTrue(t.lossMask.slice(t.turns[0]!.end, t.turns[1]!.start).every((m) => m === 0))
      })
  )
})

describe("UserSimulator.parseReact (upstream's parse, bug kept)", () => {
  it.effect("###STOP### anywhere wins; otherwise the text after Thought: is returned, thought and all", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* UserSimulator.parseReact("Thought:\ndone\n\nUser Response:\n###STOP###"), "###STOP###")
      assert.strictEqual(
        yield* UserSimulator.parseReact("Thought:\nI should ask.\n\nUser Response:\nWhere is my order?"),
        "I should ask.\n\nUser Response:\nWhere is my order?"
      )
      assert.strictEqual(yield* UserSimulator.parseReact("User Response: hello"), "hello")
      const bad = yield* Effect.flip(UserSimulator.parseReact("just text"))
      assert.strictEqual(bad.reason, "BadResponse")
    })
  )
})

describe("TauEnv with a reflection user", () => {
  it.effect("a reply judged false is reflected on and replaced by a new reply judged true", () =>
    withEndpoint(
      (url, requests) =>
        Effect.gen(function* () {
          const live = yield* llmEpisode(UserLlm.layerHttp({ url, model: "m" }), "reflection")
          const asked = requests as Array<{ messages: ReadonlyArray<{ role: string; content: string }> }>
          // generate, judge (false), reflect, generate again from the reflected message, judge (true)
          assert.isTrue(asked[1]!.messages[0]!.content.includes("you need to verify if it is satisfactory"))
          assert.isTrue(asked[2]!.messages[0]!.content.includes("marked as unsatisfactory by you"))
          assert.deepStrictEqual(asked[3]!.messages.at(-1), { role: "user", content: "Please check my gift card." })
          assert.strictEqual(live.init.messages[1]!.content, "My email is isabella.lopez3271@example.com.")
          assert.strictEqual(live.steps.at(-1)!.reward, 1)
        }),
      (last) =>
        last.includes("marked as unsatisfactory")
          ? "Reflection: too vague.\n\nResponse: Please check my gift card."
          : last.startsWith("You are a supervisor") && last.includes("# Response:\nHi, I want to know")
            ? "false"
            : undefined
    ).pipe(Effect.scoped, Effect.provide(NodeServices.layer))
  )
})
