/**
 * Tool-use tasks written by an LLM (any OpenAI-compatible endpoint, through `ChatClient`, so every call is recorded
 * and replays with no endpoint), checked against the tools' own schemas, de-duplicated, as SkyRL rows for the MCP
 * tool env (`env_class: mcp_tool`) scored by the rule reward:
 *
 *   { uid, data_source, env_class: "mcp_tool", prompt: [{ role: "user", content: <task> }],
 *     reward_spec: { method: "rule", ground_truth: { tool_sequence: [{ tool, server?, arguments }], order:
 *       "subsequence", answer?, weights: { answer: 1 − w, tool_sequence: w } } },
 *     extra_info: { domain, complexity, calls, max_turns, server?, generator: { model, call } } }
 *
 * How it asks (one call asks for `batch` tasks): the system message lists the tools (name, description, input
 * schema) and the answer's JSON shape `{ "tasks": [{ "prompt", "tool_sequence": [{ "tool", "arguments" }],
 * "answer"? }] }`; the user message names one domain and one complexity and the most calls a task may need. The
 * (domain, complexity) of call i is drawn from the seeded PRNG, and call i carries `seed + i`, so the same settings
 * ask the same questions. `response_format` is a JSON schema of that shape (tool names as an enum; arguments are
 * checked here, not in the schema, so any schema-capable server can decode it).
 *
 * `style: "mcp"` is the same loop for one MCP server's tools (ART's scenario generation): no domains (the tools are
 * the domain), complexities as difficulties, every expected call carrying the server's name so the rows run on
 * `McpToolEnv` with that server mounted under the same name. With `reward: "judge"` the rows are scored by the LLM
 * group judge instead (ART's RULER idea: most generated tasks have no trustworthy exact answer), the expected calls
 * and answer going to the judge as its reference.
 *
 * A task is kept only if: its prompt is non-empty text; it makes 1..maxTools calls; every call names a tool that
 * exists and its arguments conform to that tool's input schema (`JsonSchemaCheck`); the answer, if any, is a string
 * or number; and its normalised prompt (case, punctuation and spacing ignored) is new. Everything else is rejected
 * with its reason, kept in the raw log beside the rows. Calls continue, in rounds, until `count` tasks are kept or
 * `maxCalls` calls were made.
 */
import { Effect } from "effect"
import type { LlmCallRecord } from "../domain/LlmCall.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type * as ChatClient from "../env/ChatClient.ts"
import type * as Rewards from "../env/Rewards.ts"
import type { ReplayMissError } from "../env/ToolIo.ts"
import * as Prng from "../model/Prng.ts"
import * as JsonSchemaCheck from "./JsonSchemaCheck.ts"

/** A tool the tasks may use: an MCP tool, or an OpenAI function definition read as one. */
export interface Tool {
  readonly name: string
  readonly description: string
  readonly inputSchema: Readonly<Record<string, unknown>>
  /** The MCP server that serves it; expected calls carry it. */
  readonly server?: string
}

export interface Settings {
  readonly style: "llm" | "mcp"
  /** Topics tasks are set in (`llm`); empty: the tools' own. */
  readonly domains: ReadonlyArray<string>
  readonly complexities: ReadonlyArray<string>
  /** Most calls one task may need. */
  readonly maxTools: number
  /** The rows' `max_turns` (the env's turn budget per episode). */
  readonly maxTurns: number
  /** Tasks to keep. */
  readonly count: number
  readonly seed: number
  /** Tasks asked for per call. */
  readonly batch: number
  /** Most calls in all (default: 3 × the calls `count` needs, at least 2 more). */
  readonly maxCalls: number
  /** Calls in flight at once. */
  readonly concurrency: number
  readonly dataSource: string
  /** Weight of the sequence's partial credit; the outcome gets 1 − it. */
  readonly sequenceWeight: number
  readonly temperature: number
  readonly maxTokens: number
  /** Send `response_format` (a JSON schema of the answer). */
  readonly responseFormat: boolean
  /**
   * How the rows are scored: `rule` (the rule reward on the expected calls and answer) or `judge` (the LLM group
   * judge, with the expected calls and answer as its reference, and `rubric` when given). Absent: rule.
   */
  readonly reward?: "rule" | "judge"
  readonly rubric?: string
}

