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
): unknown => redactWith(value, key, (ref) => `<redacted: $${ref.env} ${env[ref.env] === undefined ? "unset" : "set"}>`)

/**
 * The config a run directory keeps (config.yaml), which the report, `eval --model RUN` and `model export --merge` decode
 * again: inline secret-looking values are hidden, while a secret reference `{ env: NAME }` stays as it is — it names
 * the variable, not its value — so the file still decodes as a run config.
 */
export const forRunDirectory = (value: unknown): unknown => redactWith(value, "", (ref) => ref)

const redactWith = (value: unknown, key: string, ref: (ref: { readonly env: string }) => unknown): unknown => {
  if (isSecretRef(value)) return ref(value)
  if (typeof value === "string" && secretKey.test(key)) return "<redacted>"
  if (Array.isArray(value)) return value.map((v) => redactWith(v, key, ref))
  if (typeof value === "object" && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redactWith(v, k, ref)]))
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
