/**
 * Dependent specs → compact SkyRL rows. A dependent spec is a scripted multi-turn tool-use conversation whose later
 * calls use what earlier calls returned. Training does not replay the conversation: the row's prompt is compact
 * (the spec's system text and ONE user message) and the calls become `reward_spec.ground_truth.tool_sequence`, which
 * the built-in rule reward scores (`Rewards`, method `rule`: partial credit for the sequence, `outcome` when every
 * call was made and the answer, if any, is right).
 *
 * A spec (one per JSONL line, or the elements of a JSON array) is either turn-based:
 *
 *   { "id": "refund-1",                                   optional: the row's uid (else FILE#ROW)
 *     "system": "You are a support agent.",               optional
 *     "server": "shop",                                   optional: the MCP server every call goes to
 *     "turns": [
 *       { "user": "Find Ann's last order.",
 *         "calls": [ { "id": "c1", "tool": "find_customer", "arguments": { "name": "Ann" }, "result": "C7" },
 *                    { "id": "c2", "tool": "get_orders", "arguments": { "customer_id": { "$ref": "c1" } } } ],
 *         "assistant": "Ann's last order is O3." },
 *       { "user": "Refund it.",
 *         "calls": [ { "tool": "refund", "arguments": { "order_id": { "$ref": "c2", "path": "0.id" } } } ] } ],
 *     "answer": "refunded",                               optional: string, number, or a list of accepted ones
 *     "answer_match": "normalized", "order": "subsequence" optional: as in the rule reward's ground truth
 *   }
 *
 * or message-based (`"messages"`: OpenAI chat messages: system, user, assistant with `tool_calls` whose
 * `function.arguments` is JSON text or an object, and `tool` messages answering a `tool_call_id`; the tool message's
 * content is that call's result).
 *
 * Dependencies: an argument `{ "$ref": "<call id>" }` stands for an earlier call's result, `"path": "a.0.b"` for a
 * part of it (a result that is JSON text is parsed first). A reference that resolves (the spec recorded the result)
 * becomes the concrete value in the ground truth; one that cannot (no result recorded) is left out of the expected
 * arguments (the reward then checks that the call was made with the other arguments) and counted in
 * `extra_info.unresolved_arguments`. A reference to an unknown or later call is an error.
 *
 * The compact prompt: the system text, then the first user message with the follow-up user messages appended
 * (`followUps: "append"`, blank line between) or dropped (`"drop"`): a spec whose later turns add requests keeps
 * them, so the sequence asked for is the sequence scored.
 */

import { Schema } from "effect"
import { DatasetError } from "../domain/Errors.ts"
import type { Message } from "../domain/Message.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type * as Rewards from "../env/Rewards.ts"
import { RuleGroundTruth } from "../env/Rewards.ts"

export interface Options {
  /** `data_source` of rows whose spec names none. */
  readonly dataSource: string
  /** `env_class` of the rows (the MCP tool env by default). */
  readonly envClass: string
  readonly followUps: "append" | "drop"
  /** Weight of `tool_sequence_match` (partial credit); the outcome gets 1 − it. */
  readonly sequenceWeight: number
  /** The server every call goes to when neither the spec nor the call names one. */
  readonly server?: string
}

export const defaultOptions: Options = {
  dataSource: "dependent_specs",
  envClass: "mcp_tool",
  followUps: "append",
  sequenceWeight: 0.2
}

interface Call {
  readonly id: string | undefined
  readonly tool: string
  readonly server: string | undefined
  readonly arguments: Readonly<Record<string, unknown>> | undefined
  readonly result: unknown
  readonly path: string // where the call is in the spec (for errors)
}

interface Parsed {
  readonly system: string | undefined
  readonly users: ReadonlyArray<string>
  readonly calls: ReadonlyArray<Call>
}

class SpecProblem {
  readonly path: string
  readonly detail: string
  constructor(path: string, detail: string) {
    this.path = path
    this.detail = detail
  }
}

const isObject = (v: unknown): v is Readonly<Record<string, unknown>> =>
  typeof v === "object" && v !== null && !Array.isArray(v)

const text = (v: unknown, path: string): string => {
  if (typeof v !== "string") throw new SpecProblem(path, `must be a string, got ${v === null ? "null" : typeof v}`)
  return v
}

const optionalText = (v: unknown, path: string): string | undefined => (v === undefined ? undefined : text(v, path))

const argumentsOf = (v: unknown, path: string): Readonly<Record<string, unknown>> | undefined => {
  if (v === undefined) return undefined
  let value: unknown = v
  if (typeof v === "string") {
    try {
      value = v.trim() === "" ? {} : (JSON.parse(v) as unknown)
    } catch (e) {
      throw new SpecProblem(path, `not JSON: ${e instanceof Error ? e.message : String(e)}`)
    }
  }
  if (!isObject(value)) throw new SpecProblem(path, "must be a JSON object of arguments")
  return value
}

