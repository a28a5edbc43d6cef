/**
 * `report RUN_DIR [--out FILE]`: build the run's self-contained HTML report (charts of every training metric, the
 * held-out eval before → after, a trajectory viewer) from its run directory. Prints the file, and as the last stdout
 * line `{"event":"report","file":…,"bytes":…,"steps":…,"episodeSteps":…}`.
 *
 * `report RUN_A RUN_B ... [--out FILE]`: one page overlaying the runs on the same charts (one colour per run, a
 * smoothing slider), written to `compare.html` unless `--out`; the last stdout line is
 * `{"event":"report","file":…,"bytes":…,"runs":…}`.
 *
 * A directory without `metrics.jsonl` is not a run: a one-line error naming it, exit code 1.
 */
import { Console, Effect, Option } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as Report from "../metrics/Report.ts"

export const command = Command.make(
  "report",
  {
    runDirs: Argument.Directory("run-dir", { mustExist: true }).pipe(
      Argument.withDescription(
        "A run directory written by train (metrics.jsonl, episodes.jsonl, ...); several: overlaid on the same charts"
      ),
      Argument.atLeast(1)
    ),
    out: Flag.String("out").pipe(
      Flag.withDescription("Output HTML file (default RUN_DIR/report.html; compare.html for several runs)"),
      Flag.optional
    ),
    maxSteps: Flag.Int("max-steps").pipe(
      Flag.withDescription("Steps whose episodes are embedded, sampled evenly (default 50)"),
      Flag.optional
    )
  },
  Effect.fn("cli.report")(function* ({ runDirs, out, maxSteps }) {
    const outOption = Option.match(out, { onNone: () => ({}), onSome: (file) => ({ out: file }) })
    const written =
      runDirs.length === 1
        ? yield* Report.write(runDirs[0]!, {
            ...outOption,
            ...Option.match(maxSteps, { onNone: () => ({}), onSome: (n) => ({ maxSteps: n }) })
          })
        : yield* Report.writeMany(runDirs, outOption)
    yield* Console.log(`report: ${written.file} (${(written.bytes / 1024).toFixed(0)} KiB)`)
    yield* Console.log(JSON.stringify({ event: "report", ...written }))
  })
).pipe(
  Command.withDescription(
    "Write a run's HTML report (training curves, eval before/after, trajectory viewer), or overlay several runs' curves"
  ),
  Command.withExamples(({ commandPath }) => [
    { command: `${commandPath.join(" ")} runs/quickstart`, description: "runs/quickstart/report.html" },
    {
      command: `${commandPath.join(" ")} runs/quickstart runs/quickstart-lora --out compare.html`,
      description: "full-parameter and LoRA runs on the same charts"
    }
  ])
)
