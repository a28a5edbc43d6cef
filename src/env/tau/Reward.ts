/**
 * Upstream's `Env.step` for tool actions and `calculate_reward`, over the canonical hash:
 *
 *   reward = 1  iff  hash(DB the agent left) == hash(fresh DB + every ground-truth action but transfer_to_human_agents)
 *            and every task output o satisfies  ∃ respond r: o.lower() in r.content.lower().replace(",", "")
 *
 * The ground-truth hash of a task is computed once per process (upstream recomputes it every episode).
 */

import * as AirlineTools from "./AirlineTools.ts"
import * as Db from "./Db.ts"
import * as Hash from "./Hash.ts"
import * as RetailTools from "./RetailTools.ts"
import * as Tool from "./Tool.ts"

const byName = (tools: ReadonlyArray<Tool.Tool>) => new Map(tools.map((t) => [t.name, t]))
const toolMaps: Readonly<Record<Db.Domain, ReadonlyMap<string, Tool.Tool>>> = {
  retail: byName(RetailTools.tools),
  airline: byName(AirlineTools.tools)
}

/** The tools of a domain by name. */
export const toolsOf = (domain: Db.Domain): ReadonlyMap<string, Tool.Tool> => toolMaps[domain]

/** One tool action on `db`: the observation upstream gives (`Unknown action <name>` for a name it does not know). */
export const act = (db: Db.Db, action: Db.Action): Tool.Outcome => {
  const tool = toolMaps[db.domain].get(action.name)
  if (tool === undefined) return { text: `Unknown action ${action.name}`, isError: true }
  return Tool.invoke(tool, db, action.kwargs)
}

/** A fresh DB with `actions` applied in order, skipping the terminate tool; the observations in order. */
export const replay = (data: Db.DomainData, actions: ReadonlyArray<Db.Action>) => {
  const db = Db.fresh(data)
  const observations: Array<Tool.Outcome & { readonly action: string }> = []
  for (const action of actions) {
    if (action.name === Tool.terminateTool) continue
    observations.push({ action: action.name, ...act(db, action) })
  }
  return { db, observations }
}

export const hashDb = (db: Db.Db): string => Hash.hashTables(db.tables)

const gtCache = new WeakMap<Db.DomainData, Map<string, string>>()

/** The hash after replaying a task's ground truth (cached per loaded domain and task actions). */
export const groundTruthHash = (data: Db.DomainData, actions: ReadonlyArray<Db.Action>): string => {
  let table = gtCache.get(data)
  if (table === undefined) {
    table = new Map()
    gtCache.set(data, table)
  }
  const key = JSON.stringify(actions)
  let hit = table.get(key)
  if (hit === undefined) {
    hit = hashDb(replay(data, actions).db)
    table.set(key, hit)
  }
  return hit
}

/** Upstream's outputs check: each output, lower-cased, is a substring of some reply, lower-cased without commas. */
export const outputsFound = (
  outputs: ReadonlyArray<string>,
  replies: ReadonlyArray<string>
): Record<string, boolean> => {
  const texts = replies.map((r) => r.toLowerCase().replaceAll(",", ""))
  return Object.fromEntries(outputs.map((o) => [o, texts.some((t) => t.includes(o.toLowerCase()))]))
}

export interface RewardInfo {
  readonly reward: 0 | 1
  readonly hash: string
  readonly gtHash: string
  /** Present when the task has outputs. */
  readonly outputs?: Record<string, boolean>
}

/** `calculate_reward()` for the DB an episode ended with and the agent's replies (respond contents). */
export const reward = (
  data: Db.DomainData,
  db: Db.Db,
  truth: { readonly actions: ReadonlyArray<Db.Action>; readonly outputs: ReadonlyArray<string> },
  replies: ReadonlyArray<string>
): RewardInfo => {
  const hash = hashDb(db)
  const gtHash = groundTruthHash(data, truth.actions)
  let ok = hash === gtHash
  if (truth.outputs.length === 0) return { reward: ok ? 1 : 0, hash, gtHash }
  const outputs = outputsFound(truth.outputs, replies)
  if (Object.values(outputs).some((found) => !found)) ok = false
  return { reward: ok ? 1 : 0, hash, gtHash, outputs }
}
