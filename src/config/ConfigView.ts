/**
 * The resolved config as a person reads it: YAML, with secrets redacted. A secret reference `{ env: NAME }` shows
 * whether the variable is set, never its value; record values under secret-looking keys (Authorization, *token*,
 * *secret*, *password*, *api_key*) are hidden too, since MCP headers and env blocks often carry credentials.
 */
const secretKey = /authorization|token|secret|password|passwd|api[-_]?key|cookie/i

const isSecretRef = (value: unknown): value is { readonly env: string } =>
  typeof value === "object" &&
  value !== null &&
  !Array.isArray(value) &&
  Object.keys(value).length === 1 &&
  typeof (value as { env?: unknown }).env === "string"

export const redact = (
  value: unknown,
  env: Readonly<Record<string, string | undefined>> = process.env,
  key = ""
): unknown => {
  if (isSecretRef(value)) return `<redacted: $${value.env} ${env[value.env] === undefined ? "unset" : "set"}>`
  if (typeof value === "string" && secretKey.test(key)) return "<redacted>"
  if (Array.isArray(value)) return value.map((v) => redact(v, env, key))
  if (typeof value === "object" && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redact(v, env, k)]))
  }
  return value
}

const scalar = (value: unknown): string => {
  if (typeof value === "string") {
    return /^[\w./<>$@ -]+$/.test(value) && !/^(true|false|null|~|-?\d.*)$/i.test(value) && value.trim() === value
      ? value
      : JSON.stringify(value)
  }
  return value === null || value === undefined ? "null" : String(value)
}

/** Block-style YAML for plain data (what `config check` prints). */
export const toYaml = (value: unknown, indent = 0): string => {
  const pad = " ".repeat(indent)
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]"
    return value
      .map((item) => {
        if (typeof item === "object" && item !== null && !Array.isArray(item) && Object.keys(item).length > 0) {
          const body = toYaml(item, indent + 2)
          return `${pad}- ${body.slice(indent + 2)}`
        }
        return `${pad}- ${typeof item === "object" && item !== null ? JSON.stringify(item) : scalar(item)}`
      })
      .join("\n")
  }
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value)
    if (entries.length === 0) return "{}"
    return entries
      .map(([k, v]) => {
        if (Array.isArray(v)) return v.length === 0 ? `${pad}${k}: []` : `${pad}${k}:\n${toYaml(v, indent + 2)}`
        if (typeof v === "object" && v !== null) {
          return Object.keys(v).length === 0 ? `${pad}${k}: {}` : `${pad}${k}:\n${toYaml(v, indent + 2)}`
        }
        return `${pad}${k}: ${scalar(v)}`
      })
      .join("\n")
  }
  return `${pad}${scalar(value)}`
}
