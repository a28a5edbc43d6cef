/**
 * The tree of valid config keys, read off a Schema's AST: used to reject unknown keys (a YAML typo would otherwise be
 * silently ignored) and to suggest the closest valid key. A key that moved to another path stays valid at its old
 * path (as an alias of the new one) while the schema lists it under {@link movedKeysAnnotation}; {@link moveKeys}
 * rewrites a raw config to the new paths.
 */
import { type Schema, SchemaAST } from "effect"

export type KeyTree =
  // `moved`: keys that are old paths of moved keys, accepted but never suggested
  | { readonly _tag: "Struct"; readonly keys: ReadonlyMap<string, KeyTree>; readonly moved?: ReadonlySet<string> }
  | { readonly _tag: "Array"; readonly item: KeyTree }
  | { readonly _tag: "Open" } // records, unknowns, scalars: anything below is not checked here

const open: KeyTree = { _tag: "Open" }

interface AstLike {
  readonly _tag: string
  readonly propertySignatures?: ReadonlyArray<{ readonly name: PropertyKey; readonly type: AstLike }>
  readonly indexSignatures?: ReadonlyArray<unknown>
  readonly rest?: ReadonlyArray<AstLike>
  readonly types?: ReadonlyArray<AstLike>
}

const fromAst = (ast: AstLike): KeyTree => {
  switch (ast._tag) {
    case "Objects": {
      if ((ast.indexSignatures?.length ?? 0) > 0 || (ast.propertySignatures?.length ?? 0) === 0) return open
      return {
        _tag: "Struct",
        keys: new Map(ast.propertySignatures!.map((p) => [String(p.name), fromAst(p.type)]))
      }
    }
    case "Arrays":
      return ast.rest !== undefined && ast.rest.length > 0 ? { _tag: "Array", item: fromAst(ast.rest[0]!) } : open
    case "Union": {
      const structs = (ast.types ?? []).map(fromAst).filter((t) => t._tag === "Struct")
      return structs.length === 1 ? structs[0]! : open
    }
    default:
      return open
  }
}

/** A config key that moved, as dotted paths. */
export interface MovedKey {
  readonly from: string
  readonly to: string
}

/** The annotation under which a Schema lists its {@link MovedKey}s (read by {@link of}). */
export const movedKeysAnnotation = "rl/config/movedKeys"

/** The tree with `from` accepted as an alias of the subtree at `to` (unchanged where either path is not there). */
const alias = (tree: KeyTree, moved: MovedKey): KeyTree => {
  const target = lookup(tree, moved.to.split("."))
  if (target._tag === "Missing") return tree
  const go = (node: KeyTree, path: ReadonlyArray<string>): KeyTree => {
    if (node._tag !== "Struct") return node
    const [key, ...rest] = path as [string, ...Array<string>]
    if (rest.length === 0) {
      return {
        ...node,
        keys: new Map([...node.keys, [key, target.tree]]),
        moved: new Set([...(node.moved ?? []), key])
      }
    }
    const child = node.keys.get(key)
    return child === undefined ? node : { ...node, keys: new Map([...node.keys, [key, go(child, rest)]]) }
  }
  return go(tree, moved.from.split("."))
}

export const of = (schema: Schema.Top): KeyTree => {
  const moved = SchemaAST.resolveAt<ReadonlyArray<MovedKey>>(movedKeysAnnotation)(schema.ast) ?? []
  return moved.reduce(alias, fromAst(schema.ast as unknown as AstLike))
}

