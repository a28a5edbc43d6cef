import { Schema } from "effect"
import { PositiveInt, withDefault } from "./Field.ts"

/** One MCP server: a command over stdio, or a URL over Streamable HTTP. */
export const McpServerConfig = Schema.Struct({
  name: Schema.NonEmptyString,
  transport: Schema.Literals(["stdio", "http"]).pipe(withDefault("stdio")),
  command: Schema.optionalKey(Schema.NonEmptyString), // "node" = this Node (process.execPath)
  args: Schema.Array(Schema.String).pipe(withDefault([])),
  env: Schema.Record(Schema.String, Schema.String).pipe(withDefault({})), // passed explicitly, nothing inherited
  cwd: Schema.optionalKey(Schema.String),
  url: Schema.optionalKey(Schema.NonEmptyString),
  headers: Schema.Record(Schema.String, Schema.String).pipe(withDefault({})),
  allowed_tools: Schema.optionalKey(Schema.Array(Schema.String)),
  isolation: Schema.Literals(["shared", "per_trajectory"]).pipe(withDefault("shared")),
  timeout_ms: PositiveInt.pipe(withDefault(30_000))
}).check(
  Schema.makeFilter(
    (s) =>
      (s.transport === "stdio" ? s.command !== undefined : s.url !== undefined) || {
        path: [s.transport === "stdio" ? "command" : "url"],
        issue: s.transport === "stdio" ? "a stdio server needs a command" : "an http server needs a url"
      }
  )
)
export type McpServerConfig = typeof McpServerConfig.Type

export const EnvironmentConfig = Schema.Struct({
  env_class: Schema.optionalKey(Schema.NonEmptyString), // used when a dataset row names none
  mcp_servers: Schema.Array(McpServerConfig).pipe(withDefault([])),
  tool_call_format: Schema.Literals(["auto", "hermes", "json", "xml", "react"]).pipe(withDefault("auto")),
  // how tools are shown: system (JSON schema lines), compact (name(args): description), template (chat template)
  tool_prompt: Schema.Literals(["system", "compact", "template"]).pipe(withDefault("system")),
  max_result_chars: PositiveInt.pipe(withDefault(4096)),
  tool_io: Schema.Literals(["live", "record", "replay"]).pipe(withDefault("live")),
  replay_from: Schema.optionalKey(Schema.NonEmptyString), // episodes.jsonl whose tool results `replay` serves
  retries: PositiveInt.pipe(withDefault(2)),
  tau: Schema.optionalKey(
    Schema.Struct({
      data_dir: Schema.NonEmptyString,
      user: Schema.Literals(["scripted", "llm", "react", "verify", "reflection"]).pipe(withDefault("scripted"))
    })
  )
})
export type EnvironmentConfig = typeof EnvironmentConfig.Type
