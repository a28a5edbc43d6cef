/**
 * JSON schemas as byte automata, for constrained decoding (serve/StructuredOutput.ts masks the model's tokens with
 * them). `compile(schema)` reads a schema into a `Grammar` (refusing keywords it cannot enforce with a `SchemaError`
 * naming the keyword and where it is); `start`, `step`, `accepting` and `final` run a pushdown automaton over UTF-8
 * bytes whose every live state can still be completed into a value that parses and validates.
 *
 * What it generates (a subset of the JSON each schema allows, chosen to keep small models on track):
 * - no whitespace, except one optional space after `:` and after `,`;
 * - an object with `properties` has those keys only, in the schema's order; `required` ones always, others may be left
 *   out. An object without `properties` (and `{"type": "json_object"}`-style requests) takes any keys and values;
 * - numbers without exponents, at most 15 digits before the point and 15 after; `minimum`, `maximum`,
 *   `exclusiveMinimum`, `exclusiveMaximum` are enforced on every prefix (a prefix is live only when some completion of
 *   it lies in range); `integer` has no fraction;
 * - strings: any characters (escapes as JSON's), `minLength` / `maxLength` counting characters (an escape is one);
 * - `enum` / `const`: exactly one of the values as `JSON.stringify` writes it; `boolean` and `null` likewise.
 *
 * States are immutable (a stack of frames), so a token-trie walk can branch from one state cheaply.
 */

/** A schema keyword this automaton cannot enforce, or a schema that cannot be satisfied. */
export class SchemaError extends Error {
  readonly keyword: string
  readonly at: string
  constructor(message: string, keyword: string, at: string) {
    super(message)
    this.keyword = keyword
    this.at = at
  }
}

interface Property {
  readonly key: string
  /** `"key"` as bytes, quotes included. */
  readonly literal: Uint8Array
  readonly node: Node
  readonly required: boolean
}

export type Node =
  | { readonly kind: "object"; readonly props: ReadonlyArray<Property> }
  | { readonly kind: "anyObject" }
  | { readonly kind: "array"; readonly items: Node; readonly min: number; readonly max: number }
  | { readonly kind: "string"; readonly min: number; readonly max: number }
  | { readonly kind: "number"; readonly integer: boolean; readonly bounds: Bounds | undefined }
  | { readonly kind: "literal"; readonly options: ReadonlyArray<Uint8Array> }
  | { readonly kind: "any" }

interface Bounds {
  readonly lo: number
  readonly loClosed: boolean
  readonly hi: number
  readonly hiClosed: boolean
}

/** A compiled schema: the root's node. */
export interface Grammar {
  readonly root: Node
}

const utf8 = new TextEncoder()
const bytesOf = (text: string) => utf8.encode(text)

/** Keywords that describe but do not constrain: accepted and ignored. */
const annotations = new Set([
  "title",
  "description",
  "$schema",
  "$id",
  "$comment",
  "default",
  "examples",
  "deprecated",
  "readOnly",
  "writeOnly"
])

