/**
 * Reads tool calls out of one model turn. The policy writes text; the environment needs `ToolCall`s. Formats:
 *
 * - `hermes` (Qwen, Hermes): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number per turn. `arguments`
 *   may be an object or a JSON string holding one (Qwen3 writes both); `parameters` is read as `arguments`. A block
 *   whose body is Qwen3-Coder XML (`<function=name><parameter=k>v</parameter></function>`) is read too.
 * - `json`: bare `{"name": …, "arguments": …}` objects anywhere in the text, arrays of them, ```json fences.
 * - `xml`: `<tool><name>…</name><arguments>{…} or <k>v</k>…</arguments></tool>`.
 * - `react`: `Action: tool` / `Action Input: {json}` pairs, and `Final Answer: …`.
 * - `auto`: the first format whose marker the text contains (`<tool_call>`, `<tool>`, `Action:`/`Final Answer:`
 *   at a line start), else `json`.
 *
 * Thinking (`<think>…</think>`, or everything before a lone `</think>` whose `<think>` was in the prompt) is removed
 * first: a call the model only considered is not a call. A closing tag the engine swallowed as a stop string
 * (`</tool_call>`, `</tool>`, `</answer>`) may be missing on the last block.
 *
 * The result is data, not a failure: `error` describes the tool-call attempts that could not be read, in words short
 * enough to show the model as its observation; calls that could be read are returned beside it. Text with neither
 * calls nor attempts is an answer, not an error. Ids are `call_0`, `call_1`, … in order of appearance within the turn.
 */
import { Effect, Schema } from "effect"
import type { ToolCallWire } from "../domain/Message.ts"
import type { ToolCall } from "../domain/ToolCall.ts"

export const Format = Schema.Literals(["auto", "hermes", "json", "xml", "react"])
export type Format = typeof Format.Type

/** A call before it is given its id. */
export type Call = Pick<ToolCall, "name" | "arguments">

/** The formats a call can be written in (`auto` only reads). */
export type WriteFormat = Exclude<Format, "auto">

export interface Parsed {
  readonly calls: ReadonlyArray<ToolCall>
  /** `<answer>…</answer>` or ReAct's `Final Answer:`; else, for a turn without calls or errors, the whole text. */
  readonly finalAnswer?: string
  /** What could not be read, e.g. `tool call 1: invalid JSON: Unexpected end of JSON input`. */
  readonly error?: string
}

/** A turn's tool-call attempt could not be read; for callers that prefer a typed failure to `Parsed.error`. */
export class ToolCallParseError extends Schema.TaggedError<ToolCallParseError>()("ToolCallParseError", {
  format: Format,
  message: Schema.String,
  text: Schema.String
}) {}

/** Parses one model turn. Pure and total: problems are reported in `error`, never thrown. */
export const parse = (text: string, format: Format = "auto"): Parsed => {
  const visible = stripThinking(text)
  const resolved = format === "auto" ? detect(visible) : format
  const found = readers[resolved](visible)
  const calls: Array<ToolCall> = []
  for (const call of found.calls) calls.push({ id: `call_${calls.length}`, name: call.name, arguments: call.arguments })
  const error = describe(found.errors)
  const finalAnswer =
    tagContent(visible, "answer") ??
    found.finalAnswer ??
    (calls.length === 0 && error === undefined ? visible.trim() : undefined)
  const parsed: { calls: ReadonlyArray<ToolCall>; finalAnswer?: string; error?: string } = { calls }
  if (finalAnswer !== undefined) parsed.finalAnswer = finalAnswer
  if (error !== undefined) parsed.error = error
  return parsed
}

/** `parse`, failing with `ToolCallParseError` when any attempt could not be read. */
export const parseOrFail = (text: string, format: Format = "auto"): Effect.Effect<Parsed, ToolCallParseError> => {
  const parsed = parse(text, format)
  return parsed.error === undefined
    ? Effect.succeed(parsed)
    : Effect.fail(new ToolCallParseError({ format, message: parsed.error, text }))
}

