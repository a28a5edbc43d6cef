/**
 * The bundled toolbox's tools as plain functions (src/toolbox/Toolbox.ts serves them over MCP): each tool's name,
 * description and parameters as its MCP server lists them, and what a call answers. Outputs are short plain text,
 * because tiny policies read them; a tool that cannot answer (division by zero, an unknown customer) answers a
 * one-line reason as an error. Imports nothing but the record store, so an agent program can use the tools directly at
 * no start-up cost (examples/agents/ai-sdk-agent.mjs).
 */
import * as Records from "./Records.ts"

/** A tool's own refusal ("division by zero"): becomes an `isError` result. */
export class ToolboxError extends Error {}

/** 12 significant digits: 0.1 + 0.2 prints as 0.3, not 0.30000000000000004. */
export const formatNumber = (x: number): string => String(Number(x.toPrecision(12)))

// ---- arithmetic -------------------------------------------------------------------------------------------------

export const divide = (a: number, b: number): number => {
  if (b === 0) throw new ToolboxError("division by zero")
  return a / b
}

// ---- units ------------------------------------------------------------------------------------------------------

/** Factor to the base unit of each dimension (m, kg, s); temperature is affine and handled apart. */
const linearUnits: Record<string, { readonly dim: string; readonly factor: number }> = {
  mm: { dim: "length", factor: 0.001 },
  cm: { dim: "length", factor: 0.01 },
  m: { dim: "length", factor: 1 },
  km: { dim: "length", factor: 1000 },
  in: { dim: "length", factor: 0.0254 },
  ft: { dim: "length", factor: 0.3048 },
  yd: { dim: "length", factor: 0.9144 },
  mi: { dim: "length", factor: 1609.344 },
  g: { dim: "mass", factor: 0.001 },
  kg: { dim: "mass", factor: 1 },
  oz: { dim: "mass", factor: 0.028349523125 },
  lb: { dim: "mass", factor: 0.45359237 },
  s: { dim: "time", factor: 1 },
  min: { dim: "time", factor: 60 },
  h: { dim: "time", factor: 3600 },
  day: { dim: "time", factor: 86400 }
}
const toKelvin: Record<string, (x: number) => number> = {
  c: (x) => x + 273.15,
  f: (x) => (x - 32) * (5 / 9) + 273.15,
  k: (x) => x
}
const fromKelvin: Record<string, (x: number) => number> = {
  c: (x) => x - 273.15,
  f: (x) => (x - 273.15) * (9 / 5) + 32,
  k: (x) => x
}

export const convertUnits = (value: number, from: string, to: string): number => {
  const f = from.trim().toLowerCase()
  const t = to.trim().toLowerCase()
  const kf = toKelvin[f]
  const kt = fromKelvin[t]
  if (kf !== undefined && kt !== undefined) return kt(kf(value))
  const uf = linearUnits[f]
  const ut = linearUnits[t]
  if (uf === undefined) throw new ToolboxError(`unknown unit: ${from}`)
  if (ut === undefined) throw new ToolboxError(`unknown unit: ${to}`)
  if (uf.dim !== ut.dim) throw new ToolboxError(`cannot convert ${uf.dim} to ${ut.dim}`)
  return (value * uf.factor) / ut.factor
}

// ---- dates (UTC calendar days, ISO YYYY-MM-DD) -------------------------------------------------------------------

const dayMs = 86_400_000
const parseDate = (text: string): number => {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(text.trim())
  const ms = m === null ? Number.NaN : Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]))
  if (m === null || Number.isNaN(ms) || new Date(ms).getUTCDate() !== Number(m[3])) {
    throw new ToolboxError(`bad date: ${text} (want YYYY-MM-DD)`)
  }
  return ms
}
const formatDate = (ms: number): string => new Date(ms).toISOString().slice(0, 10)
const weekdays = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]

export const dateAdd = (date: string, days: number): string => formatDate(parseDate(date) + Math.trunc(days) * dayMs)
export const dateDiff = (start: string, end: string): number => Math.round((parseDate(end) - parseDate(start)) / dayMs)
export const dayOfWeek = (date: string): string => weekdays[new Date(parseDate(date)).getUTCDay()]!

// ---- records ----------------------------------------------------------------------------------------------------

