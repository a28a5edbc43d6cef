/**
 * `math`: a single-turn answer environment (SkyRL's gsm8k-style env). The policy answers once; the reward is the
 * row's rule reward (`reward_spec`, e.g. `{ method: "rule", ground_truth: { answer: 42, answer_match: "numeric" } }`)
 * on the final answer: `<answer>…</answer>` when present, else the whole reply (thinking blocks stripped).
 */
import { Effect } from "effect"
import type { PromptRow } from "../domain/PromptRow.ts"
import { type Env, EnvError } from "./Env.ts"
import * as EnvRegistry from "./EnvRegistry.ts"
import * as Rewards from "./Rewards.ts"
import * as ToolCallParser from "./ToolCallParser.ts"

export const envClass = "math"

/** The answer a reply gives: `<answer>` content, else the reply without thinking, trimmed. */
export const answerOf = (text: string): string => {
  const parsed = ToolCallParser.parse(text, "auto")
  return (parsed.finalAnswer ?? text).trim()
}

export const make = (row: PromptRow) =>
  Effect.sync((): Env => {
    let turns = 0
    let correct = 0
    return {
      envClass,
      init: (prompt) => Effect.succeed({ messages: prompt, metadata: {} }),
      step: (text) =>
        Effect.gen(function* () {
          turns += 1
          const finalAnswer = answerOf(text)
          const result = yield* Rewards.evaluate(row.reward_spec, { calls: [], finalAnswer, turn: 0, done: true }).pipe(
            Effect.mapError(
              (e) =>
                new EnvError({ envClass, reason: "Reward", message: `${row.uid ?? "row"}: ${e.message}`, cause: e })
            )
          )
          correct = result.reward
          return {
            observations: [],
            reward: result.reward,
            done: true,
            metadata: { toolCalls: [], finalAnswer, stopReason: "answer" }
          }
        }),
      metrics: Effect.sync(() => ({ "env/turns": turns, "env/reward": correct })),
      close: Effect.void
    }
  })

/** Registers `math` in the EnvRegistry. */
export const layer = EnvRegistry.layerRegister(envClass, make)
