/**
 * tau-bench tasks → SkyRL-format rows for the `tau_bench` env:
 *
 *   { uid: "tau_bench/<domain>/<split>/<id>", data_source: "tau_bench/<domain>", env_class: "tau_bench",
 *     prompt: [{ role: "system", content: <wiki.md> }],
 *     reward_spec: { method: "tau_bench", ground_truth: { actions: [{name, kwargs}], outputs: [string] } },
 *     extra_info: { domain, split, task_id, user_id, instruction } }
 *
 * The prompt holds only the policy: the instruction is the simulated user's, never shown to the agent; the env adds
 * the user's first message at init. `trainRatio` < 1 splits the chosen tasks into train and validation rows by a
 * fixed pseudo-random order (sha256 of the uid), so the same data and ratio always give the same files.
 */
import { createHash } from "node:crypto"
import type { PromptRow } from "../domain/PromptRow.ts"
import type * as Db from "../env/tau/Db.ts"

export const envClass = "tau_bench"

/** One task as a dataset row. */
export const toRow = (domain: Db.Domain, wiki: string, task: Db.Task): PromptRow => ({
  uid: `tau_bench/${domain}/${task.split}/${task.id}`,
  data_source: `tau_bench/${domain}`,
  env_class: envClass,
  prompt: [{ role: "system", content: wiki }],
  reward_spec: { method: "tau_bench", ground_truth: { actions: task.actions, outputs: task.outputs } },
  extra_info: { domain, split: task.split, task_id: task.id, user_id: task.user_id, instruction: task.instruction }
})

export interface Converted {
  readonly train: ReadonlyArray<PromptRow>
  readonly val: ReadonlyArray<PromptRow>
}

const order = (uid: string) => createHash("sha256").update(uid).digest("hex")

/**
 * The rows of one split of a loaded domain; with `trainRatio` < 1, ⌈ratio·n⌉ rows go to `train` and the rest to
 * `val`, each kept in task-id order.
 */
export const convert = (data: Db.DomainData, split: string, trainRatio = 1): Converted => {
  const rows = data.tasks.filter((t) => t.split === split).map((t) => toRow(data.domain, data.wiki, t))
  if (trainRatio >= 1) return { train: rows, val: [] }
  const shuffled = [...rows].sort((a, b) => (order(a.uid!) < order(b.uid!) ? -1 : 1))
  const cut = Math.ceil(trainRatio * rows.length)
  const inTrain = new Set(shuffled.slice(0, cut).map((r) => r.uid))
  return { train: rows.filter((r) => inTrain.has(r.uid)), val: rows.filter((r) => !inTrain.has(r.uid)) }
}

/** The splits a domain's tasks have, in first-seen order. */
export const splits = (data: Db.DomainData): ReadonlyArray<string> => [...new Set(data.tasks.map((t) => t.split))]

/** JSON lines, or a JSON array for a `.json` file. */
export const serialize = (rows: ReadonlyArray<PromptRow>, file: string): string =>
  file.endsWith(".json") ? `${JSON.stringify(rows)}\n` : rows.map((r) => `${JSON.stringify(r)}\n`).join("")

/** `train.jsonl` → `train.val.jsonl`: where the validation rows go. */
export const valFile = (file: string): string => {
  const match = /(\.jsonl|\.json)$/.exec(file)
  return match === null ? `${file}.val` : `${file.slice(0, match.index)}.val${match[1]}`
}
