/**
 * tau-bench data: a domain's DB tables, tasks, tool schemas and policy, read from a directory laid out as
 * `shared/tau-bench/` is (`<dir>/<domain>/db/<table>.json`, `tasks.json`, `tools.json`, `wiki.md`), and the DB of one
 * episode.
 *
 * An episode's DB is copy-on-write over the loaded one: its tables are shallow copies of the pristine tables, whose
 * records are deep-frozen; a tool that changes a record first takes it with `edit`, which replaces the frozen record
 * by a private deep copy. That is upstream's "reload the DB on every reset" without re-reading 6 MB per episode, and a
 * tool that forgot `edit` throws (frozen objects reject writes in strict mode) instead of corrupting other episodes.
 */
import { Effect, FileSystem, Path, Schema } from "effect"
import type { FunctionTool } from "../Env.ts"

export const domains = ["retail", "airline"] as const
export type Domain = (typeof domains)[number]
export const isDomain = (s: string): s is Domain => (domains as ReadonlyArray<string>).includes(s)

export const tableNames: Readonly<Record<Domain, ReadonlyArray<string>>> = {
  retail: ["orders", "products", "users"],
  airline: ["flights", "reservations", "users"]
}

/** A JSON object as tools read and write it. */
export type Obj = { [key: string]: unknown }
export type Tables = Readonly<Record<string, Obj>>

export interface Action {
  readonly name: string
  readonly kwargs: Readonly<Record<string, unknown>>
}

export interface Task {
  readonly id: number
  readonly split: string
  readonly user_id: string
  readonly instruction: string
  readonly actions: ReadonlyArray<Action>
  readonly outputs: ReadonlyArray<string>
}

/** What `loadDomain` reads. `pristine` is deep-frozen and shared by every episode of the process. */
export interface DomainData {
  readonly domain: Domain
  readonly dir: string
  readonly pristine: Tables
  readonly tasks: ReadonlyArray<Task>
  readonly tools: ReadonlyArray<FunctionTool>
  readonly wiki: string
}

export class TauDataError extends Schema.TaggedError<TauDataError>()("TauDataError", {
  file: Schema.String,
  message: Schema.String
}) {}

const deepFreeze = <T>(value: T): T => {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    for (const v of Object.values(value)) deepFreeze(v)
    Object.freeze(value)
  }
  return value
}

const cache = new Map<string, DomainData>()

/**
 * Reads `<dir>/<domain>/…`. Cached per resolved directory for the life of the process: the files are data, and
 * every episode gets its own copy-on-write view (`fresh`).
 */
export const loadDomain = Effect.fn("TauDb.loadDomain")(function* (dir: string, domain: Domain) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const root = path.resolve(dir, domain)
  const hit = cache.get(root)
  if (hit !== undefined) return hit
  const readText = (file: string) =>
    fs.readFileString(file).pipe(Effect.mapError((e) => new TauDataError({ file, message: e.message })))
  const readJson = (file: string) =>
    readText(file).pipe(
      Effect.flatMap((text) =>
        Effect.try({
          try: () => JSON.parse(text) as unknown,
          catch: (e) => new TauDataError({ file, message: `${e}` })
        })
      )
    )
  const pristine: Record<string, Obj> = {}
  for (const table of tableNames[domain]) {
    const file = path.join(root, "db", `${table}.json`)
    const value = yield* readJson(file)
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      return yield* new TauDataError({ file, message: "expected an object keyed by id" })
    }
    pristine[table] = deepFreeze(value as Obj)
  }
  const tasksFile = path.join(root, "tasks.json")
  const tasks = yield* readJson(tasksFile)
  if (!Array.isArray(tasks)) return yield* new TauDataError({ file: tasksFile, message: "expected an array of tasks" })
  const toolsFile = path.join(root, "tools.json")
  const tools = yield* readJson(toolsFile)
  if (!Array.isArray(tools)) return yield* new TauDataError({ file: toolsFile, message: "expected an array of tools" })
  const wiki = yield* readText(path.join(root, "wiki.md"))
  const data: DomainData = {
    domain,
    dir: root,
    pristine: Object.freeze(pristine),
    tasks: deepFreeze(tasks as Array<Task>),
    tools: tools as Array<FunctionTool>,
    wiki
  }
  cache.set(root, data)
  return data
})

/** The DB of one episode. */
export interface Db {
  readonly domain: Domain
  readonly pristine: Tables
  readonly tables: Tables
}

/** A fresh DB: upstream's `data_load_func()`. */
export const fresh = (data: Pick<DomainData, "domain" | "pristine">): Db => ({
  domain: data.domain,
  pristine: data.pristine,
  tables: Object.fromEntries(tableNames[data.domain].map((t) => [t, { ...data.pristine[t] }]))
})

/** Python `key in table`. */
export const has = (db: Db, table: string, key: unknown): boolean =>
  typeof key === "string" && Object.hasOwn(db.tables[table]!, key)

/** A record to read (possibly frozen); undefined when absent. */
export const get = <T = Obj>(db: Db, table: string, key: string): T | undefined =>
  has(db, table, key) ? (db.tables[table]![key] as T) : undefined

/** The record to change: a private deep copy the first time this episode touches it. */
export const edit = <T = Obj>(db: Db, table: string, key: string): T => {
  const rows = db.tables[table]!
  const current = rows[key]
  if (current !== null && typeof current === "object" && Object.isFrozen(current)) {
    const copy = structuredClone(current)
    rows[key] = copy
    return copy as T
  }
  return current as T
}

/** Adds or replaces a record. */
export const put = (db: Db, table: string, key: string, value: unknown): void => {
  db.tables[table]![key] = value
}
