/**
 * Multi-step tasks for the bundled toolbox MCP server (`src/toolbox/`), with SFT demonstrations, for the quickstart
 * whose tiny byte-level policy must visibly learn. Every task chains at least two DEPENDENT calls (each call after
 * the first uses what an earlier one returned) and its answer is the text of the last call's result, so a
 * successful episode always ends by copying the last tool output into `<answer>…</answer>`.
 *
 * The generator plans a task by executing it: each call runs through `execute`, which calls the toolbox's own
 * functions and formats numbers as its server does, and the next call's arguments are read from that output. The
 * ground truth therefore is the toolbox's behaviour, not a second implementation of it (the tests re-run every call
 * against the real server over MCP and compare the text byte for byte).
 *
 * Families (`extra_info.family`), calls per task, and how many distinct tasks each can produce:
 * - `arith_chain`     "Compute ((3 + 4) * 5) - 2."      2..maxChain calls: add/subtract/multiply/divide on results
 * - `unit_sum`        "3 ft + 7 in = ? in"                convert_units → add/subtract
 * - `unit_scale`      "4 x 3 kg = ? g"                    multiply → convert_units
 * - `date_weekday`    "Weekday of 2025-03-10 + 45 days?"  date_add → day_of_week
 * - `date_span`       "Hours from 2025-01-03 to 2025-01-20?"  date_diff → convert_units(day → h|min)
 * - `order_total`     "Total of order O1007 + 12 shipping?"  get_order → multiply(price, qty) [→ add/subtract]
 * - `customer_orders` "Order ids of Carol Evans?"         find_customer → get_orders (6 distinct tasks)
 * - `customer_spend`  "Cost of Carol Evans's first order?"  find_customer → get_orders → get_order → multiply
 *                                                         (12 distinct prompts)
 * The record families are small because the toolbox's record store is (6 customers, 10 orders): their tasks repeat
 * within and across splits. Prompts of the other families are unique across train and val.
 *
 * Reward (`weights`): R = 0.8 · outcome + 0.2 · tool_sequence_match. `outcome` needs the right answer AND every
 * expected call (so an answer guessed or memorised without the calls earns 0); the sequence term pays 0.2 per
 * fraction of the expected calls made in order (right first of two calls: 0.1), so success is exactly 1.
 */
import type { Message } from "../domain/Message.ts"
import type { PromptRow } from "../domain/PromptRow.ts"
import type { ToolCallRecord } from "../domain/ToolCall.ts"
import type * as Rewards from "../env/Rewards.ts"
import * as ToolCallParser from "../env/ToolCallParser.ts"
import * as Prng from "../model/Prng.ts"
import * as Records from "../toolbox/Records.ts"
import * as Tools from "../toolbox/Tools.ts"

export const families = [
  "arith_chain",
  "unit_sum",
  "unit_scale",
  "date_weekday",
  "date_span",
  "order_total",
  "customer_orders",
  "customer_spend"
] as const
export type Family = (typeof families)[number]

export const isFamily = (name: string): name is Family => (families as ReadonlyArray<string>).includes(name)

/** Difficulty knobs. */
export interface Knobs {
  /** Largest operand drawn for arithmetic, quantities, shipping, day offsets (÷ 5 for dates' scale). */
  readonly maxOperand: number
  /** Most calls in an `arith_chain` task (at least 2). */
  readonly maxChain: number
}

export const defaultKnobs: Knobs = { maxOperand: 20, maxChain: 3 }

export interface GenerateOptions extends Partial<Knobs> {
  readonly seed: number
  readonly train: number
  readonly val: number
  /** The families to draw from, in turn (row i gets `families[i % n]`). Default: all. */
  readonly families?: ReadonlyArray<Family>
}

/** The reward weights every row carries (see the module header). */
export const weights = { answer: 0.8, tool_sequence: 0.2 } as const

/** One executed step of a task: the call and the text the toolbox answered. */
export interface Step {
  readonly call: ToolCallParser.Call
  readonly output: string
}

export interface Task {
  readonly family: Family
  readonly prompt: string
  readonly steps: ReadonlyArray<Step>
  /** The last step's output: a number for numeric answers. */
  readonly answer: string | number
  readonly answerMatch: "normalized" | "numeric"
}

