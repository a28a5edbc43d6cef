/**
 * `config check --config FILE [key.path=value ...]`: decode and cross-check a run config, print it resolved with
 * secrets redacted. A bad config exits 1 with the key path, the bad value and what was expected.
 */
import { Console, Effect, Schema } from "effect"
import { Command } from "effect/cli"
import * as ConfigView from "../config/ConfigView.ts"
import { RunConfig } from "../config/RunConfig.ts"
import * as RunFlags from "./RunFlags.ts"

const check = Command.make(
  "check",
  { config: RunFlags.config, overrides: RunFlags.overrides },
  Effect.fn("cli.config.check")(function* ({ config, overrides }) {
    const decoded = yield* RunFlags.load(config, overrides)
    const encoded = yield* Schema.encodeEffect(RunConfig)(decoded).pipe(Effect.orDie)
    yield* Console.log(ConfigView.toYaml(ConfigView.redact(encoded)))
    yield* Console.error(`ok: ${config} is a valid run config`)
  })
).pipe(
  Command.withDescription("Decode and cross-check a run config; print it resolved, secrets redacted"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --config configs/quickstart.yaml trainer.optimizer.lr=2e-4`,
      description: "the quickstart config with one override, resolved"
    }
  ])
)

export const command = Command.make("config").pipe(
  Command.withDescription("Work with run configs"),
  Command.withSubcommands([check])
)
