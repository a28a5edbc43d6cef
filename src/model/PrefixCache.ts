/**
 * Prefix caching across requests (vLLM's automatic prefix caching, at sequence granularity): the keys/values of a
 * finished request's tokens are kept, and a later request whose prompt starts with them (the next turn of a
 * multi-turn episode: previous prompt + response + tool output) prefills only the rest.
 *
 * Entries are one-row caches keyed by their token sequence, evicted least-recently-used beyond a byte budget; an entry
 * that a longer one extends is dropped. Cached keys/values belong to the weights that computed them: the owner must
 * `clear` the cache when the weights change.
 */
import * as KvCache from "./KvCache.ts"

interface Entry {
  readonly tokens: ReadonlyArray<number>
  readonly cache: KvCache.KvCache // one row, holding exactly `tokens`
  readonly bytes: number
  lastUsed: number
}

export interface Hit {
  readonly cache: KvCache.KvCache // a fresh one-row copy holding the first `length` prompt tokens (caller owns it)
  readonly length: number
}

export interface PrefixCache {
  /** The longest cached prefix of `prompt`, at most `prompt.length − 1` tokens (the last one must run for logits). */
  readonly lookup: (prompt: ReadonlyArray<number>) => Hit | undefined
  /** Keep `cache` (one row holding exactly `tokens`; the prefix cache takes ownership). */
  readonly store: (tokens: ReadonlyArray<number>, cache: KvCache.KvCache) => void
  readonly clear: () => void
  readonly bytes: () => number
}

const isPrefix = (prefix: ReadonlyArray<number>, of: ReadonlyArray<number>, length: number): boolean => {
  for (let i = 0; i < length; i++) if (prefix[i] !== of[i]) return false
  return true
}

/** A prefix cache holding at most `maxBytes` of keys/values; `minTokens` is the shortest prefix worth reusing. */
export const make = (maxBytes: number, minTokens = 4): PrefixCache => {
  let entries: Array<Entry> = []
  let clock = 0
  const total = () => entries.reduce((n, e) => n + e.bytes, 0)
  const drop = (e: Entry) => KvCache.dispose(e.cache)

  const lookup = (prompt: ReadonlyArray<number>): Hit | undefined => {
    let best: Entry | undefined
    let bestLength = 0
    for (const e of entries) {
      // the common prefix, capped so the prompt's last token still runs
      const cap = Math.min(e.tokens.length, prompt.length - 1)
      let n = 0
      while (n < cap && e.tokens[n] === prompt[n]) n++
      if (n > bestLength) {
        best = e
        bestLength = n
      }
    }
    if (best === undefined || bestLength < minTokens) return undefined
    best.lastUsed = ++clock
    return { cache: KvCache.prefixOf(best.cache, bestLength), length: bestLength }
  }

  const store = (tokens: ReadonlyArray<number>, cache: KvCache.KvCache): void => {
    const bytes = KvCache.byteSize(cache)
    if (tokens.length < minTokens || bytes > maxBytes) {
      KvCache.dispose(cache)
      return
    }
    // entries this one extends (or repeats) are redundant
    const kept: Array<Entry> = []
    for (const e of entries) {
      if (e.tokens.length <= tokens.length && isPrefix(e.tokens, tokens, e.tokens.length)) drop(e)
      else kept.push(e)
    }
    entries = kept
    entries.push({ tokens: [...tokens], cache, bytes, lastUsed: ++clock })
    while (total() > maxBytes) {
      const oldest = entries.reduce((a, b) => (a.lastUsed <= b.lastUsed ? a : b))
      drop(oldest)
      entries = entries.filter((e) => e !== oldest)
    }
  }

  const clear = (): void => {
    for (const e of entries) drop(e)
    entries = []
  }

  return { lookup, store, clear, bytes: total }
}
