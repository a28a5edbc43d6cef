/**
 * `node scripts/config-doc.ts` writes docs/config.md, the configuration reference, from the config schemas;
 * `--check` writes nothing and exits 1 when the file differs from what the schemas give now (test/docs/ConfigDoc.test.ts
 * fails then too).
 *
 * Keys, types and defaults are read off `RunConfig`'s AST at run time, so they cannot drift from what decoding does:
 * a key's default is what decoding an absent key gives (inside a section whose own default sets it, e.g.
 * `trainer.critic_optimizer.lr`, the section's). Meanings come from the source, since the schemas carry no
 * descriptions: the comments beside each field in src/config/*.ts (the lines above it and the rest of its line), after
 * the doc comment of the schema the field names, if it has one (`model: ModelConfig` → ModelConfig's doc comment).
 * A section's doc comment introduces it.
 */
import { readdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { Option, Schema, SchemaAST } from "effect"
import * as KeyTree from "../src/config/KeyTree.ts"
import { RunConfig } from "../src/config/RunConfig.ts"

const root = join(import.meta.dirname, "..")
const configDir = join(root, "src", "config")

/** Where the reference is written, from the repository root. */
export const path = "docs/config.md"

// ---------------------------------------------------------------------------------------------------------------------
// The source: struct literals and the comments beside their fields

interface Token {
  readonly kind: "comment" | "punct" | "word" | "string"
  readonly text: string
  readonly line: number
}

/** TypeScript, coarsely: comments, strings (templates whole), words and one-character punctuation. */
const lex = (source: string, file: string): Array<Token> => {
  const tokens: Array<Token> = []
  let line = 1
  let i = 0
  const skipString = (quote: string): void => {
    i++
    while (i < source.length && source[i] !== quote) {
      if (source[i] === "\\") i++
      else if (source[i] === "\n") line++
      else if (quote === "`" && source[i] === "$" && source[i + 1] === "{") {
        let depth = 0
        while (i < source.length) {
          if (source[i] === "{") depth++
          else if (source[i] === "}" && --depth === 0) break
          else if (source[i] === "\n") line++
          i++
        }
      }
      i++
    }
    if (i >= source.length) throw new Error(`${file}:${line}: unterminated string`)
    i++
  }
  while (i < source.length) {
    const c = source[i]!
    const start = i
    const startLine = line
    if (c === "\n") {
      line++
      i++
    } else if (/\s/.test(c)) {
      i++
    } else if (c === "/" && source[i + 1] === "/") {
      const end = source.indexOf("\n", i)
      i = end === -1 ? source.length : end
      tokens.push({ kind: "comment", text: source.slice(start, i), line: startLine })
    } else if (c === "/" && source[i + 1] === "*") {
      const end = source.indexOf("*/", i + 2)
      if (end === -1) throw new Error(`${file}:${line}: unterminated comment`)
      i = end + 2
      const text = source.slice(start, i)
      line += text.split("\n").length - 1
      tokens.push({ kind: "comment", text, line: startLine })
    } else if (c === '"' || c === "'" || c === "`") {
      skipString(c)
      tokens.push({ kind: "string", text: source.slice(start, i), line: startLine })
    } else if (/[\w$]/.test(c)) {
      while (i < source.length && /[\w$]/.test(source[i]!)) i++
      tokens.push({ kind: "word", text: source.slice(start, i), line: startLine })
    } else {
      i++
      tokens.push({ kind: "punct", text: c, line: startLine })
    }
  }
  return tokens
}

/** A comment as one line of prose: markers, `*` margins and `{@link …}` taken away. */
const commentText = (comment: string): string =>
  comment
    .replace(/^\/\*\*?|\*\/$/g, "")
    .split("\n")
    .map((l) => l.replace(/^\s*(\/\/|\*(?!\/))?\s?/, ""))
    .join(" ")
    .replace(/\{@link\s+([^}]+)\}/g, "$1")
    .replace(/\s+/g, " ")
    .trim()

interface SourceField {
  readonly key: string
  readonly comment: string
  // identifiers the field's schema expression uses (to find the doc comment of the schema it names)
  readonly words: ReadonlyArray<string>
}

interface SourceStruct {
  readonly where: string
  readonly fields: ReadonlyArray<SourceField>
}

