/**
 * Flags shared by every command that runs from a config: `--config FILE` and trailing `key.path=value` overrides.
 */
import { Effect } from "effect"
import { Argument, Flag } from "effect/cli"
import * as RunConfigLoader from "../config/RunConfigLoader.ts"

export const config = Flag.File("config", { mustExist: true }).pipe(
  Flag.withAlias("c"),
  Flag.withDescription("Run config (YAML or JSON)")
)

export const overrides = Argument.String("overrides").pipe(
  Argument.withDescription("Dotted overrides typed by the config schema, e.g. trainer.algorithm.kl_coef=0.01"),
  Argument.variadic()
)

/** Load and decode the config named by the flags. */
export const load = (file: string, overrideList: ReadonlyArray<string>) =>
  RunConfigLoader.load(file, overrideList).pipe(Effect.withSpan("cli.loadConfig"))
