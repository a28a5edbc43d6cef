// effect-rl as another package uses it: test/fixtures/consumer/consumer.ts imports from "effect-rl" exactly as
// docs/library.md shows, and is typechecked with the repository's tsc and run with node in a child process. "effect-rl"
// resolves to src/index.ts (tsconfig `paths`; a resolve hook for node), what the package's exports are compiled from,
// so no build is needed. Both processes start at once: about 10 s together on 2 cores.
import { execFile } from "node:child_process"
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { assert, describe, it } from "@effect/vitest"

const fixture = "test/fixtures/consumer"

interface Exit {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

const node = (args: ReadonlyArray<string>, cwd: string): Promise<Exit> => {
  // the example chooses its kernels itself: the suite-wide override would change its numbers
  const { EFFECT_RL_KERNELS: _, ...env } = process.env
  return new Promise((resolve) =>
    execFile(process.execPath, args, { cwd, encoding: "utf8", env }, (error, stdout, stderr) =>
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : -1, stdout, stderr })
    )
  )
}

const tsc = join(dirname(createRequire(import.meta.url).resolve("typescript/package.json")), "bin", "tsc")
const typecheck = node([tsc, "-p", join(fixture, "tsconfig.json")], ".")
const consumer = node(["--import", "./resolve.ts", "consumer.ts"], fixture)

/** The body of each fenced block of `markdown` written in `lang`, in order. */
const fenced = (markdown: string, lang: string): Array<string> =>
  [...markdown.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].filter((m) => m[1] === lang).map((m) => m[2]!)

const docs = readFileSync("docs/library.md", "utf8")

describe("effect-rl from a consumer package", () => {
  it("typechecks the consumer's imports and calls against the library's types", async () => {
    const { code, stdout } = await typecheck
    assert.strictEqual(code, 0, stdout)
  })

  it("runs it, printing the numbers docs/library.md shows and nothing else on stdout", async () => {
    const { code, stdout, stderr } = await consumer
    assert.strictEqual(code, 0, stderr)
    assert.strictEqual(stdout, fenced(docs, "text")[0])
    // stderr: the consumer's own logger and that line alone (no tfjs banner)
    assert.match(stderr, /^\[[\d:.]+\] INFO \(#\d+\): tensor backend: cpu, stock kernels, 1 thread\(s\)\n$/)
  })

  it("is the example docs/library.md shows, verbatim", () => {
    const source = readFileSync(join(fixture, "consumer.ts"), "utf8").replace(/^(\/\/.*\n)+/, "")
    assert.strictEqual(fenced(docs, "ts")[0], source)
  })

  it("stands in for the package's exports, which npm run build compiles from src/index.ts", () => {
    const pkg = JSON.parse(readFileSync("package.json", "utf8")) as { readonly exports: Record<string, unknown> }
    const build = JSON.parse(readFileSync("tsconfig.build.json", "utf8")) as {
      readonly compilerOptions: { readonly rootDir: string; readonly outDir: string }
      readonly include: ReadonlyArray<string>
    }
    assert.deepStrictEqual(pkg.exports["."], { types: "./dist/src/index.d.ts", default: "./dist/src/index.js" })
    assert.deepStrictEqual([build.compilerOptions.rootDir, build.compilerOptions.outDir], [".", "dist"])
    assert.include(build.include, "src/**/*.ts")
  })
})
