/** Every command a user can run has an example in its --help (Command.withExamples). */
import { assert, describe, it } from "@effect/vitest"
import type { Command } from "effect/cli"
import * as Cli from "../../src/cli/Cli.ts"

/** [path, command] of every command that runs (the leaves of the command tree), and of the root. */
const commands = (
  command: Command.Command.Any,
  path: ReadonlyArray<string> = []
): Array<[string, Command.Command.Any]> => {
  const here: Array<[string, Command.Command.Any]> = [[[...path, command.name].join(" "), command]]
  const children = command.subcommands.flatMap((group) => group.commands)
  return children.length === 0
    ? here
    : [...(path.length === 0 ? here : []), ...children.flatMap((c) => commands(c, [...path, command.name]))]
}

describe("--help", () => {
  it("shows at least one example for the root and every command", () => {
    const all = commands(Cli.root)
    assert.isAbove(all.length, 12)
    const missing = all.filter(([, c]) => c.examples.length === 0).map(([p]) => p)
    assert.deepStrictEqual(missing, [], `commands without an example: ${missing.join(", ")}`)
  })
})
