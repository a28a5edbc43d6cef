/**
 * The tree of valid config keys, read off a Schema's AST: used to reject unknown keys (a YAML typo would otherwise be
 * silently ignored) and to suggest the closest valid key.
 */
import type { Schema } from "effect"

export type KeyTree =
  | { readonly _tag: "Struct"; readonly keys: ReadonlyMap<string, KeyTree> }
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

export const of = (schema: Schema.Top): KeyTree => fromAst(schema.ast as unknown as AstLike)

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
      const path = prefix === "" ? key : `${prefix}.${key}`
      return [path, ...paths(sub, path)]
    })
  }
  if (tree._tag === "Array") return paths(tree.item, `${prefix}[]`)
  return []
}

/** The closest valid key: first among siblings, then among every path (a key put in the wrong section). */
export const suggest = (tree: KeyTree, parent: ReadonlyArray<string>, key: string): string | undefined => {
  const siblings = tree._tag === "Struct" ? [...tree.keys.keys()] : []
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
