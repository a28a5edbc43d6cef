/**
 * Every arrow points down (docs/architecture.md): a file under src/ imports only files of its own room or of rooms
 * below it in `order`, so the rooms form no cycle; and no two files import each other in a cycle.
 */
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join, normalize, relative, sep } from "node:path"
import { assert, describe, it } from "@effect/vitest"

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
  "inference",
  "data",
  "env",
  "mcp",
  "tokenizer",
  "backend",
  "native",
  "model",
  "algo",
  "toolbox",
  "config",
  "domain"
]

const files = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? files(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : []
  )

const imports = (file: string): Array<string> =>
  [...readFileSync(file, "utf8").matchAll(/^(?:import|export)\s[^'"]*?from\s+["'](\.[^"']+)["']/gm)].map((m) =>
    normalize(join(dirname(file), m[1]!))
  )

const room = (file: string) => relative("src", file).split(sep)[0]!

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

  it("no two files import each other in a cycle (type-only imports aside)", () => {
    const graph = new Map(
      all.map((file) => [
        file,
        [...readFileSync(file, "utf8").matchAll(/^(?:import|export)\s+(?!type\s)[^'"]*?from\s+["'](\.[^"']+)["']/gm)]
          .map((m) => normalize(join(dirname(file), m[1]!)))
          .filter((t) => t.startsWith(`src${sep}`))
      ])
    )
    const state = new Map<string, "open" | "done">()
    const cycles: Array<string> = []
    const visit = (file: string, path: Array<string>) => {
      if (state.get(file) === "done") return
      if (state.get(file) === "open") {
        cycles.push([...path.slice(path.indexOf(file)), file].join(" → "))
        return
      }
      state.set(file, "open")
      for (const next of graph.get(file) ?? []) visit(next, [...path, file])
      state.set(file, "done")
    }
    for (const file of all) visit(file, [])
    assert.deepStrictEqual(cycles, [])
  })
})