const turnBased = (spec: Readonly<Record<string, unknown>>): Parsed => {
  const turns = spec["turns"]
  if (!Array.isArray(turns) || turns.length === 0) throw new SpecProblem("turns", "must be a non-empty array")
  const users: Array<string> = []
  const calls: Array<Call> = []
  turns.forEach((turn, t) => {
    const at = `turns[${t}]`
    if (!isObject(turn)) throw new SpecProblem(at, "must be an object { user, calls?, assistant? }")
    users.push(text(turn["user"], `${at}.user`))
    const list = turn["calls"] ?? []
    if (!Array.isArray(list)) throw new SpecProblem(`${at}.calls`, "must be an array")
    list.forEach((call, c) => {
      const where = `${at}.calls[${c}]`
      if (!isObject(call)) throw new SpecProblem(where, "must be an object { tool, arguments?, id?, result? }")
      calls.push({
        id: optionalText(call["id"], `${where}.id`),
        tool: text(call["tool"] ?? call["name"], `${where}.tool`),
        server: optionalText(call["server"], `${where}.server`),
        arguments: argumentsOf(call["arguments"], `${where}.arguments`),
        result: call["result"],
        path: where
      })
    })
  })
  return { system: optionalText(spec["system"], "system"), users, calls }
}

const messageBased = (spec: Readonly<Record<string, unknown>>): Parsed => {
  const messages = spec["messages"]
  if (!Array.isArray(messages) || messages.length === 0) throw new SpecProblem("messages", "must be a non-empty array")
  let system = optionalText(spec["system"], "system")
  const users: Array<string> = []
  const calls: Array<Call> = []
  const results = new Map<string, unknown>()
  messages.forEach((m, i) => {
    const at = `messages[${i}]`
    if (!isObject(m)) throw new SpecProblem(at, "must be a chat message object")
    const role = m["role"]
    if (role === "system") system = system === undefined ? text(m["content"], `${at}.content`) : system
    else if (role === "user") users.push(text(m["content"], `${at}.content`))
    else if (role === "tool") {
      const id = m["tool_call_id"]
      if (typeof id === "string") results.set(id, m["content"])
    } else if (role === "assistant") {
      const toolCalls = m["tool_calls"] ?? []
      if (!Array.isArray(toolCalls)) throw new SpecProblem(`${at}.tool_calls`, "must be an array")
      toolCalls.forEach((tc, c) => {
        const where = `${at}.tool_calls[${c}]`
        if (!isObject(tc)) throw new SpecProblem(where, "must be an object { id, function: { name, arguments } }")
        const fn = isObject(tc["function"]) ? tc["function"] : tc
        calls.push({
          id: optionalText(tc["id"], `${where}.id`),
          tool: text(fn["name"], `${where}.function.name`),
          server: optionalText(tc["server"], `${where}.server`),
          arguments: argumentsOf(fn["arguments"], `${where}.function.arguments`),
          result: undefined,
          path: where
        })
      })
    } else throw new SpecProblem(`${at}.role`, `unknown role ${JSON.stringify(role)}: system, user, assistant or tool`)
  })
  if (users.length === 0) throw new SpecProblem("messages", "has no user message")
  return {
    system,
    users,
    calls: calls.map((c) => (c.id !== undefined && results.has(c.id) ? { ...c, result: results.get(c.id) } : c))
  }
}

const unresolved = Symbol("unresolved")

/** `value` with `path` (`a.0.b`) followed; JSON text is parsed on the way. */
const follow = (value: unknown, path: string | undefined): unknown => {
  let node = value
  for (const part of path === undefined || path === "" ? [] : path.split(".")) {
    if (typeof node === "string") {
      try {
        node = JSON.parse(node) as unknown
      } catch {
        return unresolved
      }
    }
    if (Array.isArray(node) && /^\d+$/.test(part)) node = node[Number(part)]
    else if (isObject(node) && part in node) node = node[part]
    else return unresolved
  }
  return node === undefined ? unresolved : node
}

