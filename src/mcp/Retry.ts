/**
 * The retry rule for tool calls (never re-drive a stateful call twice): a failed call is sent again only when
 *   1. it certainly never reached the server (connecting or restarting failed, or the transport refused the write:
 *      process already gone, connection refused), or
 *   2. it failed with a retryable reason (Timeout, Disconnected) on a `shared` server and the server declared the tool
 *      `readOnlyHint` or `idempotentHint`, so a second delivery cannot change any state.
 * Everything else (a tool error, bad arguments, a timeout on a tool that may write) is returned to the caller once.
 *
 * `retries` counts a call's own failed deliveries, not its attempts:
 *   - A crash takes down every call in flight on the server, though at most one of them caused it: each of the N
 *     calls it took down is charged 1/N of a delivery. Without this, one crash spent a retry of every call in flight,
 *     and with a few concurrent callers a crashing server's disconnects reached the policy almost every time.
 *   - Calls re-driven after a crash go to the restarted server one at a time: sent all at once, the next crash would
 *     take them all down again, and a call that crashes the server on every delivery would never be told apart from
 *     the calls it takes down with it.
 *   - An attempt that never reached a server (the restart failed, e.g. the server died during the handshake) is not
 *     a delivery; at most `retries` of those in a row.
 * A call fails once more than `retries` deliveries are charged to it. Retries wait 25 ms, then 50 ms · 2^n (jittered,
 * at most 1 s); a call that succeeds first time never enters the retry machinery.
 */

import { Schedule } from "effect"
import type { ToolCallError } from "./Errors.ts"

/** One failed attempt of a call, as the retry rule reads it. */
export interface CallFailure {
  readonly error: ToolCallError
  readonly delivered: boolean
  /** The part of this failure charged to the call: 1, 1/N for a crash that took N calls down, 0 if never delivered. */
  readonly share: number
}

/** Whether the rule lets a failed call be sent again (`reDrivable`: rule 2's tool and server conditions). */
export const mayRetry = (f: CallFailure, reDrivable: () => boolean): boolean =>
  !f.delivered || (f.error.isRetryable && reDrivable())

/** A failure of a call that reached the server and lost it: a crash, or a kill from outside. */
export const crashed = (f: CallFailure): boolean => f.delivered && f.error.reason === "Disconnected"

/**
 * What a call's failures have cost it: deliveries are charged their share, attempts that never reached a server are
 * counted in a row. `spend` answers whether the call may be sent again.
 */
export class RetryBudget {
  charged = 0
  refused = 0
  readonly retries: number
  constructor(retries: number) {
    this.retries = retries
  }
  spend(f: CallFailure): boolean {
    if (f.delivered) {
      this.charged += f.share
      this.refused = 0
    } else {
      this.refused++
    }
    // a little slack: three crashes shared by three calls charge each 1/3 + 1/3 + 1/3, which may round past 1
    return this.charged <= this.retries + 1e-9 && this.refused <= this.retries
  }
}

/** The wait before the first retry. */
export const backoffStart = "25 millis"
/** The waits between later retries: capped, as a call whose crashes were shared may be re-driven more than `retries` times. */
export const backoff = Schedule.min([
  Schedule.exponential("50 millis", 2).pipe(Schedule.jittered),
  Schedule.spaced("1 second")
])
