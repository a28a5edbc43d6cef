import { Console } from "effect"
import { Command } from "effect/cli"

const inspect = Command.make("inspect", {}, () => Console.log("todo")).pipe(
  Command.withDescription("Validate a dataset and print its statistics")
)

export const command = Command.make("data").pipe(
  Command.withDescription("Inspect, convert and generate datasets"),
  Command.withSubcommands([inspect])
)
