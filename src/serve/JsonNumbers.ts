/**
 * Numbers for the JSON-schema automaton (serve/JsonGrammar.ts): how a number is written byte by byte (no exponent, at
 * most 15 digits before the point and 15 after, no leading zeros) and which prefixes can still be completed into a
 * number within a schema's `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum`.
 */

/** A schema's range: the tighter of each pair of its bounds. */
export interface Bounds {
  readonly lo: number
  readonly loClosed: boolean
  readonly hi: number
  readonly hiClosed: boolean
}

const maxIntDigits = 15
const maxFracDigits = 15

interface Interval {
  readonly a: number
  readonly b: number
  readonly aClosed: boolean
  readonly bClosed: boolean
}

/** The magnitudes a number written so far (`digits`, `dot`, `frac`; no sign) can still reach. */
const magnitudes = (integer: boolean, digits: string, dot: boolean, frac: string): Array<Interval> => {
  if (digits === "") return [{ a: 0, b: 10 ** maxIntDigits, aClosed: true, bClosed: false }]
  const i = Number(digits)
  if (dot) {
    const x = Number(`${digits}.${frac}`)
    return frac.length >= maxFracDigits
      ? [{ a: x, b: x, aClosed: true, bClosed: true }]
      : [{ a: x, b: x + 10 ** -frac.length, aClosed: true, bClosed: false }]
  }
  const out: Array<Interval> = integer
    ? [{ a: i, b: i, aClosed: true, bClosed: true }]
    : [{ a: i, b: i + 1, aClosed: true, bClosed: false }]
  if (digits !== "0") {
    for (let k = 1; digits.length + k <= maxIntDigits; k++) {
      out.push({ a: i * 10 ** k, b: (i + 1) * 10 ** k, aClosed: true, bClosed: false })
    }
  }
  return out
}

const meets = (integer: boolean, x: Interval, bounds: Bounds): boolean => {
  if (integer) {
    const lower = Math.max(
      x.aClosed ? Math.ceil(x.a) : Math.floor(x.a) + 1,
      bounds.loClosed ? Math.ceil(bounds.lo) : Math.floor(bounds.lo) + 1
    )
    const upper = Math.min(
      x.bClosed ? Math.floor(x.b) : Math.ceil(x.b) - 1,
      bounds.hiClosed ? Math.floor(bounds.hi) : Math.ceil(bounds.hi) - 1
    )
    return lower <= upper
  }
  const [lo, loClosed] =
    x.a > bounds.lo
      ? [x.a, x.aClosed]
      : x.a < bounds.lo
        ? [bounds.lo, bounds.loClosed]
        : [x.a, x.aClosed && bounds.loClosed]
  const [hi, hiClosed] =
    x.b < bounds.hi
      ? [x.b, x.bClosed]
      : x.b > bounds.hi
        ? [bounds.hi, bounds.hiClosed]
        : [x.b, x.bClosed && bounds.hiClosed]
  return lo < hi || (lo === hi && loClosed && hiClosed)
}

const negate = (x: Interval): Interval => ({ a: -x.b, b: -x.a, aClosed: x.bClosed, bClosed: x.aClosed })

/** Whether the number prefix `text` (grammatical) can be completed into a number within `bounds`. */
export const feasible = (integer: boolean, bounds: Bounds | undefined, text: string): boolean => {
  if (bounds === undefined) return true
  const negative = text.startsWith("-")
  const body = negative ? text.slice(1) : text
  const dotAt = body.indexOf(".")
  const digits = dotAt < 0 ? body : body.slice(0, dotAt)
  const frac = dotAt < 0 ? "" : body.slice(dotAt + 1)
  const mags = magnitudes(integer, digits, dotAt >= 0, frac)
  const signed = text === "" ? [...mags, ...mags.map(negate)] : negative ? mags.map(negate) : mags
  return signed.some((x) => meets(integer, x, bounds))
}

const inBounds = (bounds: Bounds | undefined, x: number) =>
  bounds === undefined ||
  ((bounds.loClosed ? x >= bounds.lo : x > bounds.lo) && (bounds.hiClosed ? x <= bounds.hi : x < bounds.hi))

/** The number prefix `text` extended by byte `c`, or undefined when that is not a number's prefix. */
export const extendNumber = (integer: boolean, text: string, c: number): string | undefined => {
  const ch = String.fromCharCode(c)
  const negative = text.startsWith("-")
  const body = negative ? text.slice(1) : text
  const dotAt = body.indexOf(".")
  if (ch === "-") return text === "" ? "-" : undefined
  if (ch === ".") {
    return integer || body === "" || dotAt >= 0 ? undefined : `${text}.`
  }
  if (c < 0x30 || c > 0x39) return undefined
  if (dotAt >= 0) return body.length - dotAt - 1 >= maxFracDigits ? undefined : text + ch
  if (body === "0" || body.length >= maxIntDigits) return undefined
  return text + ch
}

export const numberComplete = (
  node: { readonly integer: boolean; readonly bounds: Bounds | undefined },
  text: string
) => {
  const body = text.startsWith("-") ? text.slice(1) : text
  if (body === "" || body.endsWith(".")) return false
  return inBounds(node.bounds, Number(text))
}
