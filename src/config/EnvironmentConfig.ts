import { Schema } from "effect"
import { NonNegative, NonNegativeInt, PositiveInt, Probability, SecretRef, withDefault } from "./Field.ts"

/**
 * OAuth 2.1 for an HTTP server (MCP authorization spec): discovery, dynamic or CIMD or pre-registered client,
 * PKCE authorization-code flow, scope step-up. Headless: nobody is there to click "allow", so the authorization
 * endpoint must answer with a redirect carrying the code (a pre-approved client); otherwise connecting fails.
 */
export const McpOAuthConfig = Schema.Struct({
  client_name: Schema.NonEmptyString.pipe(withDefault("effect-rl")), // the client name registered with the server
  // where the authorization endpoint redirects with the code
  redirect_url: Schema.NonEmptyString.pipe(withDefault("http://localhost:3000/callback")),
  client_id: Schema.optionalKey(Schema.NonEmptyString), // pre-registered client; else dynamic registration or CIMD
  client_secret: Schema.optionalKey(SecretRef), // { env: NAME }: never inline
  client_metadata_url: Schema.optionalKey(Schema.NonEmptyString), // a CIMD URL, used as client_id where supported
  scope: Schema.optionalKey(Schema.String) // the scopes asked for
})
export type McpOAuthConfig = typeof McpOAuthConfig.Type