interface Source {
  readonly structs: ReadonlyArray<SourceStruct>
  // name → doc comment, for every `const NAME =` that has one (Field.ts's helpers left out: the type column says it)
  readonly docs: ReadonlyMap<string, string>
  // struct → the name it is declared as, where it is `const NAME = Schema.Struct(…)`
  readonly names: ReadonlyMap<SourceStruct, string>
}

const isOpen = (t: Token) => t.kind === "punct" && "([{".includes(t.text)
const isClose = (t: Token) => t.kind === "punct" && ")]}".includes(t.text)

/** The fields of the object literal whose `{` is at `open` (`tokens` without comments are walked, comments read). */
const parseObject = (tokens: ReadonlyArray<Token>, open: number, where: string): Array<SourceField> => {
  const fields: Array<SourceField> = []
  let leading: Array<string> = []
  let i = open + 1
  while (i < tokens.length) {
    const t = tokens[i]!
    if (t.kind === "comment") {
      leading.push(commentText(t.text))
      i++
      continue
    }
    if (t.kind === "punct" && t.text === "}") return fields
    const colon = tokens[i + 1]
    if ((t.kind !== "word" && t.kind !== "string") || colon?.text !== ":") {
      throw new Error(`${where}:${t.line}: expected a field, found ${t.text}`)
    }
    const key = t.kind === "string" ? t.text.slice(1, -1) : t.text
    const words: Array<string> = []
    const trailing: Array<string> = []
    let depth = 0
    let last = t
    i += 2
    for (; i < tokens.length; i++) {
      const u = tokens[i]!
      if (u.kind === "comment") {
        if (depth === 0 && u.line === last.line) trailing.push(commentText(u.text))
        continue
      }
      if (depth === 0 && u.kind === "punct" && (u.text === "," || u.text === "}")) break
      if (isOpen(u)) depth++
      else if (isClose(u)) depth--
      if (u.kind === "word") words.push(u.text)
      last = u
    }
    const end = tokens[i]
    if (end?.text === ",") {
      // the rest of the comma's line belongs to this field
      for (i++; i < tokens.length && tokens[i]!.kind === "comment" && tokens[i]!.line === end.line; i++) {
        trailing.push(commentText(tokens[i]!.text))
      }
    }
    fields.push({ key, comment: [...leading, ...trailing].join(" "), words })
    leading = []
  }
  throw new Error(`${where}: unterminated object`)
}

const readSource = (): Source => {
  const structs: Array<SourceStruct> = []
  const docs = new Map<string, string>()
  const names = new Map<SourceStruct, string>()
  const files = readdirSync(configDir)
    .filter((f) => f.endsWith(".ts"))
    .sort()
  for (const file of files) {
    const text = readFileSync(join(configDir, file), "utf8")
    if (!text.includes("Schema.Struct(")) continue
    const where = `src/config/${file}`
    const tokens = lex(text, where)
    for (let i = 0; i < tokens.length; i++) {
      const t = tokens[i]!
      if (t.kind === "word" && t.text === "const" && tokens[i + 2]?.text === "=") {
        const before = tokens[i - 1]?.text === "export" ? tokens[i - 2] : tokens[i - 1]
        if (file !== "Field.ts" && before?.kind === "comment" && before.text.startsWith("/**")) {
          docs.set(tokens[i + 1]!.text, commentText(before.text))
        }
      }
      const isStruct =
        t.text === "Schema" &&
        tokens[i + 1]?.text === "." &&
        tokens[i + 2]?.text === "Struct" &&
        tokens[i + 3]?.text === "(" &&
        tokens[i + 4]?.text === "{"
      if (!isStruct) continue
      const struct: SourceStruct = { where: `${where}:${t.line}`, fields: parseObject(tokens, i + 4, where) }
      structs.push(struct)
      if (tokens[i - 1]?.text === "=" && tokens[i - 3]?.text === "const") names.set(struct, tokens[i - 2]!.text)
    }
  }
  return { structs, docs, names }
}

// ---------------------------------------------------------------------------------------------------------------------
// The schema: keys, types and defaults

