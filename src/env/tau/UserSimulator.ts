/**
 * The simulated customer of a tau-bench episode (upstream `tau_bench/envs/user.py`).
 *
 * - `scripted` (ours, deterministic, for tests and offline runs): states the task's instruction, answers a request
 *   for confirmation with "Yes, please proceed.", restates the instruction to anything else, and says `###STOP###`
 *   once the task is done (the DB matches the ground truth and every required output was said).
 * - `llm`: upstream's default. The chat is a system prompt holding the instruction, then "Hi! How can I help you
 *   today?" as a `user` turn; roles are flipped (the agent speaks as `user`, the simulator as `assistant`).
 * - `react`: asks for `Thought:` then `User Response:`; a reply with `###STOP###` becomes exactly `###STOP###`;
 *   otherwise upstream's parse bug is kept: the text after `Thought:` is returned, thought included.
 * - `verify`: up to 3 samples, each judged true/false by the same model as supervisor; the first judged true is kept
 *   and joins the conversation; when none is, the last sample is returned and (upstream's bug) not added to it.
 * - `reflection`: one sample judged; if false, up to one reflection + new sample, which is returned if judged true,
 *   else the first sample.
 *
 * Departure: upstream formats the verify prompt's response as the message object's repr; here it is its text.
 * Every LLM call's record comes back with the reply, for the episode log and replay (see UserLlm).
 */
import { Effect } from "effect"
import type { ToolCallRecord } from "../../domain/ToolCall.ts"
import { type ChatMessage, UserLlmError, type UserLlmSession } from "./UserLlm.ts"

export const strategies = ["scripted", "llm", "react", "verify", "reflection"] as const
export type Strategy = (typeof strategies)[number]

export const stopToken = "###STOP###"

export interface UserTurn {
  readonly text: string
  /** The user LLM calls this turn made, in order (none for the scripted user). */
  readonly records: ReadonlyArray<ToolCallRecord>
}

export interface UserSimulator {
  readonly strategy: Strategy
  readonly reset: (instruction: string) => Effect.Effect<UserTurn, UserLlmError>
  readonly step: (agentText: string) => Effect.Effect<UserTurn, UserLlmError>
}

// ---------------------------------------------------------------------------------------------------------------
// Scripted

const confirmation = /\b(confirm|confirmation|proceed|go ahead|yes\/no|\(yes\))\b/i

/** The deterministic user. `isDone` tells it whether the task is accomplished so far. */
export const scripted = (isDone: () => boolean): UserSimulator => {
  let instruction = ""
  return {
    strategy: "scripted",
    reset: (text) =>
      Effect.sync(() => {
        instruction = text
        return { text, records: [] }
      }),
    step: (agentText) =>
      Effect.sync(() => ({
        text: isDone()
          ? stopToken
          : confirmation.test(agentText)
            ? "Yes, please proceed."
            : `Here is what I need: ${instruction}`,
        records: []
      }))
  }
}

// ---------------------------------------------------------------------------------------------------------------
// LLM strategies (prompts verbatim from upstream)

const instructionDisplay = (instruction: string) => `\n\nInstruction: ${instruction}\n`

export const llmSystemPrompt = (instruction: string): string =>
  `You are a user interacting with an agent.${instructionDisplay(instruction)}
Rules:
- Just generate one line at a time to simulate the user's message.
- Do not give away all the instruction at once. Only provide the information that is necessary for the current step.
- Do not hallucinate information that is not provided in the instruction. For example, if the agent asks for the order id but it is not mentioned in the instruction, do not make up an order id, just say you do not remember or have it.
- If the instruction goal is satisified, generate '###STOP###' as a standalone message without anything else to end the conversation.
- Do not repeat the exact instruction in the conversation. Instead, use your own words to convey the same information.
- Try to make the conversation as natural as possible, and stick to the personalities in the instruction.`

export const reactSystemPrompt = (instruction: string): string =>
  `You are a user interacting with an agent.${instructionDisplay(instruction)}
Rules:
- First, generate a Thought about what to do next (this message will not be sent to the agent).
- Then, generate a one line User Response to simulate the user's message (this message will be sent to the agent).
- Do not give away all the instruction at once. Only provide the information that is necessary for the current step.
- Do not hallucinate information that is not provided in the instruction. For example, if the agent asks for the order id but it is not mentioned in the instruction, do not make up an order id, just say you do not remember or have it.
- If the instruction goal is satisified, generate '###STOP###' as the User Response without anything else to end the conversation.
- Do not repeat the exact instruction in the conversation. Instead, use your own words to convey the same information.
- Try to make the conversation as natural as possible, and stick to the personalities in the instruction.

Format:

Thought:
<the thought>

User Response:
<the user response (this will be parsed and sent to the agent)>`

export const greeting = "Hi! How can I help you today?"

const roleLabel = (role: string) =>
  role === "user" ? "Customer" : role === "assistant" ? "Agent" : role.charAt(0).toUpperCase() + role.slice(1)

