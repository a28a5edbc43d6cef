/**
 * `npm install` in a folder of its own (`.llamacpp/`, `.webgpu/`), run by the `setup:*` scripts with the npm that runs
 * them (npm run sets npm_execpath to its npm-cli.js), else the npm on PATH. Exits 1, naming the folder, when it fails.
 */
import { execFileSync } from "node:child_process"

export const npmInstall = (prefix: string, flags: ReadonlyArray<string>, label: string): void => {
  const npm = process.env["npm_execpath"]?.endsWith("npm-cli.js") ? process.env["npm_execpath"] : undefined
  const [command, ...args] = npm === undefined ? ["npm"] : [process.execPath, npm]
  try {
    execFileSync(command!, [...args, "install", "--prefer-offline", "--no-audit", "--no-fund", ...flags], {
      cwd: prefix,
      stdio: "inherit",
      shell: process.platform === "win32" && npm === undefined
    })
  } catch {
    console.error(`${label}: npm install in ${prefix} failed (above)`)
    process.exit(1)
  }
}
