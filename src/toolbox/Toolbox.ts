/**
 * The bundled toolbox MCP server: deterministic tools that multi-step tasks need (arithmetic, a record store with
 * chained lookups, unit conversion, date arithmetic). Outputs are short plain text, because tiny policies read them.
 * A tool that cannot answer returns an MCP `isError` result with a one-line reason ("division by zero"), never a
 * protocol error, so the policy sees it as an observation. `latencyMs` delays every call, to simulate slow tools; with
 * `latencyMaxMs` too, each call waits a uniformly random time in [latencyMs, latencyMaxMs].
 *
 * This file and `server.ts` import the MCP SDK's server side; the client side lives only in `src/env/McpClient.ts`.
 */

import { setTimeout as sleep } from "node:timers/promises"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js"
import * as z from "zod"
import * as Records from "./Records.ts"

export interface ToolboxOptions {
  readonly latencyMs?: number
  /** The upper end of a random per-call latency (uniform in [latencyMs, latencyMaxMs]); default latencyMs. */
  readonly latencyMaxMs?: number
}

/** `"50"` → [50, 50]; `"50-200"` → [50, 200]; undefined for anything else (negative, reversed, not a number). */
export const parseLatency = (text: string): readonly [number, number] | undefined => {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(?:-\s*(\d+(?:\.\d+)?)\s*)?$/.exec(text)
  if (m === null) return undefined
  const min = Number(m[1])
  const max = m[2] === undefined ? min : Number(m[2])
  return max >= min ? [min, max] : undefined
}

/** A tool's own refusal ("division by zero"): becomes an `isError` result. */
class ToolboxError extends Error {}

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

// ---- the server -------------------------------------------------------------------------------------------------

const num = z.number().describe("a number")
const readOnly = { readOnlyHint: true, idempotentHint: true, openWorldHint: false } as const

/** Builds a fresh toolbox server (one per connection in HTTP mode). */
export const make = (options: ToolboxOptions = {}): McpServer => {
  const latencyMs = options.latencyMs ?? 0
  const latencyMaxMs = Math.max(latencyMs, options.latencyMaxMs ?? latencyMs)
  const server = new McpServer({ name: "effect-rl-toolbox", version: "0.1.0" })
  const run = async (answer: () => string | number): Promise<CallToolResult> => {
    const delay = latencyMs + Math.random() * (latencyMaxMs - latencyMs)
    if (delay > 0) await sleep(delay)
    try {
      const value = answer()
      return { content: [{ type: "text", text: typeof value === "number" ? formatNumber(value) : value }] }
    } catch (error) {
      if (error instanceof ToolboxError) return { content: [{ type: "text", text: error.message }], isError: true }
      throw error
    }
  }
  const tool = <Shape extends z.ZodRawShape>(
    name: string,
    description: string,
    inputSchema: Shape,
    answer: (args: z.infer<z.ZodObject<Shape>>) => string | number
  ) =>
    server.registerTool(
      name,
      { description, inputSchema, annotations: readOnly },
      // the SDK's callback type is generic over zod v3 and v4 shapes; `args` is validated against inputSchema
      ((args: z.infer<z.ZodObject<Shape>>) => run(() => answer(args))) as never
    )

  tool("add", "a + b", { a: num, b: num }, ({ a, b }) => a + b)
  tool("subtract", "a - b", { a: num, b: num }, ({ a, b }) => a - b)
  tool("multiply", "a * b", { a: num, b: num }, ({ a, b }) => a * b)
  tool("divide", "a / b (error if b is 0)", { a: num, b: num }, ({ a, b }) => divide(a, b))
  tool("find_customer", "customer id for a full name", { name: z.string() }, ({ name }) => findCustomer(name))
  tool("get_orders", "comma-separated order ids of a customer", { customer_id: z.string() }, ({ customer_id }) =>
    getOrders(customer_id)
  )
  tool("get_order", "an order as JSON {item, price, qty}", { order_id: z.string() }, ({ order_id }) =>
    getOrder(order_id)
  )
  tool(
    "convert_units",
    "convert value between units (mm cm m km in ft yd mi, g kg oz lb, s min h day, c f k)",
    { value: num, from: z.string(), to: z.string() },
    ({ value, from, to }) => convertUnits(value, from, to)
  )
  tool(
    "date_add",
    "date (YYYY-MM-DD) plus days",
    { date: z.string(), days: z.number().describe("whole days") },
    ({ date, days }) => dateAdd(date, days)
  )
  tool("date_diff", "days from start to end (YYYY-MM-DD)", { start: z.string(), end: z.string() }, ({ start, end }) =>
    dateDiff(start, end)
  )
  tool("day_of_week", "weekday name of a date (YYYY-MM-DD)", { date: z.string() }, ({ date }) => dayOfWeek(date))
  return server
}
