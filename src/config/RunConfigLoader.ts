/**
 * Load a run config: YAML (or JSON) file → dotted command-line overrides → unknown-key check → Schema decode with
 * cross-field checks. Every failure is a ConfigError naming the file, the exact key path, the bad value and what
 * was expected. Decoding happens once; the result is passed down in slices.
 */
import { Effect, FileSystem, Schema, SchemaIssue } from "effect"
import { Yaml } from "effect/encoding"
import { ConfigError } from "../domain/Errors.ts"
import * as KeyTree from "./KeyTree.ts"
import { RunConfig } from "./RunConfig.ts"

const tree = KeyTree.of(RunConfig)

const show = (value: unknown): string => {
  const text = JSON.stringify(value)
  return text === undefined ? String(value) : text.length > 60 ? `${text.slice(0, 57)}...` : text
}

const get = (raw: unknown, path: ReadonlyArray<PropertyKey>): unknown =>
  path.reduce<unknown>(
    (node, key) =>
      typeof node === "object" && node !== null ? (node as Record<PropertyKey, unknown>)[key] : undefined,
    raw
  )

/** Parse `a.b.c=value`; the value is read as a YAML scalar or flow collection (`0.1`, `true`, `[a, b]`, `{env: X}`). */
export const parseOverride = (
  text: string
): Effect.Effect<{ readonly path: Array<string>; readonly value: unknown }, ConfigError> => {
  const eq = text.indexOf("=")
  if (eq <= 0) {
    return Effect.fail(new ConfigError({ path: text, message: `override "${text}" is not of the form key.path=value` }))
  }
  const path = text.slice(0, eq).trim().split(".")
  const source = text.slice(eq + 1)
  return Effect.try({
    try: () => ({ path, value: source === "" ? "" : Yaml.parse(source) }),
    catch: () => new ConfigError({ path: path.join("."), message: `cannot read value ${show(source)} of override` })
  })
}

const unknownKeyError = (file: string | undefined, unknown: KeyTree.UnknownKey): ConfigError => {
  const path = unknown.path.join(".")
  const hint = unknown.suggestion === undefined ? "" : ` (did you mean ${unknown.suggestion}?)`
  return new ConfigError({
    ...(file === undefined ? {} : { file }),
    path,
    message: `unknown key ${path}${hint}`
  })
}

const setAt = (raw: Record<string, unknown>, path: ReadonlyArray<string>, value: unknown): void => {
  let node: Record<string, unknown> = raw
  for (const key of path.slice(0, -1)) {
    const next = node[key]
    if (typeof next !== "object" || next === null) node[key] = {}
    node = node[key] as Record<string, unknown>
  }
  node[path[path.length - 1]!] = value
}

/** Apply overrides in order to a copy of the raw config; unknown keys fail with a suggestion. */
export const applyOverrides = Effect.fn("RunConfig.applyOverrides")(function* (
  raw: unknown,
  overrides: ReadonlyArray<string>
) {
  const copy: Record<string, unknown> = structuredClone(typeof raw === "object" && raw !== null ? raw : {}) as Record<
    string,
    unknown
  >
  for (const text of overrides) {
    const { path, value } = yield* parseOverride(text)
    const found = KeyTree.lookup(tree, path)
    if (found._tag === "Missing") {
      const parent = path.slice(0, found.index)
      const parentTree = KeyTree.lookup(tree, parent)
      const suggestion =
        parentTree._tag === "Found" ? KeyTree.suggest(parentTree.tree, parent, path[found.index]!) : undefined
      return yield* unknownKeyError(undefined, { path: path.slice(0, found.index + 1), suggestion })
    }
    setAt(copy, path, value)
  }
  return copy
})

/** The override (`key.path=value` text) that set `key` or a key above it, if one did (the last one wins). */
const overrideOf = (key: string, overrides: ReadonlyArray<string>): string | undefined =>
  overrides.findLast((text) => {
    const at = text.slice(0, Math.max(0, text.indexOf("="))).trim()
    return at !== "" && (key === at || key.startsWith(`${at}.`))
  })

/**
 * Decode a raw config object (already overridden with `overrides`). A problem with a key an override set names the
 * override, not the file: `override trainer.max_steps=abc: trainer.max_steps: Expected number (got "abc")`.
 */
export const decode = Effect.fn("RunConfig.decode")(function* (
  raw: unknown,
  file?: string,
  overrides: ReadonlyArray<string> = []
) {
  const unknown = KeyTree.unknownKeys(tree, raw)
  if (unknown.length > 0) return yield* unknownKeyError(file, unknown[0]!)
  return yield* Schema.decodeUnknownEffect(RunConfig)(raw, { errors: "all" }).pipe(
    Effect.mapError((error) => {
      const issues = SchemaIssue.makeFormatterStandardSchemaV1()(error.issue).issues
      const lines = issues.map((issue) => {
        const path = (issue.path ?? []).map((p) => String(typeof p === "object" ? p.key : p))
        const key = path.join(".")
        const got = get(raw, path)
        const value = got === undefined ? "" : ` (got ${show(got)})`
        const override = overrideOf(key, overrides)
        const line = `${key === "" ? "<root>" : key}: ${issue.message}${value}`
        return { key, override, line: override === undefined ? line : `override ${override}: ${line}` }
      })
      // every problem is an override's: the file is not to blame
      const fromOverrides = lines.length > 0 && lines.every((l) => l.override !== undefined)
      return new ConfigError({
        ...(file === undefined || fromOverrides ? {} : { file }),
        path: lines[0]?.key ?? "",
        message: lines.map((l) => l.line).join("\n")
      })
    })
  )
})

/** Read and parse a YAML/JSON config file into a raw object. */
export const readFile = Effect.fn("RunConfig.readFile")(function* (file: string) {
  const fs = yield* FileSystem.FileSystem
  const text = yield* fs
    .readFileString(file)
    .pipe(
      Effect.mapError((cause) => new ConfigError({ file, path: "", message: `cannot read config: ${cause.message}` }))
    )
  const raw = yield* Effect.try({
    try: () => (file.endsWith(".json") ? JSON.parse(text) : Yaml.parse(text)),
    catch: (cause) =>
      new ConfigError({
        file,
        path: "",
        message: `not valid ${file.endsWith(".json") ? "JSON" : "YAML"}: ${cause instanceof Error ? cause.message : String(cause)}`
      })
  })
  if (raw === null || raw === undefined) return {}
  if (typeof raw !== "object" || Array.isArray(raw)) {
    return yield* new ConfigError({ file, path: "", message: "a config file must be a mapping of sections" })
  }
  return raw as Record<string, unknown>
})

/** File + overrides → decoded RunConfig. */
export const load = Effect.fn("RunConfig.load")(function* (file: string, overrides: ReadonlyArray<string> = []) {
  const raw = yield* readFile(file)
  const overridden = yield* applyOverrides(raw, overrides)
  return yield* decode(overridden, file, overrides)
})

/** For embedding: a config object (encoded form, as in YAML) + overrides → decoded RunConfig. */
export const fromObject = (
  raw: typeof RunConfig.Encoded | Record<string, unknown>,
  overrides: ReadonlyArray<string> = []
) => applyOverrides(raw, overrides).pipe(Effect.flatMap((r) => decode(r, undefined, overrides)))
