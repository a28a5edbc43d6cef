/**
 * A graceful stop, asked for from outside the training loop (the CLI asks on SIGTERM; an embedding application may
 * ask too): the loop finishes the step it is in, checkpoints it and ends with `stopped: "signal"`. While a loop runs
 * it holds the stop as `graceful()`, so the CLI knows a SIGTERM will be honoured at the step's end rather than by
 * interrupting everything at once.
 */
import { Effect } from "effect"

let asked = false
let holders = 0

/** Ask every running training loop to stop after its current step. */
export const request = (): void => {
  asked = true
}

/** Whether a stop was asked for (checked by the loop at each step's end). */
export const requested = (): boolean => asked

/** Whether a running loop will honour a stop request. */
export const graceful = (): boolean => holders > 0

/** Run `effect` as a loop that honours stop requests. */
export const honour = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      holders++
    }),
    () => effect,
    () =>
      Effect.sync(() => {
        holders--
      })
  )