/**
 * Calls that a remote engine already parsed (OpenAI `tool_calls`). Their ids are kept, because the tool messages
 * must answer them by id; an empty id becomes `call_<i>`. `arguments` is JSON text; `""` means no arguments.
 */
export const fromOpenAi = (toolCalls: ReadonlyArray<ToolCallWire>): Parsed => {
  const calls: Array<ToolCall> = []
  const errors: Array<string> = []
  for (const [i, wire] of toolCalls.entries()) {
    const name = wire.function.name.trim()
    const args = readArguments(wire.function.arguments)
    if (name === "") errors.push(`tool call ${i + 1}: missing "name"`)
    else if (typeof args === "string") errors.push(`tool call ${i + 1}: ${name}: ${args}`)
    else calls.push({ id: wire.id === "" ? `call_${i}` : wire.id, name, arguments: args })
  }
  const error = describe(errors)
  return error === undefined ? { calls } : { calls, error }
}

/** Writes one call the way a model would in `format` (for demonstrations and SFT data). `parse` reads it back. */
export const toText = (call: Call, format: WriteFormat): string => {
  const args = pythonJson(call.arguments)
  switch (format) {
    case "hermes":
      return `<tool_call>\n${pythonJson({ name: call.name, arguments: call.arguments })}\n</tool_call>`
    case "json":
      return pythonJson({ name: call.name, arguments: call.arguments })
    case "xml":
      return `<tool><name>${call.name}</name><arguments>${args}</arguments></tool>`
    case "react":
      return `Action: ${call.name}\nAction Input: ${args}`
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Readers: each returns the calls it could read and one message per attempt it could not.

/** One attempt: the call it made, or the message saying why it could not be read. */
type Attempt = Call | string

interface Found {
  readonly calls: ReadonlyArray<Call>
  readonly errors: ReadonlyArray<string>
  readonly finalAnswer?: string
}

const gather = (attempts: ReadonlyArray<Attempt>): Found => {
  const calls: Array<Call> = []
  const errors: Array<string> = []
  for (const a of attempts) {
    if (typeof a === "string") errors.push(a)
    else calls.push(a)
  }
  return { calls, errors }
}

const at = (where: string, attempt: Attempt): Attempt =>
  typeof attempt === "string" ? `${where}: ${attempt}` : attempt

/** The first few messages, then a count: the model reads this, and a degenerate turn can make thousands. */
const describe = (errors: ReadonlyArray<string>): string | undefined => {
  if (errors.length === 0) return undefined
  const shown = errors.slice(0, maxErrorsShown).join("; ")
  return errors.length > maxErrorsShown ? `${shown}; and ${errors.length - maxErrorsShown} more` : shown
}

const maxErrorsShown = 3

const detect = (text: string): WriteFormat => {
  if (text.includes("<tool_call>")) return "hermes"
  if (text.includes("<tool>")) return "xml"
  if ((text.includes("Action") || text.includes("Final Answer")) && /^[ \t]*(Action|Final Answer)[ \t]*:/m.test(text)) {
    return "react"
  }
  return "json"
}

const readHermes = (text: string): Found => {
  const attempts: Array<Attempt> = []
  const bodies = blocks(text, "tool_call")
  for (let i = 0; i < bodies.length; i++) {
    for (const a of hermesBlock(bodies[i]!)) attempts.push(typeof a === "string" ? `<tool_call> ${i + 1}: ${a}` : a)
  }
  return gather(attempts)
}

const hermesBlock = (body: string): ReadonlyArray<Attempt> => {
  const trimmed = stripFence(body.trim())
  if (trimmed.startsWith("<function=")) return [readQwenCoder(trimmed)]
  if (trimmed === "") return ["empty"]
  const value = parseJsonLenient(trimmed)
  if (!value.ok) return [`invalid JSON: ${value.error}`]
  return (Array.isArray(value.value) ? value.value : [value.value]).map(callFromJson)
}

const readJson = (text: string): Found => {
  const body = stripFence(text.trim())
  // A body whose first bracket does not close at its end cannot parse; JSON.parse is slow on deep nesting ("[[[[…")
  const unclosed = (body.startsWith("{") || body.startsWith("[")) && scanJson(body, 0) !== body.length
  const whole = unclosed ? undefined : parseJson(body)
  // A turn that is nothing but `{"name": "x"}` is a call without arguments; inside prose that is just data.
  const attempts = whole?.ok === true ? callsIn(whole.value, true) : jsonAttempts(text, bracketTree(text), 0)
  return gather(attempts.map((a, i) => at(`tool call ${i + 1}`, a)))
}

const callsIn = (value: unknown, whole: boolean): Array<Attempt> =>
  (Array.isArray(value) ? value : [value]).filter((item) => looksLikeCall(item, whole)).map(callFromJson)

const readXml = (text: string): Found =>
  gather(blocks(text, "tool").map((body, i) => at(`<tool> ${i + 1}`, xmlBlock(body))))

const xmlBlock = (body: string): Attempt => {
  const name = tagContent(body, "name")?.trim() ?? ""
  if (name === "") return "missing <name>"
  const raw = tagContent(body, "arguments") ?? ""
  const args = /^[{["]/.test(raw) ? readArguments(raw) : xmlFields(raw)
  return typeof args === "string" ? `${name}: ${args}` : { name, arguments: args }
}

const readReact = (text: string): Found => {
  const matches = [...text.matchAll(/^[ \t]*Action[ \t]*:[ \t]*(.*)$/gm)]
  const attempts = matches.map((match, i) => {
    const rest = text.slice(match.index + match[0].length, matches[i + 1]?.index ?? text.length)
    return at(`Action ${i + 1}`, reactAction(match[1]!.trim().replace(/^`(.*)`$/, "$1"), rest))
  })
  const final = /^[ \t]*Final Answer[ \t]*:([\s\S]*)$/m.exec(text)
  return final === null ? gather(attempts) : { ...gather(attempts), finalAnswer: final[1]!.trim() }
}

/** `name` from the `Action:` line; `rest` runs to the next `Action:` line. */
const reactAction = (name: string, rest: string): Attempt => {
  if (name === "") return "missing tool name"
  const input = /^[ \t]*Action[ \t]*Input[ \t]*:[ \t]*/m.exec(rest)
  if (input === null) return `${name}: missing "Action Input:"`
  const body = stripFence(rest.slice(input.index + input[0].length).trimStart())
  if (!body.startsWith("{")) return `${name}: Action Input must be a JSON object`
  const span = scanJson(body, 0)
  const args = readArguments(body.slice(0, span === -1 ? body.length : span))
  return typeof args === "string" ? `${name}: ${args}` : { name, arguments: args }
}

const readers: Record<WriteFormat, (text: string) => Found> = {
  hermes: readHermes,
  json: readJson,
  xml: readXml,
  react: readReact
}

// ---------------------------------------------------------------------------------------------------------------
// Turning JSON values into calls.

type Arguments = Record<string, unknown>

/** A call, or why the value is not one. */
const callFromJson = (value: unknown): Attempt => {
  if (!isObject(value)) return 'expected a JSON object with "name" and "arguments"'
  const inner = isObject(value.function) ? value.function : value // {"function": {"name", "arguments"}}
  const name = inner.name
  if (typeof name !== "string" || name.trim() === "") return 'missing "name"'
  const raw = "arguments" in inner ? inner.arguments : inner.parameters
  const args = readArguments(raw ?? {})
  return typeof args === "string" ? `${name}: ${args}` : { name: name.trim(), arguments: args }
}

/** An arguments object, from an object or from JSON text holding one; else why not. */
const readArguments = (raw: unknown): Arguments | string => {
  if (typeof raw === "string") {
    if (raw.trim() === "") return {}
    const value = parseJsonLenient(raw.trim())
    if (!value.ok) return `arguments: invalid JSON: ${value.error}`
    return isObject(value.value) ? value.value : `arguments must be a JSON object, got ${kind(value.value)}`
  }
  if (raw === null || raw === undefined) return {}
  return isObject(raw) ? raw : `arguments must be a JSON object, got ${kind(raw)}`
}

const looksLikeCall = (value: unknown, whole: boolean): boolean => {
  if (!isObject(value)) return false
  const inner = isObject(value.function) ? value.function : value
  return typeof inner.name === "string" && (whole || "arguments" in inner || "parameters" in inner)
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const kind = (value: unknown): string => (value === null ? "null" : Array.isArray(value) ? "an array" : typeof value)

/** `<function=name><parameter=k>v</parameter>…</function>` (Qwen3-Coder). Values are JSON when they parse. */
const readQwenCoder = (body: string): Attempt => {
  const head = /^<function=([^>\s]*)>/.exec(body)
  const name = head?.[1]?.trim() ?? ""
  if (name === "") return "missing function name"
  const args: Arguments = {}
  for (const [key, value] of parameters(body)) args[key] = scalar(value.replace(/^\n/, "").replace(/\n$/, ""))
  return { name, arguments: args }
}

/**
 * The `<parameter=k>v` pairs of a Qwen3-Coder body, in order. `k` runs to the first `>` (a key that meets whitespace
 * first is not one); `v` ends at the first `</parameter>`, `<parameter=`, `</function>` or the end of the body. One
 * forward pass: each marker and each key's end is searched for once, so a body of 100k unclosed `<parameter=` is
 * linear (a regex rescanning from every `<parameter=` took 17 s on 256 KiB).
 */
const parameters = (body: string): Array<readonly [string, string]> => {
  const open = "<parameter="
  const nextOpen = nextIndex(body, open)
  const nextClose = nextIndex(body, "</parameter>")
  const nextEnd = nextIndex(body, "</function>")
  const keyEnd = /[>\s]/g
  let stop = -1 // the first `>` or whitespace at or after the last key's start (body.length: none)
  const out: Array<readonly [string, string]> = []
  let at = 0
  for (let start = nextOpen(at); start !== -1; start = nextOpen(at)) {
    const keyStart = start + open.length
    if (stop < keyStart) {
      keyEnd.lastIndex = keyStart
      stop = keyEnd.exec(body)?.index ?? body.length
    }
    if (stop === keyStart || body[stop] !== ">") {
      at = start + 1
      continue
    }
    const valueStart = stop + 1
    const ends = [nextClose(valueStart), nextOpen(valueStart), nextEnd(valueStart)].filter((i) => i !== -1)
    const valueEnd = ends.length === 0 ? body.length : Math.min(...ends)
    out.push([body.slice(keyStart, stop), body.slice(valueStart, valueEnd)])
    // a closing tag is consumed; a following `<parameter=` starts the next pair
    at = body.startsWith("</parameter>", valueEnd)
      ? valueEnd + "</parameter>".length
      : body.startsWith("</function>", valueEnd)
        ? valueEnd + "</function>".length
        : valueEnd
  }
  return out
}

/**
 * `from => text.indexOf(needle, from)` for non-decreasing `from`: the last hit is reused until `from` passes it, so a
 * whole forward pass searches the text once.
 */
const nextIndex = (text: string, needle: string): ((from: number) => number) => {
  let found = -2 // -2: not searched yet; -1: none left
  return (from) => {
    if (found !== -1 && found < from) found = text.indexOf(needle, from)
    return found
  }
}

/** `<k>v</k>` children as fields; values are JSON when they parse (`<a>2</a>` is 2), else the trimmed text. */
const xmlFields = (body: string): Arguments | string => {
  const args: Arguments = {}
  const element = /\s*<([A-Za-z_][\w.-]*)>/y
  let at = 0
  while (at < body.length) {
    element.lastIndex = at
    const open = element.exec(body)
    if (open === null) return body.slice(at).trim() === "" ? args : notFields
    const key = open[1]!
    const end = body.indexOf(`</${key}>`, element.lastIndex)
    if (end === -1) return `<${key}> is not closed`
    args[key] = scalar(body.slice(element.lastIndex, end).trim())
    at = end + key.length + 3
  }
  return args
}

const notFields = "arguments must be a JSON object or <key>value</key> elements"

const scalar = (text: string): unknown => {
  const value = parseJson(text)
  return value.ok ? value.value : text
}

// ---------------------------------------------------------------------------------------------------------------
// Text.

type JsonResult = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly error: string }

const parseJson = (text: string): JsonResult => {
  try {
    return { ok: true, value: JSON.parse(text) }
  } catch (e) {
    // Node adds "(line 1 column 26)" and sometimes quotes the input: keep the first clause, it names the position.
    const message = e instanceof Error ? e.message : "not JSON"
    return {
      ok: false,
      error: message.replace(/\s*\(line \d+ column \d+\)/, "").replace(/, (\.\.\.)?"[\s\S]*" is not valid JSON$/, "")
    }
  }
}

/** JSON text, or its first complete value when only whitespace or stray closing braces follow (a common slip). */
const parseJsonLenient = (text: string): JsonResult => {
  const strict = parseJson(text)
  if (strict.ok || !(text.startsWith("{") || text.startsWith("["))) return strict
  const end = scanJson(text, 0)
  if (end === -1 || !/^[\s}\]]*$/.test(text.slice(end))) return strict
  const first = parseJson(text.slice(0, end))
  return first.ok ? first : strict
}

/**
 * The index just past the JSON object or array that opens at `start`, or -1 when it never closes. Braces inside
 * strings (with their escapes) are not counted.
 */
const scanJson = (text: string, start: number): number => {
  let depth = 0
  let inString = false
  for (let i = start; i < text.length; i++) {
    const c = text[i]
    if (inString) {
      if (c === "\\") i++
      else if (c === '"') inString = false
    } else if (c === '"') inString = true
    else if (c === "{" || c === "[") depth++
    else if (c === "}" || c === "]") {
      depth--
      if (depth === 0) return i + 1
    }
  }
  return -1
}

/** A bracketed region `{…}` or `[…]`; `end` is past its closing bracket, or the text's end when it never closes. */
interface Span {
  readonly start: number
  end: number
  closed: boolean
  readonly children: Array<Span>
}

/**
 * The bracketed regions of the text down to `maxProseDepth` (the deepest `jsonAttempts` reads), nested, in one pass.
 * Quotes open strings only inside brackets (JSON has no strings outside), so apostrophes and quotes in prose do not
 * hide the calls after them. Deeper brackets are only counted: a turn of a million `[` makes five spans, not a million.
 */
const bracketTree = (text: string): Array<Span> => {
  const roots: Array<Span> = []
  const stack: Array<Span> = [] // the open spans down to maxProseDepth
  let depth = 0 // brackets open at i
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (inString) {
      if (c === "\\") i++
      else if (c === '"') inString = false
    } else if (c === '"') inString = depth > 0
    else if (c === "{" || c === "[") {
      if (depth <= maxProseDepth) {
        const span: Span = { start: i, end: text.length, closed: false, children: [] }
        ;(stack.at(-1)?.children ?? roots).push(span)
        stack.push(span)
      }
      depth++
    } else if ((c === "}" || c === "]") && depth > 0) {
      depth--
      if (depth <= maxProseDepth) {
        const span = stack.pop()!
        span.end = i + 1
        span.closed = true
      }
    }
  }
  return roots
}

/** How deep into brackets that are not JSON ("{see [note {…}]}") calls are still looked for. */
const maxProseDepth = 4

/**
 * The call attempts in bracketed regions: a region that parses gives the calls in it; one that does not gives the
 * calls found inside it, or, when there are none and it names a `"name"` key, one broken call. Work is linear in the
 * text times `maxProseDepth`: degenerate outputs ("{{{{…") are common early in training.
 */
const jsonAttempts = (text: string, spans: ReadonlyArray<Span>, depth: number): Array<Attempt> =>
  spans.flatMap((span) => {
    const source = text.slice(span.start, span.end)
    // A region that never closes cannot parse (JSON.parse would fail where the bracket count does): its message is
    // computed only if it is shown, so "[[[[…" is parsed once, not once per level.
    const value = span.closed ? parseJson(source) : undefined
    if (value?.ok === true) return callsIn(value.value, false)
    const inner = depth < maxProseDepth ? jsonAttempts(text, span.children, depth + 1) : []
    if (inner.length > 0 || !/"name"\s*:/.test(source)) return inner
    const failed = value ?? parseJson(source)
    return failed.ok ? callsIn(failed.value, false) : [`invalid JSON: ${failed.error}`]
  })

/** Bodies of `<tag>…</tag>`; the last one may lack its closing tag. */
const blocks = (text: string, tag: string): Array<string> => {
  const open = `<${tag}>`
  const close = `</${tag}>`
  const out: Array<string> = []
  let at = text.indexOf(open)
  let end = -2 // the next closing tag at or after `from`; -1 once there is none (kept, so each search is done once)
  while (at !== -1) {
    const from = at + open.length
    if (end !== -1 && end < from) end = text.indexOf(close, from)
    const next = text.indexOf(open, from)
    if (end === -1 || (next !== -1 && next < end)) {
      out.push(text.slice(from, next === -1 ? text.length : next))
      at = next
    } else {
      out.push(text.slice(from, end))
      at = text.indexOf(open, end + close.length)
    }
  }
  return out
}

/** The trimmed body of the first `<tag>…</tag>` (closing tag optional), or undefined. */
const tagContent = (text: string, tag: string): string | undefined => {
  const body = blocks(text, tag)[0]
  return body === undefined ? undefined : body.trim()
}

const stripThinking = (text: string): string => {
  if (!text.includes("think>")) return text // neither <think> nor </think>
  // Each `<think>` closes at the first `</think>` after it, left to right (what /<think>[\s\S]*?<\/think>/g removes).
  // Once one `<think>` finds no `</think>`, no later one can: stop there. The regex instead rescanned to the end from
  // every unclosed `<think>`, which took 3.5 s on 256 KiB of them.
  const kept: Array<string> = []
  let from = 0
  for (let think = text.indexOf("<think>"); think !== -1; think = text.indexOf("<think>", from)) {
    const close = text.indexOf("</think>", think + "<think>".length)
    if (close === -1) break
    kept.push(text.slice(from, think))
    from = close + "</think>".length
  }
  kept.push(text.slice(from))
  let out = kept.join("")
  const lone = out.indexOf("</think>")
  if (lone !== -1) out = out.slice(lone + "</think>".length) // `<think>` was part of the prompt
  const open = out.indexOf("<think>")
  if (open !== -1) out = out.slice(0, open) // thinking cut off by the length limit
  return out
}

const stripFence = (text: string): string => {
  if (!text.startsWith("```")) return text
  const m = /^```[\w-]*[ \t]*\n([\s\S]*?)\n?```\s*$/.exec(text)
  return m === null ? text : m[1]!.trim()
}

/** JSON with Python's `json.dumps` separators (`", "`, `": "`), as Qwen's and Hermes' chat templates render it. */
export const pythonJson = (value: unknown): string => {
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(", ")}]`
  if (isObject(value)) {
    return `{${Object.entries(value)
      .map(([k, v]) => `${JSON.stringify(k)}: ${pythonJson(v)}`)
      .join(", ")}}`
  }
  return JSON.stringify(value) ?? "null"
}
