/**
 * A write that is on disk when it resolves: the file opened (`w` replaces it, `a` appends), written, fsynced and
 * closed, whatever fails. The run files that must survive a crash go through it (consumed.jsonl, rollout-requests.jsonl,
 * the checkpoints' `latest`, the file weight sync's versions and LATEST); each caller maps a failure its own way.
 */
import * as fs from "node:fs/promises"

export const write = async (file: string, data: Uint8Array | string, flag: "w" | "a" = "w"): Promise<void> => {
  const handle = await fs.open(file, flag)
  try {
    await handle.writeFile(data)
    await handle.sync()
  } finally {
    await handle.close()
  }
}
