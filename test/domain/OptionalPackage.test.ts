/**
 * An optional package (node-llama-cpp, Dawn's webgpu) is found where its setup command installs it, and every failure
 * to find or load it says that command.
 */
import { mkdirSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, assert, describe, it } from "@effect/vitest"
import * as OptionalPackage from "../../src/domain/OptionalPackage.ts"

const root = join(import.meta.dirname, "..", "..")
const folder = join("test", ".tmp", `optional-package-${process.pid}`)

/** A package `name` installed into `<root>/<folder>/node_modules`, its entry file `index.mjs` holding `source`. */
const install = (name: string, source: string) => {
  const dir = join(root, folder, "node_modules", name)
  mkdirSync(dir, { recursive: true })
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name, version: "1.0.0", main: "index.mjs" }))
  writeFileSync(join(dir, "index.mjs"), source)
}

afterAll(() => rmSync(join(root, folder), { recursive: true, force: true }))

describe("OptionalPackage", () => {
  it("is absent until installed into its folder, and load says the setup command and where it looked", async () => {
    const pkg = OptionalPackage.make<unknown>({
      name: "effect-rl-absent-package",
      folder,
      setupCommand: "npm run setup:absent"
    })
    assert.isFalse(pkg.available())
    assert.strictEqual(pkg.resolve(), undefined)
    const error = await pkg.load().then(
      () => assert.fail("loaded a package that is not installed"),
      (e: Error) => e
    )
    assert.include(error.message, "effect-rl-absent-package is not installed")
    assert.include(error.message, join(root, folder))
    assert.include(error.message, "run `npm run setup:absent`")
  })

  it("loads the copy in its folder", async () => {
    install("effect-rl-present-package", "export const answer = 42\n")
    const pkg = OptionalPackage.make<{ answer: number }>({
      name: "effect-rl-present-package",
      folder,
      setupCommand: "npm run setup:present"
    })
    assert.isTrue(pkg.available())
    assert.strictEqual(pkg.resolve(), join(root, folder, "node_modules", "effect-rl-present-package", "index.mjs"))
    assert.strictEqual((await pkg.load()).answer, 42)
  })

  it("says the setup command installs it again when the installed copy does not load", async () => {
    install("effect-rl-broken-package", "export const = \n")
    const pkg = OptionalPackage.make<unknown>({
      name: "effect-rl-broken-package",
      folder,
      setupCommand: "npm run setup:broken"
    })
    const error = await pkg.load().then(
      () => assert.fail("loaded a package that does not parse"),
      (e: Error) => e
    )
    assert.match(error.message, /^effect-rl-broken-package \(.*index\.mjs\) does not load: /)
    assert.include(error.message, "`npm run setup:broken` installs it again")
  })
})