/** How one moved key was found in a raw config: `ignored` when the new path was set too (the new one wins). */
export interface Moved {
  readonly key: MovedKey
  readonly ignored: boolean
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/**
 * A copy of the raw (encoded, as in YAML) config `raw` with each key of `moved` found at its old path taken out and,
 * unless the new path is set too, put at the new one; and what was found. `raw` itself is left as it is.
 */
export const moveKeys = (
  raw: Readonly<Record<string, unknown>>,
  moved: ReadonlyArray<MovedKey>
): { readonly raw: Record<string, unknown>; readonly found: ReadonlyArray<Moved> } => {
  const copy = structuredClone(raw) as Record<string, unknown>
  const found: Array<Moved> = []
  for (const key of moved) {
    const from = key.from.split(".")
    const parent = from.slice(0, -1).reduce<unknown>((node, k) => (isRecord(node) ? node[k] : undefined), copy)
    const last = from[from.length - 1]!
    if (!isRecord(parent) || !(last in parent)) continue
    const value = parent[last]
    delete parent[last]
    const to = key.to.split(".")
    let node = copy
    for (const k of to.slice(0, -1)) {
      if (!isRecord(node[k])) node[k] = {}
      node = node[k] as Record<string, unknown>
    }
    const ignored = to[to.length - 1]! in node
    if (!ignored) node[to[to.length - 1]!] = value
    found.push({ key, ignored })
  }
  return { raw: copy, found }
}

/** Levenshtein distance, for "did you mean". */
const distance = (a: string, b: string): number => {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    let diagonal = row[0]!
    row[0] = i
    for (let j = 1; j <= b.length; j++) {
      const above = row[j]!
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, diagonal + (a[i - 1] === b[j - 1] ? 0 : 1))
      diagonal = above
    }
  }
  return row[b.length]!
}

/** All dotted leaf-or-section paths of a tree (arrays contribute `[]`). */
export const paths = (tree: KeyTree, prefix = ""): Array<string> => {
  if (tree._tag === "Struct") {
    return [...tree.keys].flatMap(([key, sub]) => {
      if (tree.moved?.has(key) === true) return []
      const path = prefix === "" ? key : `${prefix}.${key}`
      return [path, ...paths(sub, path)]
    })
  }
  if (tree._tag === "Array") return paths(tree.item, `${prefix}[]`)
  return []
}

/** The closest valid key: first among siblings, then among every path (a key put in the wrong section). */
export const suggest = (tree: KeyTree, parent: ReadonlyArray<string>, key: string): string | undefined => {
  const siblings = tree._tag === "Struct" ? [...tree.keys.keys()].filter((k) => tree.moved?.has(k) !== true) : []
  const near = (candidates: ReadonlyArray<string>, target: string, limit: number) =>
    candidates
      .map((c) => ({ c, d: distance(c, target) }))
      .filter(({ d }) => d <= limit)
      .sort((x, y) => x.d - y.d)[0]?.c
  const sibling = near(siblings, key, Math.max(2, Math.floor(key.length / 3)))
  if (sibling !== undefined) return [...parent, sibling].join(".")
  return undefined
}

export interface UnknownKey {
  readonly path: ReadonlyArray<string>
  readonly suggestion: string | undefined
}

/** Keys present in `value` that the tree does not know. */
export const unknownKeys = (
  tree: KeyTree,
  value: unknown,
  root: KeyTree = tree,
  at: Array<string> = []
): Array<UnknownKey> => {
  if (tree._tag === "Struct" && typeof value === "object" && value !== null && !Array.isArray(value)) {
    return Object.entries(value).flatMap(([key, sub]) => {
      const child = tree.keys.get(key)
      if (child === undefined) {
        const sibling = suggest(tree, at, key)
        const elsewhere = sibling ?? paths(root).find((p) => p.endsWith(`.${key}`) || p === key)
        return [{ path: [...at, key], suggestion: elsewhere }]
      }
      return unknownKeys(child, sub, root, [...at, key])
    })
  }
  if (tree._tag === "Array" && Array.isArray(value)) {
    return value.flatMap((item, i) => unknownKeys(tree.item, item, root, [...at, String(i)]))
  }
  return []
}

/** The subtree at a dotted path, or the first segment that does not exist. */
export const lookup = (
  tree: KeyTree,
  path: ReadonlyArray<string>
): { readonly _tag: "Found"; readonly tree: KeyTree } | { readonly _tag: "Missing"; readonly index: number } => {
  let node = tree
  for (let i = 0; i < path.length; i++) {
    const segment = path[i]!
    if (node._tag === "Open") return { _tag: "Found", tree: open }
    if (node._tag === "Array") {
      if (!/^\d+$/.test(segment)) return { _tag: "Missing", index: i }
      node = node.item
      continue
    }
    const next = node.keys.get(segment)
    if (next === undefined) return { _tag: "Missing", index: i }
    node = next
  }
  return { _tag: "Found", tree: node }
}
