/**
 * `report RUN_DIR [--out FILE]`: build the run's self-contained HTML report (charts of every training metric, the
 * held-out eval before → after, a trajectory viewer) from its run directory. Prints the file, and as the last stdout
 * line `{"event":"report","file":…,"bytes":…,"steps":…,"episodeSteps":…}`.
 */
import { Console, Effect, Option } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as Report from "../metrics/Report.ts"

export const command = Command.make(
  "report",
  {
    runDir: Argument.Directory("run-dir", { mustExist: true }).pipe(
      Argument.withDescription("A run directory written by train (metrics.jsonl, episodes.jsonl, ...)")
    ),
    out: Flag.String("out").pipe(Flag.withDescription("Output HTML file (default RUN_DIR/report.html)"), Flag.optional),
    maxSteps: Flag.Int("max-steps").pipe(
      Flag.withDescription("Steps whose episodes are embedded, sampled evenly (default 50)"),
      Flag.optional
    )
  },
  Effect.fn("cli.report")(function* ({ runDir, out, maxSteps }) {
    const written = yield* Report.write(runDir, {
      ...Option.match(out, { onNone: () => ({}), onSome: (file) => ({ out: file }) }),
      ...Option.match(maxSteps, { onNone: () => ({}), onSome: (n) => ({ maxSteps: n }) })
    })
    yield* Console.log(`report: ${written.file} (${(written.bytes / 1024).toFixed(0)} KiB)`)
    yield* Console.log(JSON.stringify({ event: "report", ...written }))
  })
).pipe(Command.withDescription("Write a run's HTML report: training curves, eval before/after, trajectory viewer"))
