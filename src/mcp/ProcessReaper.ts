/**
 * No process group outlives the trainer, however it ends. A server we spawn runs in its own process group (so a
 * restart can kill everything it started); on a normal exit the client kills those groups itself, but a trainer
 * killed with SIGKILL runs no exit code, and a server that ignores its stdin closing (or a grandchild it left) would
 * live on. The reaper is a small `/bin/sh` started once, in a process group of its own, reading lines from a pipe we
 * hold: `+PGID` registers a group, `-PGID` forgets it (it ended). When the pipe closes — our process ended, by any
 * means — the reaper kills every group still registered and exits.
 *
 * The reaper never keeps our event loop alive (its handle and pipe are unref'd). Where there is no /bin/sh or no
 * /proc (to tell a group from a later one that reuses its id), groups are only killed by the client's exit hook.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import type { Socket } from "node:net"

// `read` returns non-zero at EOF: the loop ends when our end of the pipe closes. Each entry is `PGID:START`, START
// being the group leader's start time (field 22 of /proc/PID/stat): pids are reused (pid_max may be 32768), so a group
// is killed only while its leader is the very process we started, never a later process that got the same id. A group
// whose leader is gone (a server that crashed before we could forget it) is killed while it still has members: those
// are what the server left behind, and no later group can take its id while any of them lives.
const script = `
groups=" "
while IFS= read -r line; do
  case "$line" in
    +*) groups="$groups\${line#+} " ;;
    -*) groups=$(printf '%s' "$groups" | sed "s/ \${line#-}:[0-9]* / /") ;;
  esac
done
for entry in $groups; do
  g=\${entry%%:*}
  start=\${entry#*:}
  stat=$(cat "/proc/$g/stat" 2>/dev/null) || { kill -KILL "-$g" 2>/dev/null; continue; }
  set -- \${stat##*) }
  shift 19
  [ "$1" = "$start" ] && kill -KILL "-$g" 2>/dev/null
done
`

/** The start time of process `pid` (clock ticks since boot), undefined when it cannot be read. */
const startTime = (pid: number): string | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(") ") + 2).split(" ")[19]
  } catch {
    return undefined
  }
}

let reaper: ChildProcess | undefined
let unavailable = false

const start = (): ChildProcess | undefined => {
  if (reaper !== undefined || unavailable) return reaper
  if (process.platform === "win32" || !existsSync("/bin/sh") || !existsSync("/proc/self/stat")) {
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
  const started = startTime(pgid)
  if (started === undefined || pgid <= 1) return // gone already, or not a group we may ever kill
  start()?.stdin?.write(`+${pgid}:${started}\n`)
}

/** The group ended (or was killed by us): the reaper must not kill a later group that reuses its id. */
export const forget = (pgid: number): void => {
  reaper?.stdin?.write(`-${pgid}\n`)
}

/** The reaper's pid (for tests); undefined before the first registration. */
export const pid = (): number | undefined => reaper?.pid
