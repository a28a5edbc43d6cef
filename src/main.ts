/** Entry point: `node dist/main.js <command> ...`. */
import { NodeServices } from "@effect/platform-node"
import { Cause, Effect, Logger, Runtime } from "effect"
import { CliError } from "effect/cli"
import * as Cli from "./cli/Cli.ts"
import * as DiskFull from "./domain/DiskFull.ts"
import * as StopSignal from "./pipeline/StopSignal.ts"

/** `EpisodeLogError: line 2 is not a valid group (file: runs/x/episodes.jsonl, line: 2)`: the tag, the message, and
 * every other scalar field (the file, path, row or key the error names). */
const describeFailure = (error: unknown): string => {
  if (typeof error !== "object" || error === null) return String(error)
  const record = error as Record<string, unknown>
  const fields = Object.entries(record)
    .filter(([k, v]) => k !== "_tag" && k !== "message" && (typeof v === "string" || typeof v === "number"))
    .map(([k, v]) => `${k}: ${String(v)}`)
  const tag = typeof record["_tag"] === "string" ? `${record["_tag"]}: ` : ""
  const message = typeof record["message"] === "string" ? record["message"] : String(error)
  return `${tag}${message}${fields.length > 0 ? ` (${fields.join(", ")})` : ""}`
}

/**
 * Fatal errors go to stderr, stdout keeps only results (its last line is a command's JSON result). A typed failure is
 * one line naming what it concerns, with no stack: it is an answer, not a bug (errors with a CLI user message were
 * printed by the CLI already). A defect (a bug) prints its stack, unless it is a full disk somewhere in a run, which
 * is one line naming the file (DiskFull).
 */
const reportFatal = (cause: Cause.Cause<unknown>) =>
  Effect.sync(() => {
    if (Cause.hasInterruptsOnly(cause)) return
    for (const reason of cause.reasons) {
      if (Cause.isFailReason(reason)) {
        const error = reason.error as Record<PropertyKey, unknown> | undefined
        if (typeof error === "object" && error !== null && typeof error[CliError.userMessage] === "string") continue
        if (CliError.isCliError(reason.error) && reason.error._tag === "ShowHelp") continue // the CLI printed the help
        process.stderr.write(`\nERROR\n  ${describeFailure(reason.error)}\n`)
      } else if (Cause.isDieReason(reason)) {
        const defect = reason.defect
        const diskFull = DiskFull.find(defect)
        if (diskFull !== undefined) {
          process.stderr.write(`\nERROR\n  ${diskFull.message}\n`) // not a bug: one line, no stack
          continue
        }
        process.stderr.write(
          `\nERROR (a bug: please report it)\n${defect instanceof Error ? defect.stack : String(defect)}\n`
        )
      }
    }
  })

/**
 * Signals, as process managers expect them: SIGINT (Ctrl-C) exits 130, SIGTERM 143. While a training loop runs, the
 * first of either asks the loop to stop after its current step and checkpoint it (the command then prints how to
 * resume); a second one interrupts at once. Any other command is interrupted at once. Interrupting releases every
 * resource (tool servers are killed, files closed); what was fsync'd (episodes, consumed prompts, checkpoints) stays.
 */
const runMain = Runtime.makeRunMain(({ fiber, teardown }) => {
  let signal: "SIGINT" | "SIGTERM" | undefined
  const interrupt = () => fiber.interruptUnsafe(fiber.id)
  const onSignal = (which: "SIGINT" | "SIGTERM") => () => {
    const first = signal === undefined
    signal ??= which
    if (first && StopSignal.graceful()) {
      StopSignal.request()
      process.stderr.write(
        which === "SIGINT"
          ? "\nCtrl-C: stopping after the current step, with a checkpoint (press Ctrl-C again to stop now)\n"
          : "\nSIGTERM: stopping after the current step, with a checkpoint (send it again to stop now)\n"
      )
    } else interrupt()
  }
  const onSigint = onSignal("SIGINT")
  const onSigterm = onSignal("SIGTERM")
  fiber.addObserver((exit) => {
    process.removeListener("SIGINT", onSigint)
    process.removeListener("SIGTERM", onSigterm)
    teardown(exit, (code) => {
      if (signal !== undefined) process.exit(signal === "SIGTERM" ? 143 : 130)
      if (code !== 0) process.exit(code)
    })
  })
  process.on("SIGINT", onSigint)
  process.on("SIGTERM", onSigterm)
})

// Logs and progress go to stderr: stdout carries results (the last line of a command is its JSON result).
Cli.run.pipe(
  Effect.tapCause(reportFatal),
  Effect.provide(NodeServices.layer),
  Effect.provideService(Logger.LogToStderr, true),
  runMain({ disableErrorReporting: true })
)