export const defaults = {
  llm: {
    domains: ["e-commerce", "travel", "finance", "scheduling", "data lookup"],
    complexities: ["simple", "multi-step", "complex"]
  },
  mcp: { domains: [] as ReadonlyArray<string>, complexities: ["easy", "medium", "hard"] },
  maxTools: 4,
  maxTurns: 6,
  batch: 5,
  concurrency: 4,
  sequenceWeight: 0.2,
  temperature: 1,
  maxTokens: 4096
} as const

export const defaultMaxCalls = (count: number, batch: number): number => 3 * Math.ceil(count / batch) + 2

/** Why a proposed task was not kept. */
export interface Rejection {
  readonly index: number // in the call's answer, 0-based
  readonly prompt?: string
  readonly reason: string
}

/** One line of the raw log: a call, what was asked and answered, what was kept and why the rest was not. */
export interface CallLog {
  readonly kind: "call"
  readonly call: number
  readonly domain: string
  readonly complexity: string
  readonly record: LlmCallRecord
  readonly kept: ReadonlyArray<string> // uids
  readonly rejected: ReadonlyArray<Rejection>
}

/** The raw log's first line: everything replay needs besides the calls. */
export interface Header {
  readonly kind: "header"
  readonly settings: Settings
  readonly model: string
  readonly tools: ReadonlyArray<Tool>
}

export interface Result {
  readonly rows: ReadonlyArray<PromptRow>
  readonly calls: ReadonlyArray<CallLog>
  readonly rejected: number
  readonly duplicates: number
  readonly promptTokens: number
  readonly completionTokens: number
}

// ---------------------------------------------------------------------------------------------------------------
// Tools.

const isObject = (v: unknown): v is Readonly<Record<string, unknown>> =>
  typeof v === "object" && v !== null && !Array.isArray(v)

/**
 * Tools from JSON: an array of MCP tools (`{ name, description?, inputSchema, server? }`, what `tools list` prints
 * last) or of OpenAI functions (`{ type: "function", function: { name, description?, parameters } }`). Throws with
 * the index and key of the first bad entry.
 */
export const toolsFromJson = (value: unknown, source: string): ReadonlyArray<Tool> => {
  if (!Array.isArray(value) || value.length === 0)
    throw new Error(`${source}: expected a non-empty JSON array of tools`)
  const names = new Set<string>()
  return value.map((raw, i) => {
    const entry = isObject(raw) && isObject(raw["function"]) ? raw["function"] : raw
    if (!isObject(entry) || typeof entry["name"] !== "string" || entry["name"] === "") {
      throw new Error(`${source}: tool ${i}: name: expected a non-empty string`)
    }
    const name = entry["name"]
    if (names.has(name)) throw new Error(`${source}: tool ${i}: name: "${name}" is listed twice`)
    names.add(name)
    const schema = entry["inputSchema"] ?? entry["parameters"] ?? { type: "object", properties: {} }
    if (!isObject(schema)) throw new Error(`${source}: tool ${i} (${name}): inputSchema: expected a JSON schema object`)
    const server = isObject(raw) ? raw["server"] : undefined
    return {
      name,
      description: typeof entry["description"] === "string" ? entry["description"] : "",
      inputSchema: schema,
      ...(typeof server === "string" && server !== "" ? { server } : {})
    }
  })
}

// ---------------------------------------------------------------------------------------------------------------
// Asking.

const maxPromptChars = 2000
const maxAnswerChars = 500

/** The JSON schema of an answer (`response_format`): at most `batch` tasks, prompts and answers of bounded length. */
export const answerSchema = (tools: ReadonlyArray<Tool>, maxTools: number, batch: number): Record<string, unknown> => ({
  type: "object",
  properties: {
    tasks: {
      type: "array",
      minItems: 1,
      maxItems: batch,
      items: {
        type: "object",
        properties: {
          prompt: { type: "string", minLength: 1, maxLength: maxPromptChars },
          tool_sequence: {
            type: "array",
            minItems: 1,
            maxItems: maxTools,
            items: {
              type: "object",
              properties: { tool: { type: "string", enum: tools.map((t) => t.name) }, arguments: { type: "object" } },
              required: ["tool", "arguments"]
            }
          },
          answer: { type: "string", maxLength: maxAnswerChars }
        },
        required: ["prompt", "tool_sequence"]
      }
    }
  },
  required: ["tasks"]
})

const toolLines = (tools: ReadonlyArray<Tool>): string =>
  tools.map((t) => JSON.stringify({ name: t.name, description: t.description, input_schema: t.inputSchema })).join("\n")

