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
 * - strings hold well-formed UTF-8 only (no overlong forms, surrogates or code points past U+10FFFF), so what a
 *   byte-level model writes decodes to the characters counted.
 *
 * Beyond JSON, grammars for text around values (serve/ToolCallGrammar.ts: a tool call in a model's own markup):
 * `literal` text, a `sequence` of parts one after another, a `switch` (one of several literal heads, each followed by
 * its own value; the heads prefix-free) and a `repeat` (zero or more of an item). Where a byte could continue a
 * `repeat` or start what follows it, the repeat takes it.
 *
 * States are immutable (a stack of frames), so a token-trie walk can branch from one state cheaply.
 */
import * as JsonNumbers from "./JsonNumbers.ts"

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
  | { readonly kind: "number"; readonly integer: boolean; readonly bounds: JsonNumbers.Bounds | undefined }
  | { readonly kind: "literal"; readonly options: ReadonlyArray<Uint8Array> }
  | { readonly kind: "any" }
  | { readonly kind: "sequence"; readonly parts: ReadonlyArray<Node> }
  | { readonly kind: "switch"; readonly cases: ReadonlyArray<{ readonly head: Uint8Array; readonly node: Node }> }
  | { readonly kind: "repeat"; readonly item: Node }

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

/** Text written as it is (not empty). */
export const literal = (text: string): Node => ({ kind: "literal", options: [bytesOf(text)] })

/** `parts` one after another, nothing between them. */
export const sequence = (parts: ReadonlyArray<Node>): Node => ({ kind: "sequence", parts })

/** Zero or more `item`s. */
export const repeat = (item: Node): Node => ({ kind: "repeat", item })

/** One of `cases`: its `head` written as it is, then its `node`. No head may be a prefix of another. */
export const switchOn = (cases: ReadonlyArray<{ readonly head: string; readonly node: Node }>): Node => {
  const heads = cases.map((c) => c.head)
  const clash = heads.find((h, i) => h === "" || heads.some((other, j) => j !== i && other.startsWith(h)))
  if (clash !== undefined) throw new Error(`JsonGrammar.switchOn: the head ${JSON.stringify(clash)} is ambiguous`)
  return { kind: "switch", cases: cases.map((c) => ({ head: bytesOf(c.head), node: c.node })) }
}

/** Whether `node` matches the empty output. */
const nullable = (node: Node): boolean =>
  node.kind === "repeat" || (node.kind === "sequence" && node.parts.every(nullable))

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
      const bounds: JsonNumbers.Bounds = {
        lo,
        loClosed: exMin === undefined || exMin < lo,
        hi,
        hiClosed: exMax === undefined || exMax > hi
      }
      const node: Node = { kind: "number", integer, bounds }
      if (!JsonNumbers.feasible(integer, bounds, "")) {
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
      /** The UTF-8 lead byte whose first continuation byte comes next (it narrows that byte's range); else 0. */
      readonly lead: number
    }
  | { readonly t: "num"; readonly node: Extract<Node, { kind: "number" }>; readonly text: string }
  | {
      readonly t: "lit"
      readonly options: ReadonlyArray<Uint8Array>
      readonly alive: ReadonlyArray<number>
      readonly pos: number
    }
  /** In a sequence: the part at `index` is being written (or comes next). */
  | { readonly t: "seq"; readonly node: Extract<Node, { kind: "sequence" }>; readonly index: number }
  | {
      readonly t: "switch"
      readonly node: Extract<Node, { kind: "switch" }>
      /** head: the heads in `alive` matched up to `pos`; body: the one left (`alive[0]`) is followed by its node */
      readonly phase: "head" | "body" | "done"
      readonly alive: ReadonlyArray<number>
      readonly pos: number
    }
  | { readonly t: "rep"; readonly node: Extract<Node, { kind: "repeat" }>; readonly count: number }

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
      return JsonNumbers.numberComplete(frame.node, frame.text)
    case "lit":
      return frame.alive.some((i) => frame.options[i]!.length === frame.pos)
    case "value":
      return false
    case "seq":
      return frame.node.parts.slice(frame.index).every(nullable)
    case "switch":
      return frame.phase === "done"
    case "rep":
      return true
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
    case "seq":
      return { ...frame, index: frame.index + 1 }
    case "switch":
      return { ...frame, phase: "done" }
    case "rep":
      return { ...frame, count: frame.count + 1 }
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
      const text = JsonNumbers.extendNumber(f.node.integer, f.text, c)
      if (text === undefined || !JsonNumbers.feasible(f.node.integer, f.node.bounds, text)) return undefined
      return with_(state, { ...f, text })
    }
    case "lit": {
      const alive = f.alive.filter((i) => f.options[i]![f.pos] === c)
      return alive.length === 0 ? undefined : with_(state, { ...f, alive, pos: f.pos + 1 })
    }
    case "seq":
      // a part that may be empty is skipped when `c` cannot start it
      for (let i = f.index; i < f.node.parts.length; i++) {
        const next = pushValue(with_(state, { ...f, index: i }), f.node.parts[i]!, c)
        if (next !== undefined || !nullable(f.node.parts[i]!)) return next
      }
      return undefined
    case "switch": {
      if (f.phase === "body") return pushValue(state, f.node.cases[f.alive[0]!]!.node, c)
      if (f.phase === "done") return undefined
      const alive = f.alive.filter((i) => f.node.cases[i]!.head[f.pos] === c)
      if (alive.length === 0) return undefined
      const chosen = alive.find((i) => f.node.cases[i]!.head.length === f.pos + 1)
      return with_(
        state,
        chosen === undefined
          ? { ...f, alive, pos: f.pos + 1 }
          : { ...f, phase: "body", alive: [chosen], pos: f.pos + 1 }
      )
    }
    case "rep":
      return pushValue(state, f.node.item, c)
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
      return c === QUOTE ? with_(state, { t: "str", node, phase: "body", count: 0, pending: 0, lead: 0 }) : undefined
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
    case "sequence":
      return feed(with_(state, { t: "seq", node, index: 0 }), c)
    case "switch":
      return feed(with_(state, { t: "switch", node, phase: "head", alive: node.cases.map((_, i) => i), pos: 0 }), c)
    case "repeat":
      return feed(with_(state, { t: "rep", node, count: 0 }), c)
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
      return pending === 0 ? undefined : with_(state, { ...f, phase: "utf8", count: f.count + 1, pending, lead: c })
    }
    case "utf8": {
      // the first continuation byte after E0, ED, F0, F4 is narrowed: no overlong forms, surrogates or > U+10FFFF
      const lo = f.lead === 0xe0 ? 0xa0 : f.lead === 0xf0 ? 0x90 : 0x80
      const hi = f.lead === 0xed ? 0x9f : f.lead === 0xf4 ? 0x8f : 0xbf
      if (c < lo || c > hi) return undefined
      return with_(state, { ...f, phase: f.pending === 1 ? "body" : "utf8", pending: f.pending - 1, lead: 0 })
    }
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

/** Whether the bytes so far are a whole output (the output may end here): every frame on the stack is complete. */
export const accepting = (state: State): boolean => {
  let s = state
  while (complete(s.frame)) {
    if (s.up === undefined) return true
    s = with_(s.up, resume(s.up.frame))
  }
  return false
}

/** Whether the output is complete and nothing can follow: generation stops here. */
export const final = (state: State): boolean => {
  if (!accepting(state)) return false
  for (let c = 0; c < 256; c++) if (step(state, c) !== undefined) return false
  return true
}

/**
 * Whether `state` is inside a JSON value (an object, array, string or number, or the node a `switch` head chose), as
 * opposed to the literal text around values: markup tokens (`<tool_call>`) may stand only for that text.
 */
export const inValue = (state: State): boolean => {
  for (let s: State | undefined = state; s !== undefined; s = s.up) {
    const t = s.frame.t
    if (t === "obj" || t === "anyObj" || t === "arr" || t === "str" || t === "num") return true
    if (s.frame.t === "switch" && s.frame.phase === "body") return true
  }
  return false
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
