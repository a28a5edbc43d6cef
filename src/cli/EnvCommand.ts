/**
 * `env check --config FILE --tasks TASKS [--data DIR] [--expect GOLDEN.json]`: the env sanity check. Each task's
 * ground truth is replayed through a fresh env, as an agent would make the calls, and one JSON line per task is
 * printed, `{"task", "split", "reward", "hash"}`, then a summary line. A sound env gives every task reward 1.
 *
 * TASKS is a tau-bench `tasks.json` (the domain comes from the config's `environment.tau.domain`) or a dataset of
 * rows (`data convert tau-bench` output, or `mcp_tool` rows whose `reward_spec.ground_truth` has a `tool_sequence`:
 * those calls run on the config's MCP servers, then the `answer` is given; `hash` is then the sha256 of the
 * canonical JSON of the tool results). `--expect` compares tau hashes with a golden file's `canonical_hash` per
 * (split, id). Exits 1 when a task's reward is not 1 or a hash differs from the expected one.
 */
import { Effect } from "effect"
import { Command, Flag } from "effect/cli"
import * as EnvCheck from "../layers/EnvCheck.ts"
import * as RunFlags from "./RunFlags.ts"

const check = Command.make(
  "check",
  {
    config: RunFlags.config,
    tasks: Flag.File("tasks", { mustExist: true }).pipe(
      Flag.withDescription("tau-bench tasks.json, or a dataset (.jsonl/.json/.parquet) of tau_bench or mcp_tool rows")
    ),
    data: Flag.Directory("data", { mustExist: true }).pipe(
      Flag.withDescription("tau-bench data directory (overrides environment.tau.data_dir)"),
      Flag.optional
    ),
    expect: Flag.File("expect", { mustExist: true }).pipe(
      Flag.withDescription("golden.json whose tasks[].canonical_hash each (split, id) must reproduce"),
      Flag.optional
    ),
    overrides: RunFlags.overrides
  },
  Effect.fn("cli.env.check")(function* (flags) {
    const c = yield* RunFlags.load(flags.config, flags.overrides)
    yield* EnvCheck.check(c, flags)
  })
).pipe(
  Command.withDescription("Replay each task's ground truth through its env; print reward and state hash per task"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --config configs/tau-retail.yaml --tasks runs/tau/retail-dev.jsonl`,
      description: "replay every converted retail task"
    }
  ])
)

export const command = Command.make("env").pipe(
  Command.withDescription("Environment tools"),
  Command.withSubcommands([check])
)
