/**
 * The order a run consumes its prompts in: every epoch is a seeded shuffle of the dataset (or the file order), and
 * cursor k is the k-th prompt of the concatenated epochs. A checkpoint stores the cursor, so a resumed run continues
 * with exactly the prompts that were not yet consumed.
 */
import type { PromptRow } from "../domain/PromptRow.ts"
import type { Prompt } from "../generator/Generator.ts"

/** splitmix32: a small seeded PRNG, so the order does not depend on the tfjs backend or Math.random. */
const prng = (seed: number) => {
  let s = seed >>> 0
  return () => {
    s = (s + 0x9e3779b9) >>> 0
    let z = s
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0
    return ((z ^ (z >>> 16)) >>> 0) / 4294967296
  }
}

export const epochOrder = (n: number, epoch: number, seed: number, shuffle: boolean): Array<number> => {
  const order = Array.from({ length: n }, (_, i) => i)
  if (!shuffle) return order
  const random = prng(seed * 1000003 + epoch)
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1))
    ;[order[i], order[j]] = [order[j]!, order[i]!]
  }
  return order
}

export interface PromptOrder {
  readonly total: number // prompts over all epochs
  readonly at: (cursor: number) => Prompt
  readonly slice: (from: number, to: number) => Array<Prompt>
}

export const make = (rows: ReadonlyArray<PromptRow>, epochs: number, seed: number, shuffle: boolean): PromptOrder => {
  const orders = Array.from({ length: epochs }, (_, e) => epochOrder(rows.length, e, seed, shuffle))
  const at = (cursor: number): Prompt => {
    const epoch = Math.floor(cursor / rows.length)
    return { row: rows[orders[epoch]![cursor % rows.length]!]!, cursor }
  }
  return {
    total: rows.length * epochs,
    at,
    slice: (from, to) =>
      Array.from({ length: Math.max(0, Math.min(to, rows.length * epochs) - from) }, (_, i) => at(from + i))
  }
}

/**
 * The base sampling seed of the prompt at `cursor`: it depends on the training step the prompt belongs to
 * (⌊cursor / B⌋ + 1), so the sync and async pipelines sample the same tokens for it, and a prompt seen again in a
 * later epoch is sampled afresh. (AgentLoop mixes in the prompt uid, sample index and turn.)
 */
export const sampleSeed = (baseSeed: number, cursor: number, batchSize: number): number =>
  baseSeed + 1_000_003 * (Math.floor(cursor / batchSize) + 1)
