/**
 * The `effect-rl` command line: one file per command under src/cli/, assembled here. Commands receive decoded
 * config; only `src/layers/` turns config into services.
 */
import { Command } from "effect/cli"
import * as ConfigCommand from "./ConfigCommand.ts"
import * as DataCommand from "./DataCommand.ts"
import * as EnvCommand from "./EnvCommand.ts"
import * as EvalCommand from "./EvalCommand.ts"
import * as ModelCommand from "./ModelCommand.ts"
import * as ReplayCommand from "./ReplayCommand.ts"
import * as ReportCommand from "./ReportCommand.ts"
import * as RunnerCommand from "./RunnerCommand.ts"
import * as ServeCommand from "./ServeCommand.ts"
import * as SftCommand from "./SftCommand.ts"
import * as ToolsCommand from "./ToolsCommand.ts"
import * as TrainCommand from "./TrainCommand.ts"

export const root = Command.make("effect-rl").pipe(
  Command.withDescription(
    "Train language-model agents to use tools over many turns with reinforcement learning (Effect 4 + TensorFlow.js)."
  ),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} train --config configs/quickstart.yaml`,
      description: "train the quickstart agent (what npm start runs)"
    }
  ]),
  Command.withSubcommands([
    ConfigCommand.command,
    DataCommand.command,
    EnvCommand.command,
    EvalCommand.command,
    ModelCommand.command,
    ReplayCommand.command,
    ReportCommand.command,
    RunnerCommand.command,
    ServeCommand.command,
    SftCommand.command,
    ToolsCommand.command,
    TrainCommand.command
  ])
)

export const version = "0.1.0"

export const run = Command.run(root, { version })
