/**
 * The canonical data hash of a tau-bench DB (shared/tau-bench/README.md, "Recommended canonical alternative"):
 *
 *   canon(object) = "{" + keys sorted by code unit, each JSON.stringify(key) + ":" + canon(value), joined by "," + "}"
 *   canon(array)  = "[" + elements in order, joined by "," + "]"
 *   canon(other)  = JSON.stringify(other)
 *   hash(data)    = sha256_hex(utf8(canon(data)))
 *
 * Equivalent to upstream's `get_data_hash()` for rewards: it differs only in reading `46` and `46.0` as equal.
 *
 * Gotchas: never build a key-sorted object and `JSON.stringify` it: JavaScript puts integer-like keys first
 * (airline reservation `"429815"`, retail item ids), which gives wrong hashes. `hashTables` streams the text into
 * the digest and reuses the text of frozen (never-edited) records, so hashing a 6 MB DB after an episode costs one
 * pass over the records the episode changed plus the digest.
 */
import { createHash, type Hash } from "node:crypto"

/** The canonical text of a JSON value. */
export const canon = (v: unknown): string =>
  Array.isArray(v)
    ? `[${v.map(canon).join(",")}]`
    : v !== null && typeof v === "object"
      ? `{${Object.keys(v)
          .sort()
          .map((k) => `${JSON.stringify(k)}:${canon((v as Record<string, unknown>)[k])}`)
          .join(",")}}`
      : (JSON.stringify(v) ?? "null")

/** sha256 hex of `canon(value)`. */
export const hash = (value: unknown): string => createHash("sha256").update(canon(value), "utf8").digest("hex")

// canon text of frozen records, which can never change
const frozenText = new WeakMap<object, string>()

const cachedCanon = (v: unknown): string => {
  if (v === null || typeof v !== "object" || !Object.isFrozen(v)) return canon(v)
  let text = frozenText.get(v)
  if (text === undefined) {
    text = canon(v)
    frozenText.set(v, text)
  }
  return text
}

const updateObject = (digest: Hash, obj: Readonly<Record<string, unknown>>, depth: number): void => {
  digest.update("{")
  let first = true
  for (const key of Object.keys(obj).sort()) {
    digest.update(`${first ? "" : ","}${JSON.stringify(key)}:`)
    first = false
    const value = obj[key]
    if (depth > 0 && value !== null && typeof value === "object" && !Array.isArray(value)) {
      updateObject(digest, value as Record<string, unknown>, depth - 1)
    } else {
      digest.update(cachedCanon(value), "utf8")
    }
  }
  digest.update("}")
}

/**
 * `hash(tables)` for a DB of tables of records (`{orders: {id: order}}`): the same digest, computed record by record
 * so that frozen records' text is computed once per process.
 */
export const hashTables = (tables: Readonly<Record<string, Readonly<Record<string, unknown>>>>): string => {
  const digest = createHash("sha256")
  updateObject(digest, tables, 1)
  return digest.digest("hex")
}
