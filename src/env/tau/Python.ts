/**
 * The few pieces of Python semantics the tau-bench tools depend on: `round(x, 2)`, float `repr`, `json.dumps`
 * formatting, the exception texts a tool call can surface (`KeyError` → `'key'`, a missing keyword argument), and the
 * `eval` that `calculate` runs on arithmetic.
 *
 * Gotchas:
 * 1. JavaScript has one number type. Python's int/float distinction shows only in text (`46.0` vs `46`); the reward
 *    hash is the canonical one (see Hash.ts), which does not see it, so only observations differ (`dumps` writes `46`
 *    where upstream writes `46.0`), and `calculate`, which tracks it itself.
 * 2. `dumps` keeps JavaScript's key order, which puts integer-like keys (retail item ids) first; upstream keeps file
 *    order. The reward never reads observations.
 */

/** An exception a tool raises; the env shows it as `Error: <message>`, as upstream's `f"Error: {e}"` does. */
export class PyException extends Error {}

/** Python `KeyError(key)`: its `str` is the key's repr. */
export const keyError = (key: string): PyException => new PyException(reprString(key))

/** Python `repr` of a str: single quotes unless the text holds `'` and no `"`. */
export const reprString = (s: string): string => {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'"
  let out = quote
  for (const ch of s) {
    const code = ch.codePointAt(0)!
    if (ch === "\\") out += "\\\\"
    else if (ch === quote) out += `\\${quote}`
    else if (ch === "\n") out += "\\n"
    else if (ch === "\r") out += "\\r"
    else if (ch === "\t") out += "\\t"
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`
    else out += ch
  }
  return out + quote
}

/**
 * Python `round(x, 2)` on a float: the exact binary value rounded half-to-even. `toFixed` rounds the exact value too
 * but sends ties away from zero; a tie at 2 decimals needs x = k/8 with k odd, so those are handled apart.
 */
export const round2 = (x: number): number => {
  if (!Number.isFinite(x)) return x
  const eighths = Math.abs(x) * 8
  if (Number.isInteger(eighths) && eighths % 2 === 1 && Math.abs(x) < 1e15) {
    const floor = Math.floor(Math.abs(x) * 100) // exact: |x|·100 = 12.5·k
    const even = floor % 2 === 0 ? floor : floor + 1
    return (Math.sign(x) * even) / 100
  }
  if (Math.abs(x) >= 1e21) return x
  return Number(x.toFixed(2))
}

/** Python float `repr`: shortest round-trip digits, always with a `.` or an exponent (`46.0`, `1e-05`, `1e+16`). */
export const reprFloat = (x: number): string => {
  if (Number.isNaN(x)) return "nan"
  if (x === Infinity) return "inf"
  if (x === -Infinity) return "-inf"
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0"
  const [mantissa, expText] = x.toExponential().split("e") as [string, string]
  const exp = Number(expText)
  if (exp < -4 || exp >= 16) {
    return `${mantissa}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`
  }
  const plain = Math.abs(x) >= 1e21 ? BigInt(x).toString() : x.toString()
  return plain.includes(".") || plain.includes("e") ? plain : `${plain}.0`
}

/** `json.dumps(value)` with Python's default separators (`", "`, `": "`) and ASCII escaping. */
export const dumps = (value: unknown): string => {
  if (value === null || value === undefined) return "null"
  if (typeof value === "boolean") return value ? "true" : "false"
  if (typeof value === "number") return Number.isFinite(value) ? String(value) : value > 0 ? "Infinity" : "-Infinity"
  if (typeof value === "string") return asciiJsonString(value)
  if (Array.isArray(value)) return `[${value.map(dumps).join(", ")}]`
  return `{${Object.entries(value as Record<string, unknown>)
    .map(([k, v]) => `${asciiJsonString(k)}: ${dumps(v)}`)
    .join(", ")}}`
}

const asciiJsonString = (s: string): string =>
  JSON.stringify(s).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)

/** `Cls.invoke() missing 2 required positional arguments: 'a' and 'b'`, CPython's wording. */
export const missingArguments = (className: string, names: ReadonlyArray<string>): string => {
  const quoted = names.map((n) => `'${n}'`)
  const list =
    quoted.length === 1
      ? quoted[0]
      : quoted.length === 2
        ? `${quoted[0]} and ${quoted[1]}`
        : `${quoted.slice(0, -1).join(", ")}, and ${quoted.at(-1)}`
  const noun = names.length === 1 ? "argument" : "arguments"
  return `${className}.invoke() missing ${names.length} required positional ${noun}: ${list}`
}

export const unexpectedArgument = (className: string, name: string): string =>
  `${className}.invoke() got an unexpected keyword argument '${name}'`

// ---------------------------------------------------------------------------------------------------------------
// calculate: Python `eval` of `0123456789+-*/(). ` expressions, with Python's int/float typing.

interface PyNum {
  readonly value: number
  readonly float: boolean
}

type Token = { kind: "num"; text: string } | { kind: "op"; text: string }

const syntaxError = (): PyException => new PyException("invalid syntax (<string>, line 1)")

const tokenize = (expr: string): Array<Token> => {
  const tokens: Array<Token> = []
  let i = 0
  while (i < expr.length) {
    const c = expr[i]!
    if (c === " ") {
      i++
      continue
    }
    if ((c >= "0" && c <= "9") || c === ".") {
      let j = i
      while (j < expr.length && ((expr[j]! >= "0" && expr[j]! <= "9") || expr[j] === ".")) j++
      const text = expr.slice(i, j)
      if (text === "." || text.split(".").length > 2) throw syntaxError()
      if (!text.includes(".") && text.length > 1 && text[0] === "0" && /[1-9]/.test(text)) {
        throw new PyException(
          "leading zeros in decimal integer literals are not permitted; use an 0o prefix for octal integers (<string>, line 1)"
        )
      }
      tokens.push({ kind: "num", text })
      i = j
      continue
    }
    const two = expr.slice(i, i + 2)
    if (two === "**" || two === "//") {
      tokens.push({ kind: "op", text: two })
      i += 2
      continue
    }
    tokens.push({ kind: "op", text: c })
    i++
  }
  return tokens
}

const zeroDivision = (float: boolean, op: string): PyException =>
  new PyException(
    op === "/"
      ? float
        ? "float division by zero"
        : "division by zero"
      : float
        ? "float floor division by zero"
        : "integer division or modulo by zero"
  )

const binary = (op: string, a: PyNum, b: PyNum): PyNum => {
  const float = a.float || b.float
  switch (op) {
    case "+":
      return { value: a.value + b.value, float }
    case "-":
      return { value: a.value - b.value, float }
    case "*":
      return { value: a.value * b.value, float }
    case "/":
      if (b.value === 0) throw zeroDivision(float, "/")
      return { value: a.value / b.value, float: true }
    case "//":
      if (b.value === 0) throw zeroDivision(float, "//")
      return { value: Math.floor(a.value / b.value), float }
    default: {
      // "**": an int to a negative int power is a float in Python
      if (a.value === 0 && b.value < 0) throw new PyException("0.0 cannot be raised to a negative power")
      return { value: a.value ** b.value, float: float || b.value < 0 }
    }
  }
}

/** Recursive descent over Python's precedence: `+ -` < `* / //` < unary `+ -` < `**` (right-assoc, binds tighter). */
const evaluate = (tokens: ReadonlyArray<Token>): PyNum => {
  let pos = 0
  const peek = () => tokens[pos]
  const expression = (): PyNum => {
    let left = term()
    while (peek()?.kind === "op" && (peek()!.text === "+" || peek()!.text === "-")) {
      const op = tokens[pos++]!.text
      left = binary(op, left, term())
    }
    return left
  }
  const term = (): PyNum => {
    let left = unary()
    while (peek()?.kind === "op" && ["*", "/", "//"].includes(peek()!.text)) {
      const op = tokens[pos++]!.text
      left = binary(op, left, unary())
    }
    return left
  }
  const unary = (): PyNum => {
    const t = peek()
    if (t?.kind === "op" && (t.text === "+" || t.text === "-")) {
      pos++
      const operand = unary()
      return t.text === "-" ? { value: -operand.value, float: operand.float } : operand
    }
    return power()
  }
  const power = (): PyNum => {
    const base = atom()
    if (peek()?.kind === "op" && peek()!.text === "**") {
      pos++
      return binary("**", base, unary())
    }
    return base
  }
  const atom = (): PyNum => {
    const t = tokens[pos++]
    if (t === undefined) throw syntaxError()
    if (t.kind === "num") return { value: Number(t.text), float: t.text.includes(".") }
    if (t.text === "(") {
      const inner = expression()
      const close = tokens[pos++]
      if (close?.kind !== "op" || close.text !== ")") throw syntaxError()
      return inner
    }
    throw syntaxError()
  }
  const result = expression()
  if (pos !== tokens.length) throw syntaxError()
  return result
}

/** Upstream `calculate`: `str(round(float(eval(expression)), 2))`, or its error text. */
export const calculate = (expression: string): string => {
  for (const ch of expression) {
    if (!"0123456789+-*/(). ".includes(ch)) return "Error: invalid characters in expression"
  }
  try {
    const result = evaluate(tokenize(expression))
    if (!Number.isFinite(result.value)) {
      return result.float || Number.isNaN(result.value)
        ? `Error: (34, 'Numerical result out of range')`
        : "Error: int too large to convert to float"
    }
    return reprFloat(round2(result.value))
  } catch (e) {
    return `Error: ${e instanceof Error ? e.message : String(e)}`
  }
}
