/**
 * `<run dir>/rollout-requests.jsonl`: the request a cluster run's trainer sent for each cursor, one
 * `{"cursor", "key", "entityId"}` line appended and fsync'd before the request goes out (cluster/RolloutClient).
 *
 * Requests are persisted in the cluster's storage under their key, so a trainer that asks again for a cursor under
 * the same key and entity gets the group a runner already rolled out, or joins the attempt still in flight, instead of
 * a second rollout. A trainer killed and resumed reads this file to do exactly that for the groups it had asked for
 * past its checkpoint. A torn last line (a crash mid-write) is skipped: that request was not sent.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import * as ConsumedLog from "./ConsumedLog.ts"

export const fileName = "rollout-requests.jsonl"

export interface Request {
  readonly cursor: number
  readonly key: string
  readonly entityId: string
}

export const file = (runDir: string): string => path.join(runDir, fileName)

const isRequest = (value: unknown): value is Request => {
  const r = value as Partial<Request> | null
  return (
    typeof r === "object" &&
    r !== null &&
    Number.isInteger(r.cursor) &&
    typeof r.key === "string" &&
    typeof r.entityId === "string"
  )
}

/** The requests sent so far by cursor (the last one sent for a cursor wins); empty when there is no file. */
export const read = async (runDir: string): Promise<Map<number, Request>> => {
  const text = await fs.readFile(file(runDir), "utf8").catch(() => "")
  const requests = new Map<number, Request>()
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue
    let value: unknown
    try {
      value = JSON.parse(line)
    } catch {
      continue // a torn line: its request was never sent
    }
    if (isRequest(value)) requests.set(value.cursor, value)
  }
  return requests
}

/** Append and fsync one request (before it is sent). A full disk is a DiskFullError naming the file. */
export const append = (runDir: string, request: Request): Promise<void> =>
  ConsumedLog.appendDurably(file(runDir), `${JSON.stringify(request)}\n`)