export type Split = "train" | "val"

/** A demonstration for SFT: the whole successful conversation (no system message: the env adds it). */
export interface Demo {
  readonly messages: ReadonlyArray<Message>
  readonly uid: string
  readonly family: Family
}

export interface Dataset {
  readonly train: ReadonlyArray<PromptRow>
  readonly val: ReadonlyArray<PromptRow>
  readonly demos: ReadonlyArray<Demo>
  /** Per split and family: rows whose prompt repeats an earlier row's (the family ran out of distinct tasks). */
  readonly repeats: Readonly<Record<Split, Readonly<Partial<Record<Family, number>>>>>
}

/** The tool-call text format of demonstrations: what McpToolEnv's system prompt asks for (format hermes or auto). */
export const callFormat: ToolCallParser.WriteFormat = "hermes"

// ---------------------------------------------------------------------------------------------------------------
// Executing calls with the toolbox's own functions.

const num = (args: Readonly<Record<string, unknown>>, key: string): number => {
  const value = args[key]
  if (typeof value !== "number") throw new Error(`ToolboxTasks.execute: ${key} must be a number, got ${String(value)}`)
  return value
}
const str = (args: Readonly<Record<string, unknown>>, key: string): string => {
  const value = args[key]
  if (typeof value !== "string") throw new Error(`ToolboxTasks.execute: ${key} must be a string, got ${String(value)}`)
  return value
}

/**
 * The text the toolbox server answers `call` with (numbers formatted as it formats them). Throws on a call the
 * toolbox would reject: the generator never plans one, so a throw is a bug.
 */
