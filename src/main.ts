/** Entry point: `node dist/main.js <command> ...`. */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import * as Cli from "./cli/Cli.ts"

Cli.run.pipe(Effect.provide(NodeServices.layer), NodeRuntime.runMain)
