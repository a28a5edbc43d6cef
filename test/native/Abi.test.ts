/**
 * The ABI table (src/native/Abi.ts) is the one statement of every native function's arguments: these tests fail when
 * the C++ side disagrees with it (a stale native/abi.generated.h, a kernel defined without its generated argument
 * struct, a kernel reading arguments by position) and pin how `bind` lays named fields out.
 */
import { readdirSync, readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as Abi from "../../src/native/Abi.ts"
import * as AbiHeader from "../../src/native/AbiHeader.ts"
import * as Addon from "../../src/native/Addon.ts"

const root = join(import.meta.dirname, "..", "..")
const nativeDir = join(root, "native")
const sources = readdirSync(nativeDir)
  .filter((f) => f.endsWith(".cc"))
  .map((f) => ({ file: f, text: readFileSync(join(nativeDir, f), "utf8") }))

describe("AbiHeader.render", () => {
  it("is what native/abi.generated.h holds (else: run `node native/generate-abi.mjs` and rebuild)", () => {
    const committed = readFileSync(join(root, AbiHeader.path), "utf8")
    const rendered = AbiHeader.render()
    if (committed !== rendered) {
      const file = committed.split("\n")
      const table = rendered.split("\n")
      const differing = table.flatMap((line, i) => (line === file[i] ? [] : [i])).slice(0, 3)
      const shown = differing.map((i) => `line ${i + 1}:\n  file:  ${file[i]}\n  table: ${table[i]}`).join("\n")
      assert.fail(
        `${AbiHeader.path} is stale.\n${shown}\nrun \`node native/generate-abi.mjs\`, then \`node native/install.mjs\``
      )
    }
  })

  it("reads each argument at its position in the table: matmul's m is argument 7, n is 8", () => {
    const header = AbiHeader.render()
    assert.include(header, "  in->m = (int)args.i64(7);\n  in->n = (int)args.i64(8);")
    assert.include(header, 'if (!args.expectCount(17, "matmul")) return false;')
    // binary's three i64x4 groups take four positions each: dims 6–9, aStrides 10–13, bStrides 14–17
    assert.include(header, "  in->bStrides[0] = args.i64(14);")
    assert.include(header, 'if (!args.expectCount(18, "binary")) return false;')
  })

  it("changes, and so does the hash, when two arguments of a kernel swap places", () => {
    const args = [...Abi.functions.matmul.args]
    const m = args.findIndex(([name]) => name === "m")
    ;[args[m], args[m + 1]] = [args[m + 1]!, args[m]!]
    const swapped = { ...Abi.functions, matmul: { ...Abi.functions.matmul, args } }
    const header = AbiHeader.render(swapped)
    assert.notStrictEqual(header, AbiHeader.render())
    assert.include(header, "  in->n = (int)args.i64(7);\n  in->m = (int)args.i64(8);")
  })
})

describe("native/*.cc", () => {
  const definitions = sources.flatMap(({ file, text }) =>
    [...text.matchAll(/^napi_value (\w+)\(Args& args, const (\w+)Args&/gm)].map((m) => ({
      file,
      kernel: m[1]!,
      struct: m[2]!
    }))
  )

  it("define every function of the table exactly once, each taking its own generated argument struct", () => {
    const expected = Object.keys(Abi.functions).map(AbiHeader.kernelName).sort()
    assert.deepStrictEqual(definitions.map((d) => d.kernel).sort(), expected)
    for (const d of definitions) assert.strictEqual(d.struct, d.kernel, `${d.file}: ${d.kernel} takes ${d.struct}Args`)
  })

  it("never read an argument by position: only abi.generated.h's unpack() does", () => {
    for (const { file, text } of sources) {
      const positional = text.match(/args\.(i64|num|flag|heap|int32s|isNullish)\(/g)
      assert.isNull(positional, `${file} reads arguments by position: ${positional?.join(", ")}`)
    }
  })

  it("register exactly the table's functions (module.cc walks the generated kExports)", () => {
    const module = sources.find((s) => s.file === "module.cc")!.text
    assert.include(module, "for (const effect_rl::Export& fn : effect_rl::kExports)")
    assert.notInclude(module, 'napi_create_function(env, "')
  })
})

describe("Abi.bind", () => {
  it("passes named fields in the table's order, spreading i64x4 groups into four arguments", () => {
    const calls: Array<Array<unknown>> = []
    const record = (...argv: Array<unknown>) => {
      calls.push(argv)
    }
    const addon = Object.fromEntries(Object.keys(Abi.functions).map((name) => [name, record]))
    const heap = new Uint8Array(64)
    Abi.bind(addon).binary({
      bStrides: [0, 0, 1, 0],
      heap,
      op: 2,
      compare: false,
      a: 0,
      b: 16,
      out: 32,
      dims: [1, 1, 2, 3],
      aStrides: [0, 0, 3, 1]
    })
    assert.deepStrictEqual(calls, [[heap, 2, false, 0, 16, 32, 1, 1, 2, 3, 0, 0, 3, 1, 0, 0, 1, 0]])
  })

  it("reports the table's functions an addon does not export", () => {
    const addon = Object.fromEntries(Object.keys(Abi.functions).map((name) => [name, () => undefined]))
    delete addon["linear"]
    assert.deepStrictEqual(Abi.missing(addon), ["linear"])
  })
})

describe("Addon.fromExports", () => {
  const exportsWith = (info: Partial<Abi.Info>) =>
    Object.fromEntries(
      Object.keys(Abi.functions).map((name) => [
        name,
        name === "info" ? () => ({ blas: "builtin", ...info }) : () => {}
      ])
    )

  it("binds an addon built from this table", () => {
    const loaded = Addon.fromExports(exportsWith({ abi: Abi.hash, simd: "avx2" }), "test.node")
    assert.deepStrictEqual(loaded.status, { available: true, blas: "builtin", simd: "avx2", path: "test.node" })
  })

  it("refuses an addon built from another table, or from sources without the hash, asking for a rebuild", () => {
    for (const info of [{ abi: "0123456789abcdef" }, {}]) {
      const loaded = Addon.fromExports(exportsWith(info), "old.node")
      assert.isUndefined(loaded.kernels)
      assert.isTrue(!loaded.status.available && loaded.status.reason.includes("node native/install.mjs"))
    }
  })
})

const native = Addon.status()

describe.skipIf(!native.available)("the built addon", () => {
  it("was built from this table and exports exactly its functions", () => {
    const raw = createRequire(import.meta.url)(native.available ? native.path : "") as Abi.RawAddon
    assert.deepStrictEqual(Object.keys(raw).sort(), Object.keys(Abi.functions).sort())
    assert.strictEqual(Addon.load().kernels!.info({}).abi, Abi.hash)
  })

  it("throws, running nothing, when called with another argument count than the table's", () => {
    const raw = createRequire(import.meta.url)(native.available ? native.path : "") as Record<
      string,
      (...argv: Array<unknown>) => unknown
    >
    assert.throws(() => raw["matmul"]!(new Uint8Array(64), 0, 0), /matmul: expected 17 arguments, got 3/)
    assert.throws(() => raw["softmax"]!(new Float32Array(4), 0, 0, 1, 1, false), /expected a Uint8Array argument/)
  })
})
