/**
 * A small seeded PRNG of our own (SplitMix32 seeding xoshiro128**): the same seed gives the same stream on every
 * backend and platform, which `Math.random` and tfjs' seeded ops do not promise. Used for weight init and per-request
 * sampling.
 */

/** One PRNG stream. `next()` is uniform in [0, 1) with 32 bits of resolution. */
export interface Prng {
  readonly next: () => number
  readonly normal: () => number
}

/** SplitMix32: spreads a small integer seed over the 128-bit xoshiro state (avoids the all-zero state). */
const splitMix32 = (seed: number): (() => number) => {
  let s = seed >>> 0
  return () => {
    s = (s + 0x9e3779b9) >>> 0
    let z = s
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0
    return (z ^ (z >>> 16)) >>> 0
  }
}

export const make = (seed: number): Prng => {
  const init = splitMix32(Math.floor(seed) ^ Math.floor(seed / 0x100000000))
  let a = init()
  let b = init()
  let c = init()
  let d = init()
  const nextU32 = (): number => {
    // xoshiro128** (Blackman & Vigna)
    const result = Math.imul(rotl(Math.imul(b, 5), 7), 9) >>> 0
    const t = b << 9
    c ^= a
    d ^= b
    b ^= c
    a ^= d
    c ^= t
    d = rotl(d, 11)
    return result
  }
  const next = (): number => nextU32() / 0x100000000
  let spare: number | undefined
  const normal = (): number => {
    // Box–Muller; the second value is kept for the next call.
    if (spare !== undefined) {
      const s = spare
      spare = undefined
      return s
    }
    const u = 1 - next() // (0, 1]
    const v = next()
    const r = Math.sqrt(-2 * Math.log(u))
    spare = r * Math.sin(2 * Math.PI * v)
    return r * Math.cos(2 * Math.PI * v)
  }
  return { next, normal }
}

const rotl = (x: number, k: number): number => ((x << k) | (x >>> (32 - k))) >>> 0
