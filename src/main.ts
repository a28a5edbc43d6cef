/** Entry point: `node dist/main.js <command> ...`. */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect, Logger } from "effect"
import * as Cli from "./cli/Cli.ts"

// Logs and progress go to stderr: stdout carries results (the last line of a command is its JSON result).
Cli.run.pipe(Effect.provide(NodeServices.layer), Effect.provideService(Logger.LogToStderr, true), NodeRuntime.runMain)