export const findCustomer = (name: string): string => {
  const c = Records.findCustomer(name)
  if (c === undefined) throw new ToolboxError(`no customer named ${name}`)
  return c.id
}
export const getOrders = (customerId: string): string => {
  if (!Records.customers.some((c) => c.id === customerId.trim().toUpperCase())) {
    throw new ToolboxError(`no customer with id ${customerId}`)
  }
  return Records.ordersOf(customerId)
    .map((o) => o.id)
    .join(",")
}
export const getOrder = (orderId: string): string => {
  const o = Records.findOrder(orderId)
  if (o === undefined) throw new ToolboxError(`no order with id ${orderId}`)
  return JSON.stringify({ item: o.item, price: o.price, qty: o.qty })
}

// ---- the table --------------------------------------------------------------------------------------------------

/** A parameter: its JSON type, and the description the MCP server lists (numbers: "a number" unless said). */
export interface Param {
  readonly type: "number" | "string"
  readonly description?: string
}

export interface Tool {
  readonly name: string
  readonly description: string
  readonly params: Readonly<Record<string, Param>>
  /** The answer to arguments of the parameters' types; throws ToolboxError when the tool cannot answer. */
  readonly run: (args: Readonly<Record<string, never>>) => string | number
}

const num: Param = { type: "number", description: "a number" }
const str: Param = { type: "string" }

export const tools: ReadonlyArray<Tool> = [
  { name: "add", description: "a + b", params: { a: num, b: num }, run: ({ a, b }) => a + b },
  { name: "subtract", description: "a - b", params: { a: num, b: num }, run: ({ a, b }) => a - b },
  { name: "multiply", description: "a * b", params: { a: num, b: num }, run: ({ a, b }) => a * b },
  {
    name: "divide",
    description: "a / b (error if b is 0)",
    params: { a: num, b: num },
    run: ({ a, b }) => divide(a, b)
  },
  {
    name: "find_customer",
    description: "customer id for a full name",
    params: { name: str },
    run: ({ name }) => findCustomer(name)
  },
  {
    name: "get_orders",
    description: "comma-separated order ids of a customer",
    params: { customer_id: str },
    run: ({ customer_id }) => getOrders(customer_id)
  },
  {
    name: "get_order",
    description: "an order as JSON {item, price, qty}",
    params: { order_id: str },
    run: ({ order_id }) => getOrder(order_id)
  },
  {
    name: "convert_units",
    description: "convert value between units (mm cm m km in ft yd mi, g kg oz lb, s min h day, c f k)",
    params: { value: num, from: str, to: str },
    run: ({ value, from, to }) => convertUnits(value, from, to)
  },
  {
    name: "date_add",
    description: "date (YYYY-MM-DD) plus days",
    params: { date: str, days: { type: "number", description: "whole days" } },
    run: ({ date, days }) => dateAdd(date, days)
  },
  {
    name: "date_diff",
    description: "days from start to end (YYYY-MM-DD)",
    params: { start: str, end: str },
    run: ({ start, end }) => dateDiff(start, end)
  },
  {
    name: "day_of_week",
    description: "weekday name of a date (YYYY-MM-DD)",
    params: { date: str },
    run: ({ date }) => dayOfWeek(date)
  }
]

/** A tool's parameters as a JSON schema: an object of them, all required. */
export const inputSchema = (tool: Tool) => ({
  type: "object",
  properties: Object.fromEntries(
    Object.entries(tool.params).map(([key, p]) => [
      key,
      p.description === undefined ? { type: p.type } : { type: p.type, description: p.description }
    ])
  ),
  required: Object.keys(tool.params)
})

/**
 * What a call answers, as the MCP server answers it: the text (numbers with 12 significant digits), and whether it is
 * the tool's refusal. An unknown tool or arguments of the wrong types are refusals too.
 */
export const call = (name: string, args: Readonly<Record<string, unknown>>): { text: string; isError: boolean } => {
  const tool = tools.find((t) => t.name === name)
  if (tool === undefined) return { text: `unknown tool ${name}`, isError: true }
  for (const [key, p] of Object.entries(tool.params)) {
    if (typeof args[key] !== p.type) return { text: `${key} must be a ${p.type}`, isError: true }
  }
  try {
    const value = tool.run(args as Readonly<Record<string, never>>)
    return { text: typeof value === "number" ? formatNumber(value) : value, isError: false }
  } catch (error) {
    if (error instanceof ToolboxError) return { text: error.message, isError: true }
    throw error
  }
}