export const execute = (call: ToolCallParser.Call): string => {
  const a = call.arguments
  const n = Tools.formatNumber
  switch (call.name) {
    case "add":
      return n(num(a, "a") + num(a, "b"))
    case "subtract":
      return n(num(a, "a") - num(a, "b"))
    case "multiply":
      return n(num(a, "a") * num(a, "b"))
    case "divide":
      return n(Tools.divide(num(a, "a"), num(a, "b")))
    case "convert_units":
      return n(Tools.convertUnits(num(a, "value"), str(a, "from"), str(a, "to")))
    case "date_add":
      return Tools.dateAdd(str(a, "date"), num(a, "days"))
    case "date_diff":
      return n(Tools.dateDiff(str(a, "start"), str(a, "end")))
    case "day_of_week":
      return Tools.dayOfWeek(str(a, "date"))
    case "find_customer":
      return Tools.findCustomer(str(a, "name"))
    case "get_orders":
      return Tools.getOrders(str(a, "customer_id"))
    case "get_order":
      return Tools.getOrder(str(a, "order_id"))
    default:
      throw new Error(`ToolboxTasks.execute: unknown tool ${call.name}`)
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Random draws.

interface Draw {
  /** Uniform integer in [lo, hi]. */
  readonly int: (lo: number, hi: number) => number
  readonly pick: <A>(items: ReadonlyArray<A>) => A
}

const draws = (prng: Prng.Prng): Draw => {
  const int = (lo: number, hi: number) => lo + Math.floor(prng.next() * (hi - lo + 1))
  return { int, pick: (items) => items[int(0, items.length - 1)]! }
}

/** Builds a task step by step: `call` runs the call now and returns its output for the next call to use. */
const planner = () => {
  const steps: Array<Step> = []
  const call = (name: string, args: Record<string, unknown>): string => {
    const output = execute({ name, arguments: args })
    steps.push({ call: { name, arguments: args }, output })
    return output
  }
  const finish = (family: Family, prompt: string, answerMatch: Task["answerMatch"]): Task => {
    const last = steps.at(-1)!.output
    return { family, prompt, steps, answer: answerMatch === "numeric" ? Number(last) : last, answerMatch }
  }
  return { call, finish }
}

// ---------------------------------------------------------------------------------------------------------------
// Families.

const ops = [
  { tool: "add", symbol: "+" },
  { tool: "subtract", symbol: "-" },
  { tool: "multiply", symbol: "*" },
  { tool: "divide", symbol: "/" }
] as const

/** Big unit, small unit: whole-number factors, so outputs stay short. */
const unitPairs = [
  ["km", "m"],
  ["m", "cm"],
  ["cm", "mm"],
  ["ft", "in"],
  ["yd", "ft"],
  ["kg", "g"],
  ["lb", "oz"],
  ["h", "min"],
  ["min", "s"],
  ["day", "h"]
] as const

const arithChain = (d: Draw, k: Knobs): Task => {
  const p = planner()
  const length = d.int(2, Math.max(2, k.maxChain))
  let value = d.int(1, k.maxOperand)
  let expression = String(value)
  for (let i = 0; i < length; i++) {
    let op = d.pick(ops)
    const divisors = Array.from({ length: k.maxOperand - 1 }, (_, j) => j + 2).filter((x) => value % x === 0)
    if (op.tool === "divide" && divisors.length === 0) op = ops[0]
    const operand =
      op.tool === "divide"
        ? d.pick(divisors)
        : op.tool === "multiply"
          ? d.int(2, Math.min(9, k.maxOperand))
          : d.int(1, k.maxOperand)
    if (op.tool === "subtract" && operand >= value) op = ops[0] // keep results positive
    value = Number(p.call(op.tool, { a: value, b: operand }))
    expression = i === 0 ? `${expression} ${op.symbol} ${operand}` : `(${expression}) ${op.symbol} ${operand}`
  }
  return p.finish("arith_chain", `Compute ${expression}.`, "numeric")
}

const unitSum = (d: Draw, k: Knobs): Task => {
  const p = planner()
  const [big, small] = d.pick(unitPairs)
  const x = d.int(1, 9)
  const y = d.int(1, k.maxOperand)
  const converted = Number(p.call("convert_units", { value: x, from: big, to: small }))
  const subtract = y < converted && d.int(0, 1) === 1
  p.call(subtract ? "subtract" : "add", { a: converted, b: y })
  return p.finish("unit_sum", `${x} ${big} ${subtract ? "-" : "+"} ${y} ${small} = ? ${small}`, "numeric")
}

const unitScale = (d: Draw, k: Knobs): Task => {
  const p = planner()
  const [big, small] = d.pick(unitPairs)
  const count = d.int(2, 9)
  const size = d.int(1, k.maxOperand)
  const total = Number(p.call("multiply", { a: count, b: size }))
  p.call("convert_units", { value: total, from: big, to: small })
  return p.finish("unit_scale", `${count} x ${size} ${big} = ? ${small}`, "numeric")
}

const dayMs = 86_400_000
const firstDay = Date.UTC(2020, 0, 1)
const lastDay = Date.UTC(2029, 11, 31)
const randomDate = (d: Draw): string =>
  new Date(firstDay + d.int(0, (lastDay - firstDay) / dayMs) * dayMs).toISOString().slice(0, 10)

const dateWeekday = (d: Draw, k: Knobs): Task => {
  const p = planner()
  const start = randomDate(d)
  const days = d.int(1, 5 * k.maxOperand)
  const date = p.call("date_add", { date: start, days })
  p.call("day_of_week", { date })
  return p.finish("date_weekday", `Weekday of ${start} + ${days} days?`, "normalized")
}

const dateSpan = (d: Draw, k: Knobs): Task => {
  const p = planner()
  const start = randomDate(d)
  const end = Tools.dateAdd(start, d.int(1, 2 * k.maxOperand))
  const unit = d.pick([
    ["h", "Hours"],
    ["min", "Minutes"]
  ] as const)
  const days = Number(p.call("date_diff", { start, end }))
  p.call("convert_units", { value: days, from: "day", to: unit[0] })
  return p.finish("date_span", `${unit[1]} from ${start} to ${end}?`, "numeric")
}

const orderFields = (json: string): { readonly price: number; readonly qty: number } => JSON.parse(json)

const orderTotal = (d: Draw, k: Knobs): Task => {
  const p = planner()
  const order = d.pick(Records.orders)
  const { price, qty } = orderFields(p.call("get_order", { order_id: order.id }))
  const total = Number(p.call("multiply", { a: price, b: qty }))
  const variant = d.int(0, 2) // plain, + shipping, - discount
  if (variant === 0) return p.finish("order_total", `Total of order ${order.id}?`, "numeric")
  const extra = d.int(1, Math.min(k.maxOperand, total - 1))
  p.call(variant === 1 ? "add" : "subtract", { a: total, b: extra })
  const what = variant === 1 ? `+ ${extra} shipping` : `- ${extra} discount`
  return p.finish("order_total", `Total of order ${order.id} ${what}?`, "numeric")
}

const customerOrders = (d: Draw): Task => {
  const p = planner()
  const customer = d.pick(Records.customers)
  const id = p.call("find_customer", { name: customer.name })
  p.call("get_orders", { customer_id: id })
  return p.finish("customer_orders", `Order ids of ${customer.name}?`, "normalized")
}

const customerSpend = (d: Draw): Task => {
  const p = planner()
  const customer = d.pick(Records.customers)
  const which = d.pick(["first", "last"] as const)
  const id = p.call("find_customer", { name: customer.name })
  const ids = p.call("get_orders", { customer_id: id }).split(",")
  const { price, qty } = orderFields(p.call("get_order", { order_id: which === "first" ? ids[0]! : ids.at(-1)! }))
  p.call("multiply", { a: price, b: qty })
  return p.finish("customer_spend", `Cost of ${customer.name}'s ${which} order?`, "numeric")
}

const builders: Record<Family, (d: Draw, k: Knobs) => Task> = {
  arith_chain: arithChain,
  unit_sum: unitSum,
  unit_scale: unitScale,
  date_weekday: dateWeekday,
  date_span: dateSpan,
  order_total: orderTotal,
  customer_orders: customerOrders,
  customer_spend: customerSpend
}

/** One task of `family`, drawn from `prng`. */
export const task = (family: Family, prng: Prng.Prng, knobs: Knobs = defaultKnobs): Task =>
  builders[family](draws(prng), knobs)

// ---------------------------------------------------------------------------------------------------------------
// Rows and demonstrations.

export const uid = (split: Split, index: number): string => `toolbox-${split}-${String(index).padStart(5, "0")}`

/** The reward spec: every expected call with all its arguments, in order; the answer; the weights. */
export const groundTruth = (t: Task): typeof Rewards.RuleGroundTruth.Encoded => ({
  tool_sequence: t.steps.map((s) => ({ tool: s.call.name, arguments: s.call.arguments })),
  order: "subsequence",
  answer: t.answer,
  answer_match: t.answerMatch, // numbers within the default tolerance (1e-6)
  weights
  // no per-turn or format reward: partial credit comes from the sequence term only
})

/** A SkyRL row. `max_turns` (calls + 1 answer turn + 1 spare) caps rollouts of a tiny policy that never answers. */
export const toRow = (t: Task, split: Split, index: number): PromptRow => ({
  uid: uid(split, index),
  data_source: "toolbox",
  env_class: "mcp_tool",
  prompt: [{ role: "user", content: t.prompt }],
  reward_spec: { method: "rule", ground_truth: groundTruth(t) },
  extra_info: { family: t.family, index, split, calls: t.steps.length, max_turns: t.steps.length + 2 }
})

export const answerText = (answer: string | number): string => `<answer>${answer}</answer>`

/** The successful conversation, shaped as McpToolEnv would produce it (one call per turn, ids `call_0`). */
export const toDemo = (t: Task, rowUid: string): Demo => ({
  messages: [
    { role: "user", content: t.prompt },
    ...t.steps.flatMap(
      (s): Array<Message> => [
        { role: "assistant", content: ToolCallParser.toText(s.call, callFormat) },
        { role: "tool", content: s.output, tool_call_id: "call_0", name: s.call.name }
      ]
    ),
    { role: "assistant", content: answerText(t.answer) }
  ],
  uid: rowUid,
  family: t.family
})

/** The records McpToolEnv would log for a demonstration's calls (for scoring it with `Rewards`). */
export const records = (t: Task): ReadonlyArray<ToolCallRecord> =>
  t.steps.map((s) => ({
    id: "call_0",
    server: "toolbox",
    tool: s.call.name,
    arguments: s.call.arguments,
    result: s.output,
    isError: false,
    ms: 0
  }))

// ---------------------------------------------------------------------------------------------------------------
// Datasets.

/** How many draws may look for a prompt not seen yet before a family is taken to be out of distinct tasks. */
const maxTries = 50

/** Train and val streams are independent (val does not shift when `train` changes, apart from de-duplication). */
const streamSeed = (seed: number, split: Split): number => (split === "train" ? seed : (seed ^ 0x5eed_1234) >>> 0)

export interface Generated {
  readonly tasks: ReadonlyArray<Task>
  readonly rows: ReadonlyArray<PromptRow>
  readonly repeats: Partial<Record<Family, number>>
}

const generateSplit = (
  split: Split,
  count: number,
  seed: number,
  chosen: ReadonlyArray<Family>,
  knobs: Knobs,
  seen: Set<string>
): Generated => {
  const prng = Prng.make(streamSeed(seed, split))
  const tasks: Array<Task> = []
  const repeats: Partial<Record<Family, number>> = {}
  for (let index = 0; index < count; index++) {
    const family = chosen[index % chosen.length]!
    let t = task(family, prng, knobs)
    for (let tries = 1; seen.has(t.prompt) && tries < maxTries; tries++) t = task(family, prng, knobs)
    if (seen.has(t.prompt)) repeats[family] = (repeats[family] ?? 0) + 1
    seen.add(t.prompt)
    tasks.push(t)
  }
  return { tasks, rows: tasks.map((t, index) => toRow(t, split, index)), repeats }
}

/** Train rows, val rows (prompts not in train where the family allows) and demonstrations of the train tasks. */
export const generate = (options: GenerateOptions): Dataset => {
  const knobs: Knobs = {
    maxOperand: options.maxOperand ?? defaultKnobs.maxOperand,
    maxChain: options.maxChain ?? defaultKnobs.maxChain
  }
  if (!Number.isInteger(knobs.maxOperand) || knobs.maxOperand < 2) throw new Error("maxOperand must be an integer ≥ 2")
  if (!Number.isInteger(knobs.maxChain) || knobs.maxChain < 2) throw new Error("maxChain must be an integer ≥ 2")
  const chosen = options.families ?? families
  if (chosen.length === 0) throw new Error("no families chosen")
  const seen = new Set<string>()
  const train = generateSplit("train", options.train, options.seed, chosen, knobs, seen)
  const val = generateSplit("val", options.val, options.seed, chosen, knobs, seen)
  return {
    train: train.rows,
    val: val.rows,
    demos: train.tasks.map((t, i) => toDemo(t, train.rows[i]!.uid!)),
    repeats: { train: train.repeats, val: val.repeats }
  }
}

/** The text of a row's last user message: how tasks are compared across files. */
export const promptText = (row: PromptRow): string => row.prompt.findLast((m) => m.role === "user")?.content ?? ""

/**
 * Drop the train rows (and their demonstrations) whose prompt is in `prompts`, e.g. another file's held-out tasks, so
 * that a larger SFT set can be generated without training on them. It filters after drawing, so the rows that stay
 * are byte-identical to those of the same seed without `exclude`. Returns how many rows were dropped.
 */
export const exclude = (
  data: Dataset,
  prompts: ReadonlySet<string>
): { readonly data: Dataset; readonly dropped: number } => {
  const keep = data.train.map((row) => !prompts.has(promptText(row)))
  return {
    data: { ...data, train: data.train.filter((_, i) => keep[i]), demos: data.demos.filter((_, i) => keep[i]) },
    dropped: keep.filter((k) => !k).length
  }
}

/** One JSON object per line, newline-terminated: the bytes depend only on the rows. */
export const toJsonl = (rows: ReadonlyArray<unknown>): string => rows.map((r) => `${JSON.stringify(r)}\n`).join("")

/** Rows per family, in family order. */
export const countByFamily = (
  rows: ReadonlyArray<{ readonly extra_info?: Readonly<Record<string, unknown>> } | Demo>
): Partial<Record<Family, number>> => {
  const counts: Partial<Record<Family, number>> = {}
  for (const family of families) {
    const n = rows.filter((r) => ("family" in r ? r.family : r.extra_info?.["family"]) === family).length
    if (n > 0) counts[family] = n
  }
  return counts
}
