/**
 * A tau-bench tool: upstream's `Tool.invoke(data, **kwargs) -> str`, with the env's `try/except` around it.
 *
 * `invoke` reproduces what upstream shows the model for a call: the tool's own return text, `Error: <exception>`
 * when the tool raises (a missing or unexpected keyword argument, a `KeyError` as `Error: 'key'`), never a throw.
 * There is no rollback: what a tool changed before it raised stays, as upstream.
 *
 * Departure, on purpose: arguments of the wrong JSON type (a string where a list is expected) are refused up front
 * with `Error: <name> must be <type>`; upstream would run on and fail or misbehave somewhere inside the tool.
 */
import type { Db, Obj } from "./Db.ts"
import * as Python from "./Python.ts"

export interface Tool {
  readonly name: string
  /** The keyword parameters, as upstream's `invoke` signature lists them (all required). */
  readonly params: ReadonlyArray<string>
  /** Runs the tool; may throw `PyException` (shown as `Error: …`). */
  readonly run: (db: Db, args: Obj) => string
}

export interface Outcome {
  readonly text: string
  readonly isError: boolean
}

/** `transfer_to_human_agents`: the terminate tool in both domains. */
export const terminateTool = "transfer_to_human_agents"

const className = (name: string): string =>
  name
    .split("_")
    .map((part) => part.charAt(0).toUpperCase() + part.slice(1))
    .join("")

/** Calls `tool` as upstream's `Env.step` does; `args` is deep-copied first, so the DB never aliases the caller's. */
export const invoke = (tool: Tool, db: Db, args: Readonly<Record<string, unknown>>): Outcome => {
  const own = structuredClone(args) as Obj
  for (const key of Object.keys(own)) {
    if (!tool.params.includes(key)) {
      return { text: `Error: ${Python.unexpectedArgument(className(tool.name), key)}`, isError: true }
    }
  }
  const missing = tool.params.filter((p) => !Object.hasOwn(own, p))
  if (missing.length > 0) {
    return { text: `Error: ${Python.missingArguments(className(tool.name), missing)}`, isError: true }
  }
  try {
    const text = tool.run(db, own)
    return { text, isError: text.startsWith("Error:") }
  } catch (e) {
    return { text: `Error: ${e instanceof Error ? e.message : String(e)}`, isError: true }
  }
}

// Argument readers: the type checks upstream does not do (see the module note).

const typeError = (name: string, type: string) => new Python.PyException(`${name} must be ${type}`)

export const str = (args: Obj, name: string): string => {
  const v = args[name]
  if (typeof v !== "string") throw typeError(name, "a string")
  return v
}

export const int = (args: Obj, name: string): number => {
  const v = args[name]
  if (typeof v !== "number" || !Number.isFinite(v)) throw typeError(name, "a number")
  return v
}

export const strList = (args: Obj, name: string): Array<string> => {
  const v = args[name]
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) throw typeError(name, "a list of strings")
  return v
}

export const objList = (args: Obj, name: string): Array<Obj> => {
  const v = args[name]
  if (!Array.isArray(v) || !v.every((x) => x !== null && typeof x === "object" && !Array.isArray(x))) {
    throw typeError(name, "a list of objects")
  }
  return v as Array<Obj>
}

/** Python `d[key]`: the value, or `KeyError` shown as `Error: 'key'`. */
export const at = <T = unknown>(d: unknown, key: string): T => {
  if (d === null || typeof d !== "object" || !Object.hasOwn(d, key)) throw Python.keyError(key)
  return (d as Obj)[key] as T
}

/** Python `key in d` for a dict. */
export const hasKey = (d: unknown, key: unknown): boolean =>
  typeof key === "string" && d !== null && typeof d === "object" && Object.hasOwn(d, key)

/** Python `list.count(x)` for strings. */
export const count = (list: ReadonlyArray<string>, x: string): number => list.filter((y) => y === x).length

/** `calculate(expression)`, shared by both domains. */
export const calculate: Tool = {
  name: "calculate",
  params: ["expression"],
  run: (_db, args) => Python.calculate(str(args, "expression"))
}

export const think: Tool = { name: "think", params: ["thought"], run: () => "" }

export const transferToHumanAgents: Tool = {
  name: terminateTool,
  params: ["summary"],
  run: () => "Transfer successful"
}