interface Check {
  readonly annotations?: { readonly representation?: { readonly id?: string; readonly payload?: unknown } }
}
interface Ast {
  readonly _tag: string
  readonly checks?: ReadonlyArray<Check>
  readonly propertySignatures?: ReadonlyArray<{ readonly name: PropertyKey; readonly type: Ast }>
  readonly indexSignatures?: ReadonlyArray<{ readonly parameter: Ast; readonly type: Ast }>
  readonly rest?: ReadonlyArray<Ast>
  readonly types?: ReadonlyArray<Ast>
  readonly literal?: unknown
}
type Property = NonNullable<Ast["propertySignatures"]>[number]

const isStruct = (ast: Ast): boolean =>
  ast._tag === "Objects" && (ast.indexSignatures?.length ?? 0) === 0 && (ast.propertySignatures?.length ?? 0) > 0
const isSecretRef = (ast: Ast): boolean =>
  isStruct(ast) && ast.propertySignatures!.length === 1 && ast.propertySignatures![0]!.name === "env"

const checksOf = (ast: Ast) =>
  (ast.checks ?? []).flatMap((c) => {
    const r = c.annotations?.representation
    return r?.id === undefined ? [] : [{ id: r.id.replace("effect/schema/", ""), payload: r.payload as never }]
  })

const numberType = (ast: Ast): string => {
  const checks = checksOf(ast)
  const name = checks.some((c) => c.id === "isInt") ? "integer" : "number"
  let low: string | undefined
  let high: string | undefined
  for (const { id, payload } of checks) {
    const p = payload as Record<string, number>
    if (id === "isGreaterThan") low = `> ${p.exclusiveMinimum}`
    if (id === "isGreaterThanOrEqualTo") low = `≥ ${p.minimum}`
    if (id === "isLessThan") high = `< ${p.exclusiveMaximum}`
    if (id === "isLessThanOrEqualTo") high = `≤ ${p.maximum}`
    if (id === "isBetween") {
      low = `≥ ${p.minimum}`
      high = `≤ ${p.maximum}`
    }
  }
  if (low?.startsWith("≥") && high?.startsWith("≤")) return `${name} in [${low.slice(2)}, ${high.slice(2)}]`
  return [name, low, high].filter((s) => s !== undefined).join(" ")
}

/** The type column: what a YAML value must be. */
const typeOf = (ast: Ast): string => {
  switch (ast._tag) {
    case "String":
      return checksOf(ast).some((c) => c.id === "isMinLength") ? "non-empty string" : "string"
    case "Number":
      return numberType(ast)
    case "Boolean":
      return "boolean"
    case "Literal":
      return `\`${String(ast.literal)}\``
    case "Unknown":
      return "any"
    case "Union": {
      const types = ast.types ?? []
      if (types.every((t) => t._tag === "Literal")) return `one of ${types.map(typeOf).join(", ")}`
      return types.map(typeOf).join(" or ")
    }
    case "Arrays": {
      const item = ast.rest?.[0]
      const min = checksOf(ast).find((c) => c.id === "isMinLength")?.payload as { minLength: number } | undefined
      const of = item === undefined ? "list" : `list of ${isStruct(item) ? "sections" : typeOf(item)}`
      return min === undefined ? of : `${of} (at least ${min.minLength})`
    }
    case "Objects": {
      if (isSecretRef(ast)) return "secret `{env: NAME}`"
      const index = ast.indexSignatures?.[0]
      if (index !== undefined) return `map of ${typeOf(index.parameter)} to ${typeOf(index.type)}`
      return "section"
    }
    default:
      return ast._tag
  }
}

type Default =
  | { readonly _tag: "Value"; readonly value: unknown }
  | { readonly _tag: "Unset" }
  | { readonly _tag: "Required" }

