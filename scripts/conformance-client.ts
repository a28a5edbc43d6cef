/**
 * The MCP conformance suite's client under test: effect-rl's McpClient over Streamable HTTP.
 *
 *   node scripts/conformance-client.ts <server-url>        (MCP_CONFORMANCE_SCENARIO names the scenario)
 *
 * It connects (initialize + tools/list, as an env does), then calls every listed tool once with arguments made from
 * its input schema, answers elicitation with the schema's defaults, and closes the session. Exit 1 on any failure.
 */
import { Effect, Schema } from "effect"
import { McpServerConfig } from "../src/config/EnvironmentConfig.ts"
import * as McpClient from "../src/mcp/McpClient.ts"

const url = process.argv[process.argv.length - 1] ?? ""
const scenario = process.env["MCP_CONFORMANCE_SCENARIO"] ?? ""

/** A value for each required property: the schema's default, else a small value of its type. */
const argumentsFor = (schema: Readonly<Record<string, unknown>>): Record<string, unknown> => {
  const properties = (schema["properties"] ?? {}) as Record<string, { type?: string; default?: unknown }>
  const required = (schema["required"] ?? []) as ReadonlyArray<string>
  const sample = (p: { type?: string; default?: unknown }): unknown =>
    p.default ??
    (p.type === "number" || p.type === "integer" ? 1 : p.type === "boolean" ? true : p.type === "array" ? [] : "x")
  return Object.fromEntries(required.map((k) => [k, sample(properties[k] ?? {})]))
}

/**
 * auth/* scenarios: OAuth with the client name and redirect URL a user would configure, a CIMD URL (used where the
 * authorization server supports client ID metadata documents) and, for pre-registration, the client the scenario's
 * context names (its secret passed by env reference, as a config must).
 */
const oauthFor = (name: string): Record<string, unknown> | undefined => {
  if (!name.startsWith("auth/")) return undefined
  const context = JSON.parse(process.env["MCP_CONFORMANCE_CONTEXT"] ?? "{}") as {
    client_id?: string
    client_secret?: string
  }
  if (context.client_secret !== undefined) process.env["CONFORMANCE_CLIENT_SECRET"] = context.client_secret
  return {
    client_name: "effect-rl-conformance",
    client_metadata_url: "https://conformance-test.local/client-metadata.json",
    ...(context.client_id === undefined ? {} : { client_id: context.client_id }),
    ...(context.client_secret === undefined ? {} : { client_secret: { env: "CONFORMANCE_CLIENT_SECRET" } })
  }
}

const program = Effect.gen(function* () {
  const oauth = oauthFor(scenario)
  const server = Schema.decodeUnknownSync(McpServerConfig)({
    name: "conformance",
    transport: "http",
    url,
    ...(oauth === undefined ? {} : { oauth })
  })
  const client = yield* McpClient.make({ servers: [server], retries: 0, elicitation: "accept_defaults" })
  const tools = yield* client.tools
  for (const tool of tools) {
    const result = yield* client.call(tool.name, argumentsFor(tool.inputSchema))
    console.log(`${scenario}: ${tool.name} → ${result.text.slice(0, 200)}`)
  }
}).pipe(Effect.scoped)

Effect.runPromise(program).then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(`${scenario}: ${error instanceof Error ? error.message : String(error)}`)
    process.exit(1)
  }
)
