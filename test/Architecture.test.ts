/**
 * The house rules of docs/architecture.md, checked on every run:
 * - every arrow points down: a file under src/ imports only files of its own room or of rooms below it in `order`;
 * - no file cycle, type-only imports included (a cycle of types alone still ties two modules into one);
 * - no file over `maxFileLines` and no function over `maxFunctionLines` (a service's `make` closure, its class, up to
 *   `maxMakeLines`), unless `allowed` names it with the reason it reads better whole.
 * Functions are measured on the parsed source (oxc, through rolldown's `parseAst`), first line to last, nested
 * functions included; Biome's noExcessiveLinesPerFunction (biome.json) checks the same bound independently.
 */
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join, normalize, relative, sep } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { parseAst } from "rolldown/parseAst"

/** Top to bottom; `main.ts` and `index.ts` are the entry and the library API. */
const order = [
  "main.ts",
  "index.ts",
  "cli",
  "layers",
  "pipeline",
  "cluster",
  "metrics",
  "store",
  "trainer",
  "generator",
  "sync",
  "serve",
  "inference",
  "weights",
  "data",
  "env",
  "mcp",
  "tokenizer",
  "backend",
  "native",
  "model",
  "algo",
  "tensor",
  "toolbox",
  "config",
  "domain"
]

const maxFileLines = 700
const maxFunctionLines = 150
const maxMakeLines = 400

/** `path` (a file) or `path:name` (a function) → why it may be longer. Empty: every file and function fits. */
const allowed: Record<string, string> = {}

const files = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? files(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : []
  )

/** Every relative module a file names: static imports and re-exports (`import type` too) and `import("…")`. */
const imports = (file: string): Array<string> => {
  const source = readFileSync(file, "utf8")
  const specifiers = [
    ...source.matchAll(/^(?:import|export)\s[^'"]*?from\s+["'](\.[^"']+)["']/gm),
    ...source.matchAll(/\bimport\(\s*["'](\.[^"']+)["']\s*\)/g)
  ].map((m) => m[1]!)
  return specifiers.map((s) => normalize(join(dirname(file), s)))
}

const room = (file: string) => relative("src", file).split(sep)[0]!

/** The strongly connected components of more than one file (or a file importing itself): Tarjan's algorithm. */
export const cycles = (graph: ReadonlyMap<string, ReadonlyArray<string>>): Array<Array<string>> => {
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const stack: Array<string> = []
  const onStack = new Set<string>()
  const found: Array<Array<string>> = []
  const connect = (v: string) => {
    index.set(v, index.size)
    low.set(v, index.get(v)!)
    stack.push(v)
    onStack.add(v)
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue
      if (!index.has(w)) {
        connect(w)
        low.set(v, Math.min(low.get(v)!, low.get(w)!))
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!))
    }
    if (low.get(v) !== index.get(v)) return
    const component: Array<string> = []
    let w: string
    do {
      w = stack.pop()!
      onStack.delete(w)
      component.push(w)
    } while (w !== v)
    if (component.length > 1 || (graph.get(v) ?? []).includes(v)) found.push(component.sort())
  }
  for (const v of graph.keys()) if (!index.has(v)) connect(v)
  return found
}

interface Measured {
  readonly name: string
  readonly line: number
  readonly lines: number
}

interface Node {
  readonly type: string
  readonly start: number
  readonly end: number
  readonly [key: string]: unknown
}

const isNode = (value: unknown): value is Node =>
  typeof value === "object" && value !== null && typeof (value as Node).type === "string"

const functionTypes = new Set(["FunctionDeclaration", "FunctionExpression", "ArrowFunctionExpression"])
/** Nodes whose name their value takes, and nodes a name passes through to a function inside them. */
const namesValue = new Set(["VariableDeclarator", "Property", "MethodDefinition", "PropertyDefinition"])
const carriesName = new Set(["CallExpression", "TSAsExpression", "TSSatisfiesExpression", "ParenthesizedExpression"])

/** The name a function goes by: its own, or the variable, property or method it is the value of. */
const nameOf = (node: Node): string | undefined => {
  const id = node["id"] ?? node["key"]
  return isNode(id) && typeof id["name"] === "string" ? id["name"] : undefined
}

/**
 * Every function of a source file with its length in lines. A function passed to a call (`Effect.fn("X")(function*
 * …)`, `Effect.gen(function* …)`) takes the name of the variable the call is assigned to, so `const make =
 * Effect.fnUntraced(function*() {…})` is `make`.
 */
export const functions = (file: string, source: string): Array<Measured> => {
  const lineStarts = [0]
  for (let i = 0; i < source.length; i++) if (source.charCodeAt(i) === 10) lineStarts.push(i + 1)
  const lineOf = (offset: number) => {
    let lo = 0
    let hi = lineStarts.length - 1
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1
      if (lineStarts[mid]! <= offset) lo = mid
      else hi = mid - 1
    }
    return lo + 1
  }
  const found: Array<Measured> = []
  const walk = (value: unknown, name: string | undefined): void => {
    if (Array.isArray(value)) {
      for (const v of value) walk(v, name)
      return
    }
    if (!isNode(value)) return
    let inherited = carriesName.has(value.type) ? name : undefined
    if (namesValue.has(value.type)) inherited = nameOf(value) ?? name
    if (functionTypes.has(value.type)) {
      const line = lineOf(value.start)
      found.push({ name: nameOf(value) ?? name ?? "(anonymous)", line, lines: lineOf(value.end) - line + 1 })
    }
    for (const key of Object.keys(value))
      if (key !== "type" && key !== "start" && key !== "end") walk(value[key], inherited)
  }
  walk(parseAst(source, { lang: "ts" }, file), undefined)
  return found
}

