/**
 * `tools`: look at and try an MCP server's tools, through the same McpClient the environments use.
 *
 *   tools list --config run.yaml [--server NAME] [key.path=value ...]
 *   tools list --command "node src/toolbox/server.ts"
 *   tools list --url http://127.0.0.1:8931/mcp
 *   tools call add --args '{"a": 2, "b": 3}' --command "node src/toolbox/server.ts"
 *
 * `list` prints each tool's name, description and input schema, then a JSON array of them as the last line.
 * `call` prints the result as one JSON line `{ tool, server, isError, text, structured? }` and exits 1 on a tool
 * error, with the server's message. Server stderr is logged at Debug (`--log-level debug` shows it).
 */
import { Console, Effect, Option, Schema } from "effect"
import { Argument, CliError, Command, Flag } from "effect/cli"
import {
  EnvironmentConfig,
  type McpServerConfig,
  McpServerConfig as McpServerConfigSchema
} from "../config/EnvironmentConfig.ts"
import * as RunConfigLoader from "../config/RunConfigLoader.ts"
import * as McpClient from "../mcp/McpClient.ts"
import * as RunFlags from "./RunFlags.ts"

const configFlag = RunFlags.config.pipe(Flag.optional)
const serverFlag = Flag.String("server").pipe(
  Flag.withDescription("Name of a server in the config's environment.mcp_servers (default: all of them)"),
  Flag.optional
)
const commandFlag = Flag.String("command").pipe(
  Flag.withDescription('A stdio server command line, e.g. "node src/toolbox/server.ts" ("node" is this Node)'),
  Flag.optional
)
const urlFlag = Flag.String("url").pipe(Flag.withDescription("A Streamable HTTP server URL"), Flag.optional)

const userError = (message: string) => new CliError.UserError({ cause: new Error(message), userMessage: message })

/** Splits a command line on whitespace, honouring single and double quotes. */
export const splitCommandLine = (line: string): Array<string> => {
  const out: Array<string> = []
  const re = /"([^"]*)"|'([^']*)'|(\S+)/g
  for (let m = re.exec(line); m !== null; m = re.exec(line)) out.push(m[1] ?? m[2] ?? m[3] ?? "")
  return out
}

const decodeServer = (raw: Record<string, unknown>) =>
  Schema.decodeUnknownEffect(McpServerConfigSchema)(raw).pipe(Effect.mapError((e) => userError(e.message)))

/** The servers the flags name: a config file's (optionally one of them), a command line, or a URL. */
export const selectServers = Effect.fn("cli.tools.selectServers")(function* (flags: {
  readonly config: Option.Option<string>
  readonly server: Option.Option<string>
  readonly command: Option.Option<string>
  readonly url: Option.Option<string>
  readonly overrides: ReadonlyArray<string>
}) {
  if (Option.isSome(flags.command)) {
    const [command, ...args] = splitCommandLine(flags.command.value)
    if (command === undefined) return yield* userError("--command is empty")
    const name = command.split("/").pop() === "node" ? "server" : (command.split("/").pop() ?? "server")
    return [yield* decodeServer({ name, command, args })]
  }
  if (Option.isSome(flags.url))
    return [yield* decodeServer({ name: "server", transport: "http", url: flags.url.value })]
  if (Option.isNone(flags.config)) return yield* userError('give --config FILE, --command "CMD ARGS" or --url URL')
  const file = flags.config.value
  // only the environment section matters here: a config without a model section still lists its tools
  const raw = yield* RunConfigLoader.readFile(file).pipe(
    Effect.flatMap((r) => RunConfigLoader.applyOverrides(r, flags.overrides)),
    Effect.mapError((e) => userError(e.message))
  )
  const environment = yield* Schema.decodeUnknownEffect(EnvironmentConfig)(raw["environment"] ?? {}).pipe(
    Effect.mapError((e) => userError(`invalid config ${file}: environment: ${e.message}`))
  )
  const servers: ReadonlyArray<McpServerConfig> = environment.mcp_servers
  if (Option.isNone(flags.server)) {
    if (servers.length === 0) return yield* userError(`${file} declares no environment.mcp_servers`)
    return servers
  }
  const wanted = flags.server.value
  const found = servers.find((s) => s.name === wanted)
  if (found === undefined) {
    return yield* userError(`no MCP server "${wanted}" in ${file}; have: ${servers.map((s) => s.name).join(", ")}`)
  }
  return [found]
})

export const connect = (servers: ReadonlyArray<McpServerConfig>) =>
  McpClient.make({ servers, retries: 0 }).pipe(Effect.mapError((e) => userError(e.message)))

const list = Command.make(
  "list",
  {
    config: configFlag,
    server: serverFlag,
    command: commandFlag,
    url: urlFlag,
    overrides: RunFlags.overrides
  },
  Effect.fn("cli.tools.list")(function* (flags) {
    const client = yield* connect(yield* selectServers(flags))
    const tools = yield* client.tools
    for (const tool of tools) {
      yield* Console.log(`${tool.name}${tool.description === "" ? "" : ` — ${tool.description}`}`)
      yield* Console.log(`  input: ${JSON.stringify(tool.inputSchema)}`)
    }
    yield* Console.log(
      JSON.stringify(
        tools.map((t) => ({ name: t.name, server: t.server, description: t.description, inputSchema: t.inputSchema }))
      )
    )
  }, Effect.scoped)
).pipe(
  Command.withDescription("List a server's tools: name, description, input schema"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} --command "node src/toolbox/server.ts"`,
      description: "the bundled toolbox server's tools"
    }
  ])
)

const call = Command.make(
  "call",
  {
    tool: Argument.String("tool").pipe(Argument.withDescription("Tool name (server__tool when several are mounted)")),
    args: Flag.String("args").pipe(
      Flag.withDescription("Arguments as a JSON object (default {})"),
      Flag.withDefault("{}")
    ),
    config: configFlag,
    server: serverFlag,
    command: commandFlag,
    url: urlFlag,
    overrides: RunFlags.overrides
  },
  Effect.fn("cli.tools.call")(function* (flags) {
    const args = yield* Effect.try({
      try: () => JSON.parse(flags.args) as unknown,
      catch: () => userError(`--args is not JSON: ${flags.args}`)
    })
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      return yield* userError("--args must be a JSON object")
    }
    const client = yield* connect(yield* selectServers(flags))
    const result = yield* client.call(flags.tool, args as Record<string, unknown>).pipe(Effect.result)
    if (result._tag === "Failure") {
      const e = result.failure
      yield* Console.log(
        JSON.stringify({ tool: flags.tool, server: e.server, isError: true, reason: e.reason, text: e.message })
      )
      return yield* userError(`${flags.tool} failed (${e.reason}): ${e.message}`)
    }
    const r = result.success
    yield* Console.log(
      JSON.stringify({
        tool: flags.tool,
        server: r.server,
        isError: false,
        text: r.text,
        ...(r.structured === undefined ? {} : { structured: r.structured })
      })
    )
  }, Effect.scoped)
).pipe(
  Command.withDescription("Call one tool and print its result as JSON; exit 1 on a tool error"),
  Command.withExamples(({ commandPath }) => [
    {
      command: `${commandPath.join(" ")} add --command "node src/toolbox/server.ts" --args '{"a": 2, "b": 3}'`,
      description: "call the toolbox's add"
    }
  ])
)

export const command = Command.make("tools").pipe(
  Command.withDescription("List and call the tools of MCP servers"),
  Command.withSubcommands([list, call])
)