export const systemPrompt = (tools: ReadonlyArray<Tool>, settings: Settings): string =>
  [
    settings.style === "mcp"
      ? "You write tasks a user of an MCP server could ask an AI agent to do with its tools:"
      : "You write diverse tasks for an AI agent that solves them by calling these tools:",
    toolLines(tools),
    "A task is one self-contained user request. Give the calls a correct solution makes, in order, with arguments",
    "that conform to the tool's input schema, and the final answer if it is certain. Use only these tools; no repeats.",
    'Answer with JSON only: {"tasks": [{"prompt": "...", "tool_sequence": [{"tool": "<name>", "arguments": {...}}],',
    '"answer": "..."}]} (answer optional).'
  ].join("\n")

export const userPrompt = (settings: Settings, domain: string, complexity: string): string =>
  [
    `Write ${settings.batch} different tasks.`,
    settings.style === "mcp" ? `Difficulty: ${complexity}.` : `Domain: ${domain}. Complexity: ${complexity}.`,
    `Each task needs between 1 and ${settings.maxTools} tool calls and can be done within ${settings.maxTurns} turns.`
  ].join(" ")

/** The (domain, complexity) of each call index, drawn from the seed. */
export const plan = (settings: Settings, calls: number): ReadonlyArray<{ domain: string; complexity: string }> => {
  const prng = Prng.make(settings.seed)
  const pick = (list: ReadonlyArray<string>, fallback: string) =>
    list.length === 0 ? fallback : list[Math.min(list.length - 1, Math.floor(prng.next() * list.length))]!
  return Array.from({ length: calls }, () => ({
    domain: pick(settings.domains, "any"),
    complexity: pick(settings.complexities, "any")
  }))
}

export const request = (
  tools: ReadonlyArray<Tool>,
  settings: Settings,
  call: number,
  slot: { domain: string; complexity: string }
): ChatClient.ChatRequest => ({
  messages: [
    { role: "system", content: systemPrompt(tools, settings) },
    { role: "user", content: userPrompt(settings, slot.domain, slot.complexity) }
  ],
  ...(settings.responseFormat
    ? {
        responseFormat: {
          type: "json_schema",
          json_schema: { name: "tasks", schema: answerSchema(tools, settings.maxTools, settings.batch), strict: false }
        }
      }
    : {}),
  temperature: settings.temperature,
  maxTokens: settings.maxTokens,
  seed: settings.seed + call
})

// ---------------------------------------------------------------------------------------------------------------
// Checking answers.

