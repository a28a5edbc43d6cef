/**
 * Cancels one call: the part of `AbortSignal` that the SDK's `Protocol.request` reads (`throwIfAborted`, `aborted`,
 * `reason`, an `abort` listener, which sends `notifications/cancelled`). An `AbortController` per call, with the
 * listener the SDK adds to it, costs microseconds of EventTarget bookkeeping on every call (measured by the
 * mcp-latency bench); a cancelled call is rare. Interrupting the calling fiber aborts it.
 */
export class CallCancel {
  aborted = false
  reason: unknown = undefined
  private listener: (() => void) | undefined = undefined
  private more: Array<() => void> | undefined = undefined
  throwIfAborted(): void {
    if (this.aborted) throw this.reason
  }
  addEventListener(type: string, listener: () => void): void {
    if (type !== "abort") return
    if (this.listener === undefined) this.listener = listener
    else if (this.more === undefined) this.more = [listener]
    else this.more.push(listener)
  }
  removeEventListener(type: string, listener: () => void): void {
    if (type !== "abort") return
    if (this.listener === listener) this.listener = undefined
    else if (this.more !== undefined) this.more = this.more.filter((l) => l !== listener)
  }
  abort(reason: unknown): void {
    if (this.aborted) return
    this.aborted = true
    this.reason = reason
    this.listener?.()
    for (const l of this.more ?? []) l()
  }
  /** As the SDK's RequestOptions type it. */
  get signal(): AbortSignal {
    return this as unknown as AbortSignal
  }
}