const supported: Record<string, ReadonlySet<string>> = {
  object: new Set(["type", "properties", "required", "additionalProperties"]),
  array: new Set(["type", "items", "minItems", "maxItems"]),
  string: new Set(["type", "minLength", "maxLength"]),
  number: new Set(["type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
  integer: new Set(["type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
  boolean: new Set(["type"]),
  null: new Set(["type"])
}

/** The JSON literals a value may be written as: one for `const`, one per `enum` entry. */
const literalNode = (values: ReadonlyArray<unknown>): Node => ({
  kind: "literal",
  options: values.map((v) => bytesOf(JSON.stringify(v)))
})

/** Any JSON value (a schema `{}` or `true`). */
export const anyValue: Node = { kind: "any" }

/** Any JSON object (`response_format: {"type": "json_object"}`). */
export const anyObject: Grammar = { root: { kind: "anyObject" } }

/** Literal alternatives written as they are (vLLM's `choice`): the output is exactly one of them. */
export const choices = (options: ReadonlyArray<string>): Grammar => ({
  root: { kind: "literal", options: options.map(bytesOf) }
})

const count = (schema: Record<string, unknown>, key: string, at: string): number | undefined => {
  const v = schema[key]
  if (v === undefined) return undefined
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
    throw new SchemaError(`\`${key}\` at ${at} must be a non-negative integer`, key, at)
  }
  return v
}

const bound = (schema: Record<string, unknown>, key: string, at: string): number | undefined => {
  const v = schema[key]
  if (v === undefined) return undefined
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw new SchemaError(`\`${key}\` at ${at} must be a number`, key, at)
  }
  return v
}

/** Read a JSON schema; throws SchemaError for a keyword it cannot enforce or a schema nothing satisfies. */
export const compile = (schema: unknown): Grammar => ({ root: nodeOf(schema, "#") })

const nodeOf = (schema: unknown, at: string): Node => {
  if (schema === true) return anyValue
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
    throw new SchemaError(`the schema at ${at} must be an object`, "type", at)
  }
  const s = schema as Record<string, unknown>
  if (s["const"] !== undefined || s["enum"] !== undefined) {
    for (const key of Object.keys(s)) {
      if (key !== "const" && key !== "enum" && key !== "type" && !annotations.has(key)) {
        throw new SchemaError(`unsupported JSON-schema keyword \`${key}\` beside enum/const at ${at}`, key, at)
      }
    }
    if (s["const"] !== undefined) return literalNode([s["const"]])
    const values = s["enum"]
    if (!Array.isArray(values) || values.length === 0) {
      throw new SchemaError(`\`enum\` at ${at} must be a non-empty list`, "enum", at)
    }
    return literalNode(values)
  }
  const type = s["type"]
  if (type === undefined) {
    const keys = Object.keys(s).filter((k) => !annotations.has(k))
    if (keys.length === 0) return anyValue
    // a schema with properties but no type reads as an object
    if (keys.every((k) => supported["object"]!.has(k))) return nodeOf({ ...s, type: "object" }, at)
    const first = keys.find((k) => !supported["object"]!.has(k))!
    throw new SchemaError(`unsupported JSON-schema keyword \`${first}\` at ${at}`, first, at)
  }
  if (typeof type !== "string" || supported[type] === undefined) {
    throw new SchemaError(
      `unsupported \`type\` ${JSON.stringify(type)} at ${at} (one of object, array, string, number, integer, ` +
        `boolean, null)`,
      "type",
      at
    )
  }
  for (const key of Object.keys(s)) {
    if (!supported[type]!.has(key) && !annotations.has(key)) {
      throw new SchemaError(`unsupported JSON-schema keyword \`${key}\` for type ${type} at ${at}`, key, at)
    }
  }
  switch (type) {
    case "object": {
      const properties = s["properties"]
      const required = s["required"] ?? []
      if (!Array.isArray(required) || !required.every((r) => typeof r === "string")) {
        throw new SchemaError(`\`required\` at ${at} must be a list of names`, "required", at)
      }
      if (properties === undefined) {
        if (required.length > 0) {
          throw new SchemaError(`\`required\` at ${at} names properties not in \`properties\``, "required", at)
        }
        return { kind: "anyObject" }
      }
      if (typeof properties !== "object" || properties === null || Array.isArray(properties)) {
        throw new SchemaError(`\`properties\` at ${at} must be an object`, "properties", at)
      }
      const names = Object.keys(properties)
      const missing = required.find((r) => !names.includes(r))
      if (missing !== undefined) {
        throw new SchemaError(`\`required\` at ${at} names "${missing}", not in \`properties\``, "required", at)
      }
      return {
        kind: "object",
        props: names.map((key) => ({
          key,
          literal: bytesOf(JSON.stringify(key)),
          node: nodeOf((properties as Record<string, unknown>)[key], `${at}/properties/${key}`),
          required: required.includes(key)
        }))
      }
    }
    case "array": {
      const min = count(s, "minItems", at) ?? 0
      const max = count(s, "maxItems", at) ?? Number.POSITIVE_INFINITY
      if (min > max) throw new SchemaError(`minItems > maxItems at ${at}`, "minItems", at)
      const items = s["items"] === undefined ? anyValue : nodeOf(s["items"], `${at}/items`)
      return { kind: "array", items, min, max }
    }
    case "string": {
      const min = count(s, "minLength", at) ?? 0
      const max = count(s, "maxLength", at) ?? Number.POSITIVE_INFINITY
      if (min > max) throw new SchemaError(`minLength > maxLength at ${at}`, "minLength", at)
      return { kind: "string", min, max }
    }
    case "number":
    case "integer": {
      const integer = type === "integer"
      const minimum = bound(s, "minimum", at)
      const maximum = bound(s, "maximum", at)
      const exMin = bound(s, "exclusiveMinimum", at)
      const exMax = bound(s, "exclusiveMaximum", at)
      if ([minimum, maximum, exMin, exMax].every((b) => b === undefined))
        return { kind: "number", integer, bounds: undefined }
      // the tighter of each pair
      const lo = Math.max(minimum ?? -Infinity, exMin ?? -Infinity)
      const hi = Math.min(maximum ?? Infinity, exMax ?? Infinity)
      const bounds: Bounds = {
        lo,
        loClosed: exMin === undefined || exMin < lo,
        hi,
        hiClosed: exMax === undefined || exMax > hi
      }
      const node: Node = { kind: "number", integer, bounds }
      if (!feasible(integer, bounds, "")) {
        throw new SchemaError(`no ${type} satisfies minimum/maximum at ${at}`, "minimum", at)
      }
      return node
    }
    case "boolean":
      return literalNode([true, false])
    default:
      return literalNode([null])
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Numbers: which prefixes can still be completed into a number in range

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
const feasible = (integer: boolean, bounds: Bounds | undefined, text: string): boolean => {
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
const extendNumber = (integer: boolean, text: string, c: number): string | undefined => {
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

const numberComplete = (node: { readonly integer: boolean; readonly bounds: Bounds | undefined }, text: string) => {
  const body = text.startsWith("-") ? text.slice(1) : text
  if (body === "" || body.endsWith(".")) return false
  return inBounds(node.bounds, Number(text))
}

// ---------------------------------------------------------------------------------------------------------------
// The automaton

export type Frame =
  | { readonly t: "value"; readonly node: Node }
  | {
      readonly t: "obj"
      readonly node: Extract<Node, { kind: "object" }>
      /** open: after `{`; key: in a key (`cands`, matched up to `pos`); colon; ws/ws1: after `:`; value; after; comma/comma1 */
      readonly phase: "open" | "key" | "colon" | "ws" | "ws1" | "value" | "after" | "comma" | "comma1" | "done"
      /** The first property that may still come. */
      readonly next: number
      readonly cands: ReadonlyArray<number>
      readonly pos: number
      /** The property being written. */
      readonly current: number
    }
  | {
      readonly t: "anyObj"
      readonly phase: "open" | "key" | "colon" | "ws" | "ws1" | "value" | "after" | "comma" | "comma1" | "done"
    }
  | {
      readonly t: "arr"
      readonly node: Extract<Node, { kind: "array" }>
      readonly phase: "open" | "value" | "after" | "comma" | "comma1" | "done"
      readonly count: number
    }
  | {
      readonly t: "str"
      readonly node: Extract<Node, { kind: "string" }>
      /** body; esc: after `\`; hex: in `\uXXXX` (`pending` digits left); utf8: `pending` continuation bytes left */
      readonly phase: "body" | "esc" | "hex" | "utf8" | "done"
      readonly count: number
      readonly pending: number
    }
  | { readonly t: "num"; readonly node: Extract<Node, { kind: "number" }>; readonly text: string }
  | {
      readonly t: "lit"
      readonly options: ReadonlyArray<Uint8Array>
      readonly alive: ReadonlyArray<number>
      readonly pos: number
    }

/** An automaton state: a stack of frames (innermost first); immutable. */
export interface State {
  readonly frame: Frame
  readonly up: State | undefined
}

export const start = (grammar: Grammar): State => ({ frame: { t: "value", node: grammar.root }, up: undefined })

const SPACE = 0x20
const QUOTE = 0x22
const COMMA = 0x2c
const COLON = 0x3a

const with_ = (state: State, frame: Frame): State => ({ frame, up: state.up })

/** Push a value of `node` above `parent` and feed it `c`. */
const pushValue = (parent: State, node: Node, c: number): State | undefined =>
  step({ frame: { t: "value", node }, up: parent }, c)

/** The properties that may come next from index `next`: up to and including the first required one. */
const candidates = (props: ReadonlyArray<Property>, next: number): Array<number> => {
  const out: Array<number> = []
  for (let i = next; i < props.length; i++) {
    out.push(i)
    if (props[i]!.required) break
  }
  return out
}

const requiredLeft = (props: ReadonlyArray<Property>, next: number) => {
  for (let i = next; i < props.length; i++) if (props[i]!.required) return true
  return false
}

const complete = (frame: Frame): boolean => {
  switch (frame.t) {
    case "obj":
    case "anyObj":
    case "arr":
    case "str":
      return frame.phase === "done"
    case "num":
      return numberComplete(frame.node, frame.text)
    case "lit":
      return frame.alive.some((i) => frame.options[i]!.length === frame.pos)
    case "value":
      return false
  }
}

/** The parent frame once its child value is complete. */
const resume = (frame: Frame): Frame => {
  switch (frame.t) {
    case "obj":
      return { ...frame, phase: "after", next: frame.current + 1 }
    case "anyObj":
      return { ...frame, phase: frame.phase === "key" ? "colon" : "after" }
    case "arr":
      return { ...frame, phase: "after", count: frame.count + 1 }
    default:
      throw new Error(`JsonGrammar: a ${frame.t} frame has no children`)
  }
}

/** The state after byte `c`, or undefined when `c` cannot come next. */
export const step = (state: State, c: number): State | undefined => {
  const next = feed(state, c)
  if (next !== undefined) return next
  // the innermost value is complete and `c` is not part of it: it belongs to the enclosing frame
  if (!complete(state.frame) || state.up === undefined) return undefined
  return step(with_(state.up, resume(state.up.frame)), c)
}

const feed = (state: State, c: number): State | undefined => {
  const f = state.frame
  switch (f.t) {
    case "value":
      return startValue(state, f.node, c)
    case "obj": {
      const props = f.node.props
      switch (f.phase) {
        case "open":
        case "comma":
        case "comma1":
          if (c === SPACE && f.phase === "comma") return with_(state, { ...f, phase: "comma1" })
          if (c === 0x7d && f.phase === "open" && !requiredLeft(props, f.next))
            return with_(state, { ...f, phase: "done" })
          if (c === QUOTE && f.next < props.length) {
            return with_(state, { ...f, phase: "key", cands: candidates(props, f.next), pos: 1 })
          }
          return undefined
        case "key": {
          const cands = f.cands.filter((i) => props[i]!.literal[f.pos] === c)
          if (cands.length === 0) return undefined
          const done = cands.find((i) => props[i]!.literal.length === f.pos + 1)
          return with_(
            state,
            done === undefined ? { ...f, cands, pos: f.pos + 1 } : { ...f, phase: "colon", cands: [], current: done }
          )
        }
        case "colon":
          return c === COLON ? with_(state, { ...f, phase: "ws" }) : undefined
        case "ws":
        case "ws1":
          if (c === SPACE && f.phase === "ws") return with_(state, { ...f, phase: "ws1" })
          return pushValue(with_(state, { ...f, phase: "value" }), props[f.current]!.node, c)
        case "after":
          if (c === COMMA && f.next < props.length) return with_(state, { ...f, phase: "comma" })
          if (c === 0x7d && !requiredLeft(props, f.next)) return with_(state, { ...f, phase: "done" })
          return undefined
        default:
          return undefined
      }
    }
    case "anyObj":
      switch (f.phase) {
        case "open":
        case "comma":
        case "comma1":
          if (c === SPACE && f.phase === "comma") return with_(state, { ...f, phase: "comma1" })
          if (c === 0x7d && f.phase === "open") return with_(state, { ...f, phase: "done" })
          if (c === QUOTE) return pushValue(with_(state, { ...f, phase: "key" }), anyKey, c)
          return undefined
        case "colon":
          return c === COLON ? with_(state, { ...f, phase: "ws" }) : undefined
        case "ws":
        case "ws1":
          if (c === SPACE && f.phase === "ws") return with_(state, { ...f, phase: "ws1" })
          return pushValue(with_(state, { ...f, phase: "value" }), anyValue, c)
        case "after":
          if (c === COMMA) return with_(state, { ...f, phase: "comma" })
          if (c === 0x7d) return with_(state, { ...f, phase: "done" })
          return undefined
        default:
          return undefined
      }
    case "arr":
      switch (f.phase) {
        case "open":
        case "comma":
        case "comma1":
          if (c === SPACE && f.phase === "comma") return with_(state, { ...f, phase: "comma1" })
          if (c === 0x5d && f.phase === "open" && f.node.min === 0) return with_(state, { ...f, phase: "done" })
          if (f.count >= f.node.max) return undefined
          return pushValue(with_(state, { ...f, phase: "value" }), f.node.items, c)
        case "after":
          if (c === COMMA && f.count < f.node.max) return with_(state, { ...f, phase: "comma" })
          if (c === 0x5d && f.count >= f.node.min) return with_(state, { ...f, phase: "done" })
          return undefined
        default:
          return undefined
      }
    case "str":
      return feedString(state, f, c)
    case "num": {
      const text = extendNumber(f.node.integer, f.text, c)
      if (text === undefined || !feasible(f.node.integer, f.node.bounds, text)) return undefined
      return with_(state, { ...f, text })
    }
    case "lit": {
      const alive = f.alive.filter((i) => f.options[i]![f.pos] === c)
      return alive.length === 0 ? undefined : with_(state, { ...f, alive, pos: f.pos + 1 })
    }
  }
}

const anyKey: Node = { kind: "string", min: 0, max: Number.POSITIVE_INFINITY }
const anyArray: Node = { kind: "array", items: anyValue, min: 0, max: Number.POSITIVE_INFINITY }
const anyNumber: Node = { kind: "number", integer: false, bounds: undefined }
const jsonWords = literalNode([true, false, null])

/** The first byte of a value of `node`. */
const startValue = (state: State, node: Node, c: number): State | undefined => {
  switch (node.kind) {
    case "object":
      return c === 0x7b
        ? with_(state, { t: "obj", node, phase: "open", next: 0, cands: [], pos: 0, current: -1 })
        : undefined
    case "anyObject":
      return c === 0x7b ? with_(state, { t: "anyObj", phase: "open" }) : undefined
    case "array":
      return c === 0x5b ? with_(state, { t: "arr", node, phase: "open", count: 0 }) : undefined
    case "string":
      return c === QUOTE ? with_(state, { t: "str", node, phase: "body", count: 0, pending: 0 }) : undefined
    case "number":
      return feed(with_(state, { t: "num", node, text: "" }), c)
    case "literal":
      return feed(with_(state, { t: "lit", options: node.options, alive: node.options.map((_, i) => i), pos: 0 }), c)
    case "any":
      if (c === 0x7b) return startValue(state, { kind: "anyObject" }, c)
      if (c === 0x5b) return startValue(state, anyArray, c)
      if (c === QUOTE) return startValue(state, anyKey, c)
      if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return startValue(state, anyNumber, c)
      return startValue(state, jsonWords, c)
  }
}

const isHex = (c: number) => (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)

const feedString = (state: State, f: Extract<Frame, { t: "str" }>, c: number): State | undefined => {
  switch (f.phase) {
    case "body": {
      if (c === QUOTE) return f.count >= f.node.min ? with_(state, { ...f, phase: "done" }) : undefined
      if (c < 0x20 || f.count >= f.node.max) return undefined
      if (c === 0x5c) return with_(state, { ...f, phase: "esc", count: f.count + 1 })
      if (c < 0x80) return with_(state, { ...f, count: f.count + 1 })
      // a UTF-8 lead byte and how many continuation bytes it needs
      const pending = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0
      return pending === 0 ? undefined : with_(state, { ...f, phase: "utf8", count: f.count + 1, pending })
    }
    case "utf8":
      if (c < 0x80 || c > 0xbf) return undefined
      return with_(state, { ...f, phase: f.pending === 1 ? "body" : "utf8", pending: f.pending - 1 })
    case "esc":
      if (c === 0x75) return with_(state, { ...f, phase: "hex", pending: 4 })
      return '"\\/bfnrt'.includes(String.fromCharCode(c)) ? with_(state, { ...f, phase: "body" }) : undefined
    case "hex":
      if (!isHex(c)) return undefined
      return with_(state, { ...f, phase: f.pending === 1 ? "body" : "hex", pending: f.pending - 1 })
    default:
      return undefined
  }
}

/** Whether the bytes so far are a whole value (the output may end here). */
export const accepting = (state: State): boolean => state.up === undefined && complete(state.frame)

/** Whether the output is complete and nothing can follow: generation stops here. */
export const final = (state: State): boolean => {
  if (!accepting(state)) return false
  for (let c = 0; c < 256; c++) if (step(state, c) !== undefined) return false
  return true
}

/** Run `bytes` from `state`; undefined when one of them cannot come. */
export const run = (state: State, bytes: ArrayLike<number>): State | undefined => {
  let s: State | undefined = state
  for (let i = 0; i < bytes.length && s !== undefined; i++) s = step(s, bytes[i]!)
  return s
}

/** Whether `text` is a whole output of `grammar`. */
export const matches = (grammar: Grammar, text: string): boolean => {
  const s = run(start(grammar), bytesOf(text))
  return s !== undefined && accepting(s)
}