/** The JSON in an answer: the whole text, else inside a ``` fence, else from the first `{`/`[` to the last. */
export const extractJson = (content: string): unknown => {
  const attempts = [content.trim()]
  const fence = /```(?:json)?\s*([\s\S]*?)```/.exec(content)
  if (fence?.[1] !== undefined) attempts.push(fence[1].trim())
  const start = content.search(/[{[]/)
  const end = Math.max(content.lastIndexOf("}"), content.lastIndexOf("]"))
  if (start >= 0 && end > start) attempts.push(content.slice(start, end + 1))
  for (const text of attempts) {
    try {
      return JSON.parse(text) as unknown
    } catch {
      // next
    }
  }
  return undefined
}

/** Case, punctuation and spacing ignored: what makes two prompts the same task. */
export const normalizePrompt = (prompt: string): string =>
  prompt
    .normalize("NFKC")
    .toLowerCase()
    .replace(/[^\p{L}\p{N}]+/gu, " ")
    .trim()

interface Accepted {
  readonly prompt: string
  readonly sequence: ReadonlyArray<{ readonly tool: Tool; readonly arguments: Readonly<Record<string, unknown>> }>
  readonly answer: string | number | undefined
}

/** A proposed task, kept, or the reason it is not (duplicates are decided by the caller). */
export const checkTask = (
  raw: unknown,
  tools: ReadonlyMap<string, Tool>,
  maxTools: number
): Accepted | { readonly reason: string } => {
  if (!isObject(raw)) return { reason: "not a JSON object" }
  const prompt = raw["prompt"]
  if (typeof prompt !== "string" || prompt.trim() === "") return { reason: "prompt: missing or empty" }
  const steps = raw["tool_sequence"]
  if (!Array.isArray(steps) || steps.length === 0) return { reason: "tool_sequence: missing or empty" }
  if (steps.length > maxTools)
    return { reason: `tool_sequence: ${steps.length} calls, more than max tools ${maxTools}` }
  const sequence: Array<Accepted["sequence"][number]> = []
  for (const [i, step] of steps.entries()) {
    if (!isObject(step)) return { reason: `tool_sequence[${i}]: not an object { tool, arguments }` }
    const name = step["tool"] ?? step["name"]
    const tool = typeof name === "string" ? tools.get(name) : undefined
    if (tool === undefined) {
      return {
        reason: `tool_sequence[${i}].tool: ${JSON.stringify(name)} is not a tool (known: ${[...tools.keys()].join(", ")})`
      }
    }
    const args = step["arguments"] ?? {}
    if (!isObject(args)) return { reason: `tool_sequence[${i}].arguments: not an object` }
    const problems = JsonSchemaCheck.problems(tool.inputSchema, args)
    if (problems.length > 0) {
      return {
        reason: `tool_sequence[${i}].arguments of ${tool.name}: ${problems.map((p) => p.replace(/^\$/, "arguments")).join("; ")}`
      }
    }
    sequence.push({ tool, arguments: args })
  }
  const answer = raw["answer"]
  if (answer !== undefined && answer !== null && typeof answer !== "string" && typeof answer !== "number") {
    return { reason: "answer: not a string or number" }
  }
  const keptAnswer =
    typeof answer === "number" || (typeof answer === "string" && answer.trim() !== "") ? answer : undefined
  return { prompt: prompt.trim(), sequence, answer: keptAnswer }
}

export const uidOf = (settings: Settings, index: number): string =>
  `${settings.dataSource}-${settings.seed}-${String(index).padStart(5, "0")}`

const toRow = (
  task: Accepted,
  settings: Settings,
  index: number,
  slot: { domain: string; complexity: string },
  model: string,
  call: number
): PromptRow => {
  const w = settings.sequenceWeight
  const groundTruth: typeof Rewards.RuleGroundTruth.Encoded = {
    tool_sequence: task.sequence.map((s) => ({
      tool: s.tool.name,
      ...(s.tool.server === undefined ? {} : { server: s.tool.server }),
      arguments: { ...s.arguments }
    })),
    order: "subsequence",
    ...(task.answer === undefined ? {} : { answer: task.answer }),
    weights: { answer: 1 - w, tool_sequence: w }
  }
  const servers = [...new Set(task.sequence.flatMap((s) => (s.tool.server === undefined ? [] : [s.tool.server])))]
  return {
    uid: uidOf(settings, index),
    data_source: settings.dataSource,
    env_class: "mcp_tool",
    prompt: [{ role: "user", content: task.prompt }],
    reward_spec:
      settings.reward === "judge"
        ? {
            method: "judge",
            ground_truth: groundTruth,
            ...(settings.rubric === undefined ? {} : { rubric: settings.rubric })
          }
        : { method: "rule", ground_truth: groundTruth },
    extra_info: {
      ...(settings.style === "mcp"
        ? { difficulty: slot.complexity }
        : { domain: slot.domain, complexity: slot.complexity }),
      calls: task.sequence.length,
      max_turns: settings.maxTurns,
      ...(servers.length === 1 ? { server: servers[0] } : servers.length > 1 ? { servers } : {}),
      generator: { model, call }
    }
  }
}

/** One call's answer: the kept rows (appended to `state`) and the rejections. */
const absorb = (
  content: string,
  state: { rows: Array<PromptRow>; seen: Map<string, string>; duplicates: number },
  toolMap: ReadonlyMap<string, Tool>,
  settings: Settings,
  slot: { domain: string; complexity: string },
  model: string,
  call: number
): { kept: Array<string>; rejected: Array<Rejection> } => {
  const kept: Array<string> = []
  const rejected: Array<Rejection> = []
  const parsed = extractJson(content)
  const tasks = Array.isArray(parsed) ? parsed : isObject(parsed) ? parsed["tasks"] : undefined
  if (!Array.isArray(tasks)) {
    rejected.push({
      index: -1,
      reason:
        parsed === undefined ? `the answer is not JSON: ${content.slice(0, 120)}` : 'the answer has no "tasks" array'
    })
    return { kept, rejected }
  }
  for (const [index, raw] of tasks.entries()) {
    if (state.rows.length >= settings.count) break
    const checked = checkTask(raw, toolMap, settings.maxTools)
    const prompt = isObject(raw) && typeof raw["prompt"] === "string" ? raw["prompt"] : undefined
    if ("reason" in checked) {
      rejected.push({ index, ...(prompt === undefined ? {} : { prompt }), reason: checked.reason })
      continue
    }
    const key = normalizePrompt(checked.prompt)
    const earlier = state.seen.get(key)
    if (earlier !== undefined) {
      state.duplicates++
      rejected.push({ index, prompt: checked.prompt, reason: `duplicate of ${earlier}` })
      continue
    }
    const row = toRow(checked, settings, state.rows.length, slot, model, call)
    state.seen.set(key, row.uid!)
    state.rows.push(row)
    kept.push(row.uid!)
  }
  return { kept, rejected }
}

export interface Progress {
  readonly call: number
  readonly domain: string
  readonly complexity: string
  readonly kept: number
  readonly rejected: ReadonlyArray<Rejection>
  readonly total: number
}

/**
 * Asks `client` for tasks until `settings.count` are kept or `settings.maxCalls` calls were made. Calls run in rounds
 * of at most `concurrency`; answers are taken in call order, so the rows do not depend on which call finished first.
 */
export const generate = (
  client: ChatClient.ChatClient,
  tools: ReadonlyArray<Tool>,
  settings: Settings,
  onProgress: (p: Progress) => Effect.Effect<void> = () => Effect.void
): Effect.Effect<Result, ChatClient.ChatClientError | ReplayMissError> =>
  Effect.gen(function* () {
    const toolMap = new Map(tools.map((t) => [t.name, t]))
    const slots = plan(settings, settings.maxCalls)
    const state = { rows: [] as Array<PromptRow>, seen: new Map<string, string>(), duplicates: 0 }
    const calls: Array<CallLog> = []
    let next = 0
    let promptTokens = 0
    let completionTokens = 0
    while (state.rows.length < settings.count && next < settings.maxCalls) {
      const needed = Math.ceil((settings.count - state.rows.length) / settings.batch)
      const round = Array.from(
        { length: Math.min(needed, settings.concurrency, settings.maxCalls - next) },
        (_, i) => next + i
      )
      next += round.length
      const answers = yield* Effect.forEach(
        round,
        (call) => client.complete(request(tools, settings, call, slots[call]!)).pipe(Effect.map((r) => ({ call, r }))),
        { concurrency: settings.concurrency }
      )
      for (const { call, r } of answers) {
        const slot = slots[call]!
        promptTokens += r.promptTokens
        completionTokens += r.completionTokens
        const { kept, rejected } = absorb(r.content, state, toolMap, settings, slot, client.model, call)
        calls.push({
          kind: "call",
          call,
          domain: slot.domain,
          complexity: slot.complexity,
          record: r.record,
          kept,
          rejected
        })
        yield* onProgress({ call, ...slot, kept: kept.length, rejected, total: state.rows.length })
      }
    }
    return {
      rows: state.rows,
      calls,
      rejected: calls.reduce((n, c) => n + c.rejected.length, 0) - state.duplicates,
      duplicates: state.duplicates,
      promptTokens,
      completionTokens
    }
  })

/** The raw log: the header, then one line per call. */
export const rawLog = (header: Header, calls: ReadonlyArray<CallLog>): string =>
  [header, ...calls].map((line) => `${JSON.stringify(line)}\n`).join("")

/** `out.jsonl` → `out.raw.jsonl`: where the prompts and raw answers go. */
export const rawFile = (out: string): string => {
  const match = /(\.jsonl|\.json)$/.exec(out)
  return `${match === null ? out : out.slice(0, match.index)}.raw.jsonl`
}

/** Reads a raw log back: its header and the recorded calls (for `ChatClient` in replay mode). */
export const readRawLog = (
  text: string,
  file: string
): { readonly header: Header; readonly records: ReadonlyArray<LlmCallRecord> } => {
  const lines = text.split("\n").filter((l) => l.trim() !== "")
  const parsed = lines.map((line, i) => {
    try {
      return JSON.parse(line) as { kind?: unknown }
    } catch {
      throw new Error(`${file}:${i + 1}: not valid JSON`)
    }
  })
  const header = parsed[0]
  if (header?.kind !== "header") throw new Error(`${file}:1: expected the header line ({"kind": "header", ...})`)
  const records = parsed.slice(1).map((line, i) => {
    const record = (line as { record?: unknown }).record
    if (line.kind !== "call" || !isObject(record)) throw new Error(`${file}:${i + 2}: record: expected a recorded call`)
    return record as unknown as LlmCallRecord
  })
  return { header: header as unknown as Header, records }
}