/** Arguments with `$ref`s replaced by earlier results; an unresolvable one is dropped and counted. */
const resolve = (
  value: unknown,
  at: string,
  earlier: ReadonlyMap<string, Call>,
  later: ReadonlySet<string>,
  count: { unresolved: number }
): unknown => {
  if (Array.isArray(value)) return value.map((v, i) => resolve(v, `${at}[${i}]`, earlier, later, count))
  if (!isObject(value)) return value
  if (typeof value["$ref"] === "string") {
    const ref = value["$ref"]
    const target = earlier.get(ref)
    if (target === undefined) {
      throw new SpecProblem(
        `${at}.$ref`,
        later.has(ref)
          ? `"${ref}" is a later call: a call can only use results of calls before it`
          : `"${ref}" names no call (give the call an "id")`
      )
    }
    const path = value["path"]
    if (path !== undefined && typeof path !== "string") throw new SpecProblem(`${at}.path`, "must be a string")
    if (target.result === undefined) {
      count.unresolved++
      return unresolved
    }
    const found = follow(target.result, path)
    if (found === unresolved) {
      throw new SpecProblem(`${at}.path`, `"${path}" is not in the result of "${ref}"`)
    }
    return found
  }
  const out: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(value)) {
    const resolved = resolve(v, `${at}.${k}`, earlier, later, count)
    if (resolved !== unresolved) out[k] = resolved
  }
  return out
}

/** One spec as a row, or the problem (file, row, key) that stops it. */
export const convert = (
  raw: unknown,
  file: string,
  index: number,
  baseName: string,
  options: Options = defaultOptions
): PromptRow | DatasetError => {
  const problem = (path: string, detail: string) => new DatasetError({ file, row: index, path, detail })
  if (!isObject(raw)) return problem("", "a spec must be a JSON object with turns or messages")
  try {
    const spec = raw
    if (spec["turns"] !== undefined && spec["messages"] !== undefined) {
      throw new SpecProblem("turns", "give turns or messages, not both")
    }
    if (spec["turns"] === undefined && spec["messages"] === undefined) {
      throw new SpecProblem("turns", "missing: a spec needs turns (or messages)")
    }
    const parsed = spec["turns"] !== undefined ? turnBased(spec) : messageBased(spec)
    const specServer = optionalText(spec["server"], "server") ?? options.server
    const ids = new Set<string>()
    for (const call of parsed.calls) {
      if (call.id === undefined) continue
      if (ids.has(call.id)) throw new SpecProblem(`${call.path}.id`, `"${call.id}" is used by an earlier call`)
      ids.add(call.id)
    }
    const earlier = new Map<string, Call>()
    const count = { unresolved: 0 }
    const sequence = parsed.calls.map((call) => {
      const later = new Set([...ids].filter((id) => !earlier.has(id)))
      const args =
        call.arguments === undefined
          ? undefined
          : resolve(call.arguments, `${call.path}.arguments`, earlier, later, count)
      if (call.id !== undefined) earlier.set(call.id, call)
      const server = call.server ?? specServer
      return {
        tool: call.tool,
        ...(server === undefined ? {} : { server }),
        ...(args === undefined ? {} : { arguments: args as Record<string, unknown> })
      }
    })
    if (sequence.length === 0)
      throw new SpecProblem(spec["turns"] !== undefined ? "turns" : "messages", "has no tool call")
    const [first, ...followUps] = parsed.users
    const userText =
      options.followUps === "append" && followUps.length > 0 ? [first!, ...followUps].join("\n\n") : first!
    const prompt: Array<Message> = [
      ...(parsed.system === undefined || parsed.system === ""
        ? []
        : [{ role: "system" as const, content: parsed.system }]),
      { role: "user", content: userText }
    ]
    const w = options.sequenceWeight
    const groundTruth: typeof Rewards.RuleGroundTruth.Encoded = {
      tool_sequence: sequence,
      order: (spec["order"] as "strict" | "subsequence" | "any" | undefined) ?? "subsequence",
      ...(spec["answer"] === undefined ? {} : { answer: spec["answer"] as string }),
      ...(spec["answer_match"] === undefined ? {} : { answer_match: spec["answer_match"] as "normalized" }),
      weights: { answer: 1 - w, tool_sequence: w }
    }
    // what the reward will decode: a spec the rule reward cannot score is an error here, not in the middle of a run
    const decoded = Schema.decodeUnknownExit(RuleGroundTruth)(groundTruth, { errors: "first" })
    if (decoded._tag === "Failure") {
      const message = String(decoded.cause).split("\n")[0] ?? "invalid"
      throw new SpecProblem("", `the ground truth it gives is not a valid rule ground truth: ${message}`)
    }
    const id = optionalText(spec["id"], "id")
    return {
      uid: id ?? `${baseName}#${index}`,
      data_source: optionalText(spec["data_source"], "data_source") ?? options.dataSource,
      env_class: options.envClass,
      prompt,
      reward_spec: { method: "rule", ground_truth: groundTruth },
      extra_info: {
        ...(id === undefined ? {} : { spec_id: id }),
        ...(specServer === undefined ? {} : { server: specServer }),
        turns: parsed.users.length,
        calls: sequence.length,
        unresolved_arguments: count.unresolved,
        max_turns: sequence.length + 2
      }
    }
  } catch (e) {
    if (e instanceof SpecProblem) return problem(e.path, e.detail)
    throw e
  }
}