describe("architecture", () => {
  const all = files("src")

  it("every import points to the file's own room or one below it", () => {
    const up: Array<string> = []
    for (const file of all) {
      for (const target of imports(file)) {
        if (!target.startsWith(`src${sep}`)) {
          up.push(`${file} imports ${target}, outside src/`)
          continue
        }
        const [from, to] = [room(file), room(target)]
        if (from === to) continue
        assert.include(order, from, `${file}: room ${from} is not in the order`)
        assert.include(order, to, `${target}: room ${to} is not in the order`)
        if (order.indexOf(to) < order.indexOf(from)) up.push(`${file} (${from}) imports ${target} (${to})`)
      }
    }
    assert.deepStrictEqual(up, [])
  })

  it("no files import each other in a cycle, type-only imports included", () => {
    const graph = new Map(all.map((file) => [file, imports(file).filter((t) => t.startsWith(`src${sep}`))]))
    assert.deepStrictEqual(
      cycles(graph).map((c) => c.join(" ↔ ")),
      []
    )
  })

  it(`no file is over ${maxFileLines} lines without a stated reason`, () => {
    const long = all
      .map((file) => ({ file, lines: readFileSync(file, "utf8").trimEnd().split("\n").length }))
      .filter(({ file, lines }) => lines > maxFileLines && allowed[file] === undefined)
      .map(({ file, lines }) => `${file}: ${lines} lines`)
    assert.deepStrictEqual(long, [])
  })

  it(`no function is over ${maxFunctionLines} lines (a make closure ${maxMakeLines}) without a stated reason`, () => {
    const long = all.flatMap((file) =>
      functions(file, readFileSync(file, "utf8"))
        .filter((f) => f.lines > (f.name === "make" ? maxMakeLines : maxFunctionLines))
        .filter((f) => allowed[`${file}:${f.name}`] === undefined)
        .map((f) => `${file}:${f.line} ${f.name}: ${f.lines} lines`)
    )
    assert.deepStrictEqual(long, [])
  })

  it("every allow-list entry names a file or function that is still over its limit", () => {
    const stale = Object.keys(allowed).filter((entry) => {
      const [file, name] = entry.split(":") as [string, string | undefined]
      const source = readFileSync(file, "utf8")
      if (name === undefined) return source.trimEnd().split("\n").length <= maxFileLines
      return !functions(file, source).some(
        (f) => f.name === name && f.lines > (name === "make" ? maxMakeLines : maxFunctionLines)
      )
    })
    assert.deepStrictEqual(stale, [])
  })
})

describe("architecture's measures", () => {
  it("finds a cycle of three files and none in a chain", () => {
    const ring = new Map([
      ["a", ["b"]],
      ["b", ["c"]],
      ["c", ["a"]],
      ["d", ["a"]]
    ])
    assert.deepStrictEqual(cycles(ring), [["a", "b", "c"]])
    assert.deepStrictEqual(
      cycles(
        new Map([
          ["a", ["b"]],
          ["b", ["c"]],
          ["c", []]
        ])
      ),
      []
    )
  })

  it("measures a make closure by its variable's name and an inner arrow by its own", () => {
    const source = [
      "export const make = Effect.fnUntraced(function*(n: number) {", // 1
      "  const inner = (x: number) => {", // 2
      "    return x + n", // 3
      "  }", // 4
      "  return inner", // 5
      "})" // 6
    ].join("\n")
    const found = functions("x.ts", source).map((f) => [f.name, f.line, f.lines])
    assert.deepStrictEqual(found, [
      ["make", 1, 6],
      ["inner", 2, 3]
    ])
  })
})
