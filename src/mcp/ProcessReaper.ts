/**
 * No process group outlives the trainer, however it ends. A server we spawn runs in its own process group (so a
 * restart can kill everything it started); on a normal exit the client kills those groups itself, but a trainer
 * killed with SIGKILL runs no exit code, and a server that ignores its stdin closing (or a grandchild it left) would
 * live on. The reaper is a small `/bin/sh` started once, in a process group of its own, reading lines from a pipe we
 * hold: `+PGID` registers a group, `-PGID` forgets it (it ended). When the pipe closes — our process ended, by any
 * means — the reaper kills every group still registered and exits.
 *
 * The reaper never keeps our event loop alive (its handle and pipe are unref'd). Where there is no /bin/sh, groups
 * are only killed by the client's exit hook.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { existsSync } from "node:fs"
import type { Socket } from "node:net"

// `read` returns non-zero at EOF: the loop ends when our end of the pipe closes
const script = `
groups=" "
while IFS= read -r line; do
  case "$line" in
    +*) groups="$groups\${line#+} " ;;
    -*) groups=$(printf '%s' "$groups" | sed "s/ \${line#-} / /") ;;
  esac
done
for g in $groups; do kill -KILL "-$g" 2>/dev/null; done
`

let reaper: ChildProcess | undefined
let unavailable = false

const start = (): ChildProcess | undefined => {
  if (reaper !== undefined || unavailable) return reaper
  if (process.platform === "win32" || !existsSync("/bin/sh")) {
    unavailable = true
    return undefined
  }
  const child = spawn("/bin/sh", ["-c", script], { stdio: ["pipe", "ignore", "ignore"], detached: true })
  child.on("error", () => {
    unavailable = true
    reaper = undefined
  })
  child.on("exit", () => {
    reaper = undefined
  })
  child.stdin?.on("error", () => {}) // the reaper died first: nothing to tell it any more
  child.unref()
  ;(child.stdin as Socket | null)?.unref()
  reaper = child
  return child
}

/** Kill process group `pgid` when this process ends, however it ends (until `forget`). */
export const register = (pgid: number): void => {
  start()?.stdin?.write(`+${pgid}\n`)
}

/** The group ended (or was killed by us): the reaper must not kill a later group that reuses its id. */
export const forget = (pgid: number): void => {
  reaper?.stdin?.write(`-${pgid}\n`)
}

/** The reaper's pid (for tests); undefined before the first registration. */
export const pid = (): number | undefined => reaper?.pid