const transcript = (messages: ReadonlyArray<ChatMessage>) =>
  messages.map((m) => `${roleLabel(m.role)}: ${m.content}`).join("\n")

export const verifyPrompt = (response: string, messages: ReadonlyArray<ChatMessage>): string =>
  `You are a supervisor of the Agent in the conversation. You are given a Transcript of a conversation between a Customer and an Agent. The Customer has generated a Response, and you need to verify if it is satisfactory (true) or not (false).
Your answer will be parsed, so do not include any other text than the classification (true or false).
    
# Transcript:
${transcript(messages)}

# Response:
${response}

-----

Classification:`

export const reflectPrompt = (response: string, messages: ReadonlyArray<ChatMessage>): string =>
  `You are a supervisor of the Agent in the conversation. You are given a Transcript of a conversation between a (simulated) Customer and an Agent. The Customer generated a Response that was marked as unsatisfactory by you.
You need to generate a Reflection on what went wrong in the conversation, and propose a new Response that should fix the issues.
Your answer will be parsed, so do not include any other text than the classification (true or false).
    
# Transcript:
${transcript(messages)}

# Response:
${response}

# Format:

Reflection:
<the reflection>

Response:
<the response (this will be parsed and sent to the agent)>`

const badResponse = (message: string) => new UserLlmError({ reason: "BadResponse", message })

/** Python `a, b = text.split(sep)`: exactly one separator, else a ValueError. */
const splitOnce = (text: string, sep: string): Effect.Effect<string, UserLlmError> => {
  const parts = text.split(sep)
  return parts.length === 2
    ? Effect.succeed(parts[1]!.trim())
    : Effect.fail(badResponse(`user reply has ${parts.length - 1} "${sep}" markers, expected 1: ${text.slice(0, 200)}`))
}

/** Upstream's ReAct parse, bug included (`Thought:` is checked first, so the thought is kept). */
export const parseReact = (response: string): Effect.Effect<string, UserLlmError> =>
  response.includes(stopToken)
    ? Effect.succeed(stopToken)
    : response.includes("Thought:")
      ? splitOnce(response, "Thought:")
      : response.includes("User Response:")
        ? splitOnce(response, "User Response:")
        : Effect.fail(badResponse(`Invalid response format: ${response.slice(0, 200)}`))

/** An LLM user of `strategy` over one session of the user LLM. */
export const llm = (session: UserLlmSession, strategy: Exclude<Strategy, "scripted">): UserSimulator => {
  let messages: Array<ChatMessage> = []
  const records: Array<ToolCallRecord> = []

  const complete = (chat: ReadonlyArray<ChatMessage>) =>
    session.complete(chat).pipe(
      Effect.map((c) => {
        records.push(c.record)
        return c.content
      })
    )
  const judge = (response: string, chat: ReadonlyArray<ChatMessage>) =>
    complete([{ role: "user", content: verifyPrompt(response, chat) }]).pipe(
      Effect.map((verdict) => verdict.toLowerCase().includes("true"))
    )
  /** LLMUserSimulationEnv.generate_next_message: the reply joins the conversation. */
  const generate = (chat: ReadonlyArray<ChatMessage>) =>
    Effect.map(complete(chat), (content) => {
      messages.push({ role: "assistant", content })
      return content
    })

  const next: (chat: ReadonlyArray<ChatMessage>) => Effect.Effect<string, UserLlmError> = {
    llm: generate,
    react: (chat: ReadonlyArray<ChatMessage>) => Effect.flatMap(generate(chat), parseReact),
    verify: (chat: ReadonlyArray<ChatMessage>) =>
      Effect.gen(function* () {
        let last = ""
        for (let attempt = 0; attempt < 3; attempt++) {
          last = yield* complete(chat)
          if (yield* judge(last, chat)) {
            messages.push({ role: "assistant", content: last })
            return last
          }
        }
        return last
      }),
    reflection: (chat: ReadonlyArray<ChatMessage>) =>
      Effect.gen(function* () {
        const current = [...chat]
        const initial = yield* generate(current)
        if (yield* judge(initial, current)) return initial
        const reflection = yield* complete([{ role: "user", content: reflectPrompt(initial, current) }])
        current.push({ role: "user", content: yield* splitOnce(reflection, "Response:") })
        const revised = yield* generate(current)
        return (yield* judge(revised, current)) ? revised : initial
      })
  }[strategy]

  const turn = (run: Effect.Effect<string, UserLlmError>) =>
    Effect.suspend(() => {
      records.length = 0
      return Effect.map(run, (text): UserTurn => ({ text, records: [...records] }))
    })

  return {
    strategy,
    reset: (instruction) =>
      turn(
        Effect.suspend(() => {
          messages = [
            {
              role: "system",
              content: strategy === "react" ? reactSystemPrompt(instruction) : llmSystemPrompt(instruction)
            },
            { role: "user", content: greeting }
          ]
          return next([...messages])
        })
      ),
    step: (agentText) =>
      turn(
        Effect.suspend(() => {
          messages.push({ role: "user", content: agentText })
          return next([...messages])
        })
      )
  }
}