/** One MCP server: a command over stdio, or a URL over Streamable HTTP. */
export const McpServerConfig = Schema.Struct({
  name: Schema.NonEmptyString, // with several servers mounted, its tools are <name>__<tool>
  // stdio: a command spawned here; http: Streamable HTTP at url
  transport: Schema.Literals(["stdio", "http"]).pipe(withDefault("stdio")),
  command: Schema.optionalKey(Schema.NonEmptyString), // "node" = this Node (process.execPath)
  args: Schema.Array(Schema.String).pipe(withDefault([])), // the command's arguments
  env: Schema.Record(Schema.String, Schema.String).pipe(withDefault({})), // passed explicitly, nothing inherited
  cwd: Schema.optionalKey(Schema.String), // the command's working directory
  url: Schema.optionalKey(Schema.NonEmptyString), // http: the server's Streamable HTTP endpoint
  // http: sent with every request (values under secret-looking keys are redacted where the config is printed)
  headers: Schema.Record(Schema.String, Schema.String).pipe(withDefault({})),
  oauth: Schema.optionalKey(McpOAuthConfig), // http only
  // only these tools, by the server's own names (default: all)
  allowed_tools: Schema.optionalKey(Schema.Array(Schema.String)),
  // shared: one connection for every trajectory; per_trajectory: a fresh one (stdio: a fresh process) each
  isolation: Schema.Literals(["shared", "per_trajectory"]).pipe(withDefault("shared")),
  timeout_ms: PositiveInt.pipe(withDefault(30_000)) // per call; then it is cancelled and fails as a timeout
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

/** The simulated user's model: any OpenAI-compatible chat-completions endpoint. */
export const TauUserLlmConfig = Schema.Struct({
  url: Schema.NonEmptyString, // base URL, e.g. http://localhost:8000/v1
  model: Schema.NonEmptyString, // the user model's name, as the endpoint knows it
  api_key: Schema.optionalKey(SecretRef), // { env: OPENAI_API_KEY }
  temperature: NonNegative.pipe(withDefault(0)), // the user model's sampling temperature
  timeout_ms: PositiveInt.pipe(withDefault(120_000)) // per call
})

/**
 * tau-bench (`env_class: tau_bench`): where the data is, which domain rows without one use, the simulated user, and
 * the action budget. The LLM user's calls follow `tool_io` (live, record, or replay from `replay_from`).
 */
export const TauConfig = Schema.Struct({
  data_dir: Schema.NonEmptyString, // holds <domain>/db/*.json, tasks.json, tools.json, wiki.md
  // the simulated user: scripted (deterministic, no LLM), or upstream's llm, react, verify or reflection (on user_llm)
  user: Schema.Literals(["scripted", "llm", "react", "verify", "reflection"]).pipe(withDefault("scripted")),
  domain: Schema.Literals(["retail", "airline"]).pipe(withDefault("retail")), // for rows that name none
  max_steps: PositiveInt.pipe(withDefault(30)), // upstream's tool-calling agent: 30 actions, then reward 0
  user_llm: Schema.optionalKey(TauUserLlmConfig)
}).check(
  Schema.makeFilter(
    (t) =>
      t.user === "scripted" ||
      t.user_llm !== undefined || { path: ["user_llm"], issue: `user "${t.user}" needs user_llm (url, model)` }
  )
)
export type TauConfig = typeof TauConfig.Type

/** What the judge scores by when a row gives no `reward_spec.rubric`. */
export const defaultRubric =
  "Score how well each trajectory accomplishes the task: 1 for a correct, complete answer reached with the right tool calls; partial credit for partial progress; 0 for a wrong answer, no answer, or misused tools. Judge the trajectories against each other: a better one gets a higher score."

/**
 * The group-relative LLM judge (`reward_spec.method: judge`): all n trajectories of a prompt go to one chat call
 * on any OpenAI-compatible endpoint, which answers a score in [0, 1] for each. Its calls follow `tool_io`: in
 * `replay` they are answered from the `judge.calls` of `replay_from`'s groups, with no endpoint.
 */
export const JudgeConfig = Schema.Struct({
  url: Schema.NonEmptyString, // base URL, e.g. http://localhost:8000/v1
  model: Schema.NonEmptyString, // the judge's model name, as the endpoint knows it
  api_key: Schema.optionalKey(SecretRef), // { env: OPENAI_API_KEY }
  rubric: Schema.String.pipe(withDefault(defaultRubric)), // a row's reward_spec.rubric replaces it
  // which training rows it scores: judge_rows (reward_spec.method judge) or all_train_rows (every training row; a
  // row's ground truth goes to the judge as the reference; held-out rows keep their own rewards)
  apply_to: Schema.Literals(["judge_rows", "all_train_rows"]).pipe(withDefault("judge_rows")),
  temperature: NonNegative.pipe(withDefault(0)), // the judge's sampling temperature
  max_tokens: PositiveInt.pipe(withDefault(512)), // per answer
  seed: Schema.optionalKey(Schema.Int), // sent with every call, for endpoints that sample reproducibly
  // send response_format json_schema (the scores object), so an endpoint with structured outputs answers parseable JSON
  structured_output: Schema.Boolean.pipe(withDefault(true)),
  max_concurrency: PositiveInt.pipe(withDefault(4)), // judge calls in flight at once
  http_retries: NonNegativeInt.pipe(withDefault(3)), // per call, on 429/502/503/504/refused/timeout, backoff doubling
  backoff_ms: PositiveInt.pipe(withDefault(250)), // the first retry's wait; it doubles
  timeout_ms: PositiveInt.pipe(withDefault(120_000)), // per call
  // answers asked for per group: a malformed, out-of-range or incomplete answer is asked again (with the reason),
  // up to this many in all; then the group gets fallback_score for every trajectory
  max_attempts: PositiveInt.pipe(withDefault(3)),
  fallback_score: Probability.pipe(withDefault(0)), // equal scores: the group's advantages are 0, it teaches nothing
  max_trajectory_chars: PositiveInt.pipe(withDefault(6000)), // each trajectory's transcript is cut to this
  // the endpoint's prices, for judge/cost
  prices: Schema.Struct({
    prompt_per_token: NonNegative.pipe(withDefault(0)), // judge/cost = tokens at these prices (e.g. dollars)
    completion_per_token: NonNegative.pipe(withDefault(0)) // as prompt_per_token, for the answer's tokens
  }).pipe(withDefault({})),
  cache: Schema.Boolean.pipe(withDefault(true)), // a group judged before (same transcripts, rubric, model) is not sent again
  cache_file: Schema.optionalKey(Schema.NonEmptyString) // JSONL: the cache kept across runs (not read in replay)
})
export type JudgeConfig = typeof JudgeConfig.Type

/**
 * What the policy acts on: the environment class, its MCP tool servers, how tool calls are read and shown, recording
 * and replay of tool I/O, tau-bench and the LLM judge.
 */
export const EnvironmentConfig = Schema.Struct({
  env_class: Schema.optionalKey(Schema.NonEmptyString), // used when a dataset row names none
  mcp_servers: Schema.Array(McpServerConfig).pipe(withDefault([])),
  // how tool calls are read from the policy's text and written in tool prompts; auto: by the marker the text holds
  tool_call_format: Schema.Literals(["auto", "hermes", "json", "xml", "react"]).pipe(withDefault("auto")),
  // how tools are shown: system (JSON schema lines), compact (name(args): description), template (chat template),
  // none (not shown: a policy fine-tuned on demonstrations of these tools)
  tool_prompt: Schema.Literals(["system", "compact", "template", "none"]).pipe(withDefault("system")),
  max_result_chars: PositiveInt.pipe(withDefault(4096)), // a tool result is cut at this many characters, with a mark
  // live: the MCP servers; record: live, keeping every call's record; replay: results from replay_from
  tool_io: Schema.Literals(["live", "record", "replay"]).pipe(withDefault("live")),
  replay_from: Schema.optionalKey(Schema.NonEmptyString), // episodes.jsonl whose tool results `replay` serves
  // a failed connection, or a read-only or idempotent tool's call that crashed or timed out, is tried again this often
  retries: PositiveInt.pipe(withDefault(2)),
  tau: Schema.optionalKey(TauConfig),
  judge: Schema.optionalKey(JudgeConfig) // the LLM judge of rows with reward_spec.method judge
})
export type EnvironmentConfig = typeof EnvironmentConfig.Type
