/**
 * A small JSON Schema checker for tool arguments: the subset MCP servers and OpenAI function definitions use in
 * practice. `problems(schema, value)` lists what is wrong as `path: message` (path `$` is the value itself, `$.a[0]`
 * a part of it); an empty list means the value conforms.
 *
 * Checked: `type` (one or a list; `integer` is a whole number), `enum`, `const`, `properties`, `required`,
 * `additionalProperties` (false or a schema), `items` (one schema), `minItems`/`maxItems`, `minimum`/`maximum`,
 * `exclusiveMinimum`/`exclusiveMaximum` (numbers), `minLength`/`maxLength`, `pattern`, `anyOf`/`oneOf`/`allOf`, and
 * local `$ref`s (`#/$defs/…`, `#/definitions/…`). Anything else (`format`, `if`/`then`, remote `$ref`s) is not
 * checked: a value is never rejected for a keyword this checker does not know.
 */

type Schema = Readonly<Record<string, unknown>>

const isObject = (v: unknown): v is Readonly<Record<string, unknown>> =>
  typeof v === "object" && v !== null && !Array.isArray(v)

const typeOf = (v: unknown): string =>
  v === null ? "null" : Array.isArray(v) ? "array" : typeof v === "number" ? "number" : typeof v

const matchesType = (type: string, v: unknown): boolean => {
  switch (type) {
    case "integer":
      return typeof v === "number" && Number.isInteger(v)
    case "number":
      return typeof v === "number" && Number.isFinite(v)
    case "object":
      return isObject(v)
    default:
      return typeOf(v) === type
  }
}

const equal = (a: unknown, b: unknown): boolean => JSON.stringify(a) === JSON.stringify(b)

const child = (path: string, key: string | number): string =>
  typeof key === "number" ? `${path}[${key}]` : /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}["${key}"]`

const resolveRef = (root: Schema, ref: string): Schema | undefined => {
  if (!ref.startsWith("#/")) return undefined
  let node: unknown = root
  for (const part of ref.slice(2).split("/")) {
    if (!isObject(node)) return undefined
    node = node[part.replace(/~1/g, "/").replace(/~0/g, "~")]
  }
  return isObject(node) ? node : undefined
}

const show = (v: unknown): string => {
  const text = JSON.stringify(v) ?? String(v)
  return text.length > 60 ? `${text.slice(0, 57)}...` : text
}

const check = (root: Schema, schema: unknown, value: unknown, path: string, out: Array<string>, depth: number) => {
  if (schema === true || schema === undefined) return
  if (schema === false) {
    out.push(`${path}: no value is allowed here`)
    return
  }
  if (!isObject(schema) || depth > 64) return
  if (typeof schema["$ref"] === "string") {
    const target = resolveRef(root, schema["$ref"])
    if (target !== undefined) check(root, target, value, path, out, depth + 1)
  }
  const type = schema["type"]
  if (typeof type === "string" || Array.isArray(type)) {
    const types = (Array.isArray(type) ? type : [type]).filter((t): t is string => typeof t === "string")
    if (!types.some((t) => matchesType(t, value))) {
      out.push(`${path}: expected ${types.join(" or ")}, got ${typeOf(value)} ${show(value)}`)
      return
    }
  }
  if (Array.isArray(schema["enum"]) && !schema["enum"].some((e) => equal(e, value))) {
    out.push(`${path}: ${show(value)} is not one of ${schema["enum"].map(show).join(", ")}`)
  }
  if ("const" in schema && !equal(schema["const"], value)) {
    out.push(`${path}: must be ${show(schema["const"])}, got ${show(value)}`)
  }
  if (typeof value === "number") {
    const n = (k: string) => (typeof schema[k] === "number" ? (schema[k] as number) : undefined)
    const min = n("minimum")
    const max = n("maximum")
    const xmin = n("exclusiveMinimum")
    const xmax = n("exclusiveMaximum")
    if (min !== undefined && value < min) out.push(`${path}: ${value} is below the minimum ${min}`)
    if (max !== undefined && value > max) out.push(`${path}: ${value} is above the maximum ${max}`)
    if (xmin !== undefined && value <= xmin) out.push(`${path}: ${value} must be above ${xmin}`)
    if (xmax !== undefined && value >= xmax) out.push(`${path}: ${value} must be below ${xmax}`)
  }
  if (typeof value === "string") {
    const length = [...value].length
    if (typeof schema["minLength"] === "number" && length < schema["minLength"]) {
      out.push(`${path}: shorter than ${schema["minLength"]} characters`)
    }
    if (typeof schema["maxLength"] === "number" && length > schema["maxLength"]) {
      out.push(`${path}: longer than ${schema["maxLength"]} characters`)
    }
    if (typeof schema["pattern"] === "string") {
      let re: RegExp | undefined
      try {
        re = new RegExp(schema["pattern"], "u")
      } catch {
        re = undefined // a pattern JavaScript cannot compile is not checked
      }
      if (re !== undefined && !re.test(value)) out.push(`${path}: ${show(value)} does not match /${schema["pattern"]}/`)
    }
  }
  if (Array.isArray(value)) {
    if (typeof schema["minItems"] === "number" && value.length < schema["minItems"]) {
      out.push(`${path}: fewer than ${schema["minItems"]} items`)
    }
    if (typeof schema["maxItems"] === "number" && value.length > schema["maxItems"]) {
      out.push(`${path}: more than ${schema["maxItems"]} items`)
    }
    if (isObject(schema["items"]) || typeof schema["items"] === "boolean") {
      value.forEach((item, i) => check(root, schema["items"], item, child(path, i), out, depth + 1))
    }
  }
  if (isObject(value)) {
    const properties = isObject(schema["properties"]) ? schema["properties"] : {}
    if (Array.isArray(schema["required"])) {
      for (const key of schema["required"]) {
        if (typeof key === "string" && !(key in value)) out.push(`${child(path, key)}: required, missing`)
      }
    }
    for (const [key, v] of Object.entries(value)) {
      if (key in properties) check(root, properties[key], v, child(path, key), out, depth + 1)
      else if (schema["additionalProperties"] === false) {
        const known = Object.keys(properties)
        out.push(`${child(path, key)}: not a known key${known.length > 0 ? ` (known: ${known.join(", ")})` : ""}`)
      } else if (isObject(schema["additionalProperties"])) {
        check(root, schema["additionalProperties"], v, child(path, key), out, depth + 1)
      }
    }
  }
  if (Array.isArray(schema["allOf"])) for (const s of schema["allOf"]) check(root, s, value, path, out, depth + 1)
  for (const keyword of ["anyOf", "oneOf"] as const) {
    const options = schema[keyword]
    if (!Array.isArray(options) || options.length === 0) continue
    const matching = options.filter((s) => {
      const sub: Array<string> = []
      check(root, s, value, path, sub, depth + 1)
      return sub.length === 0
    }).length
    if (matching === 0) out.push(`${path}: matches none of the ${options.length} ${keyword} alternatives`)
    else if (keyword === "oneOf" && matching > 1) out.push(`${path}: matches ${matching} oneOf alternatives, not one`)
  }
}

/** What is wrong with `value` under `schema` (`path: message` each); empty when it conforms. */
export const problems = (schema: Readonly<Record<string, unknown>>, value: unknown): ReadonlyArray<string> => {
  const out: Array<string> = []
  check(schema, schema, value, "$", out, 0)
  return out
}