/** What decoding gives this key when it is absent: a value, nothing (an optional key), or a "missing key" error. */
const probe = (property: Property): Default => {
  const alone = Schema.make<Schema.Codec<Record<PropertyKey, unknown>>>(new SchemaAST.Objects([property as never], []))
  const decoded = Schema.decodeUnknownOption(alone)({})
  if (Option.isNone(decoded)) return { _tag: "Required" }
  return property.name in decoded.value ? { _tag: "Value", value: decoded.value[property.name] } : { _tag: "Unset" }
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/** A value as YAML flow: `auto`, `[q_proj, k_proj]`, `{}`. */
const yaml = (value: unknown): string => {
  if (Array.isArray(value)) return `[${value.map(yaml).join(", ")}]`
  if (isRecord(value)) {
    return `{${Object.entries(value)
      .map(([k, v]) => `${k}: ${yaml(v)}`)
      .join(", ")}}`
  }
  if (typeof value === "string")
    return value === "" || /^[\s[{]|[:#,]\s|\s$/.test(value) ? JSON.stringify(value) : value
  if (typeof value === "number" && value !== 0 && Math.abs(value) < 1e-3) return value.toExponential()
  return String(value)
}

interface Row {
  readonly key: string
  readonly type: string
  readonly default: string
  readonly meaning: string
}

interface Section {
  readonly key: string
  readonly intro: string
  readonly rows: ReadonlyArray<Row>
}

/** Prose pieces as one text, each but the last ending a sentence. */
const prose = (...pieces: ReadonlyArray<string | undefined>): string =>
  pieces
    .filter((p): p is string => p !== undefined && p !== "")
    .map((p, i, all) => (i < all.length - 1 ? stop(p) : p))
    .join(" ")

/** A full stop at the end of a piece of prose that ends without one. */
const stop = (text: string): string => (text === "" || /[.!?…:]$/.test(text) ? text : `${text}.`)

/** Every literal value in a section: the names of its keys' choices (`remote`, `llamacpp`, `byte`). */
const literalsOf = (ast: Ast): Array<string> => [
  ...(ast._tag === "Literal" ? [String(ast.literal)] : []),
  ...(ast.types ?? []).flatMap(literalsOf),
  ...(ast.rest ?? []).flatMap(literalsOf),
  ...(ast.propertySignatures ?? []).flatMap((p) => literalsOf(p.type)),
  ...(ast.indexSignatures ?? []).flatMap((i) => literalsOf(i.type))
]

/**
 * A capital for prose that starts with a plain word; not for one that names something as written: a choice's value
 * (`byte or hf`, `remote with LoRA`), a label (`default: …`), a file or a key (`episodes.jsonl`, `max_seq_len`).
 */
const capitalize = (text: string, literals: ReadonlyArray<string>): string => {
  const word = /^[a-z][a-z'-]*(?=[\s,;]|$)/.exec(text)?.[0]
  return word === undefined || literals.includes(word) ? text : text[0]!.toUpperCase() + text.slice(1)
}

const signature = (keys: ReadonlyArray<string>) => keys.join(",")

const collect = (source: Source): ReadonlyArray<Section> => {
  const bySignature = new Map<string, SourceStruct>()
  for (const struct of source.structs) {
    const sig = signature(struct.fields.map((f) => f.key))
    const seen = bySignature.get(sig)
    if (seen !== undefined) throw new Error(`${seen.where} and ${struct.where} declare the same keys: ${sig}`)
    bySignature.set(sig, struct)
  }
  const sourceOf = (ast: Ast): SourceStruct => {
    const sig = signature(ast.propertySignatures!.map((p) => String(p.name)))
    const struct = bySignature.get(sig)
    if (struct === undefined) throw new Error(`no Schema.Struct in src/config/ declares the keys ${sig}`)
    return struct
  }
  const docOf = (field: SourceField | undefined) => {
    const named = field?.words.find((w) => source.docs.has(w))
    return named === undefined ? undefined : source.docs.get(named)
  }

  const walk = (ast: Ast, prefix: string, value: Record<string, unknown> | undefined, rows: Array<Row>): void => {
    const struct = sourceOf(ast)
    for (const property of ast.propertySignatures!) {
      const name = String(property.name)
      const key = `${prefix}.${name}`
      const field = struct.fields.find((f) => f.key === name)
      const found: Default =
        value === undefined ? probe(property) : name in value ? { _tag: "Value", value: value[name] } : probe(property)
      const type = property.type
      const item = type._tag === "Arrays" ? type.rest?.[0] : undefined
      const nested = isStruct(type) && !isSecretRef(type)
      const literals = literalsOf(ast)
      const comment = field?.comment === undefined ? undefined : capitalize(field.comment, literals)
      const meaning = prose(nested || item !== undefined ? docOf(field) : undefined, comment)
      const shown =
        found._tag === "Required"
          ? "required"
          : found._tag === "Unset"
            ? "unset"
            : nested
              ? "(section)"
              : `\`${yaml(found.value)}\``
      const text = meaning === "" ? (docOf(field) ?? "") : meaning
      rows.push({ key, type: typeOf(type), default: shown, meaning: text })
      if (nested) walk(type, key, found._tag === "Value" && isRecord(found.value) ? found.value : undefined, rows)
      else if (item !== undefined && isStruct(item) && !isSecretRef(item)) walk(item, `${key}[]`, undefined, rows)
    }
  }

  const top = RunConfig.ast as unknown as Ast
  const topSource = sourceOf(top)
  return top.propertySignatures!.map((property) => {
    const name = String(property.name)
    const field = topSource.fields.find((f) => f.key === name)
    const found = probe(property)
    const rows: Array<Row> = []
    walk(property.type, name, found._tag === "Value" && isRecord(found.value) ? found.value : undefined, rows)
    const intro = prose(docOf(field), field?.comment)
    return {
      key: name,
      intro: found._tag === "Required" ? prose(intro, "Required: every run config sets it.") : intro,
      rows
    }
  })
}

// ---------------------------------------------------------------------------------------------------------------------
// Markdown

/**
 * Prose for a table cell: `|` escaped everywhere; outside code spans `<`, `*` and a `_` at a word's edge escaped (they
 * would open HTML or emphasis).
 */
const cell = (text: string): string =>
  text
    .split(/(`[^`]*`)/)
    .map((part) =>
      part.startsWith("`")
        ? part
        : part
            .replace(/</g, "&lt;")
            .replace(/\*/g, "\\*")
            .replace(/(?<!\w)_|_(?!\w)/g, "\\_")
    )
    .join("")
    .replace(/\|/g, "\\|")

/** The whole of docs/config.md. */
export const render = (): string => {
  const sections = collect(readSource())
  const moved = SchemaAST.resolveAt<ReadonlyArray<KeyTree.MovedKey>>(KeyTree.movedKeysAnnotation)(RunConfig.ast)
  const lines = [
    "# Configuration reference",
    "",
    "<!-- Generated by `node scripts/config-doc.ts` from the schemas in src/config/: edit those, not this file. -->",
    "",
    "Every key of a run config (`RunConfig`, `src/config/RunConfig.ts`), as its dotted path (`[]`: each item of a",
    "list), with its type, its default (what an absent key decodes to; `unset`: absent unless given; `required`: no",
    "default) and its meaning, taken from the comments beside each field in `src/config/`. How configs, overrides and",
    "secrets work: [configs.md](configs.md).",
    "",
    `Sections: ${sections.map((s) => `[${s.key}](#${s.key})`).join(" · ")}${moved === undefined ? "" : " · [moved keys](#moved-keys)"}`
  ]
  for (const section of sections) {
    lines.push("", `## ${section.key}`, "")
    if (section.intro !== "") lines.push(stop(section.intro), "")
    lines.push("| key | type | default | meaning |", "|---|---|---|---|")
    for (const row of section.rows) {
      lines.push(`| \`${row.key}\` | ${cell(row.type)} | ${cell(row.default)} | ${cell(stop(row.meaning))} |`)
    }
  }
  if (moved !== undefined && moved.length > 0) {
    lines.push("", "## Moved keys", "")
    lines.push("Read at the old path too, with a warning naming both; where both are set, the new one wins.", "")
    lines.push("| old key | new key |", "|---|---|")
    for (const key of moved) lines.push(`| \`${key.from}\` | \`${key.to}\` |`)
  }
  return `${lines.join("\n")}\n`
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const file = join(root, path)
  const rendered = render()
  if (process.argv.includes("--check")) {
    let current = ""
    try {
      current = readFileSync(file, "utf8")
    } catch {
      // a missing file is stale
    }
    if (current !== rendered) {
      console.error(`${path} is stale: run \`node scripts/config-doc.ts\``)
      process.exit(1)
    }
    console.log(`${path} is up to date`)
  } else {
    writeFileSync(file, rendered)
    console.log(`wrote ${path}`)
  }
}
