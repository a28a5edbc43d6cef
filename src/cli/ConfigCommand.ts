import { Console, Effect } from "effect"
import { Command } from "effect/cli"

const check = Command.make("check", {}, () => Console.log("todo")).pipe(
  Command.withDescription("Decode and cross-check a run config, print it resolved (secrets redacted)")
)

export const command = Command.make("config").pipe(
  Command.withDescription("Work with run configs"),
  Command.withSubcommands([check])
)
