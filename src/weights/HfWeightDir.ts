/**
 * Full weights as Hugging Face model directories on storage the inference servers read: the weight transport of the
 * `vllm` and `sglang` dialects (weights/WeightDialect.ts). Both ends: RemoteEngine writes each version once with
 * `write`, and `serve` reads one with `read` when it is told to reload from disk (serve/DialectRoutes.ts).
 *
 *   ROOT/v000012/config.json           the model's HF config (when the writer has it; servers read it to check shapes)
 *   ROOT/v000012/model.safetensors     every tensor, HF names and shapes, F32, metadata {format: pt, policy_version}
 *
 * A version is written to `ROOT/.tmp-…/` and renamed into place, so a server never reads half of one. The newest
 * `keep` versions stay; older ones are deleted once a newer one is complete (servers have read them into memory).
 * `read` also takes directories saved by others, sharded (`model.safetensors.index.json`) or not; their version is the
 * `policy_version` metadata when present.
 */
import { randomBytes } from "node:crypto"
import * as fs from "node:fs/promises"
import * as path from "node:path"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import * as Checkpoint from "../model/Checkpoint.ts"
import * as Safetensors from "../model/Safetensors.ts"

const weightsFile = "model.safetensors"

export const versionDir = (root: string, version: number): string =>
  path.resolve(root, `v${String(version).padStart(6, "0")}`)

/**
 * Write `snapshot` (full tensors) as `ROOT/v<version>/`, atomically, and delete versions older than the newest `keep`
 * (≥ 1). Returns the directory and the bytes written. Promise-based (one seam).
 */
export const write = async (
  root: string,
  snapshot: WeightSnapshot.WeightSnapshot,
  options: { readonly config?: Readonly<Record<string, unknown>>; readonly keep?: number } = {}
): Promise<{ readonly dir: string; readonly bytes: number }> => {
  await fs.mkdir(root, { recursive: true })
  const target = versionDir(root, snapshot.version)
  const tmp = path.join(root, `.tmp-${randomBytes(6).toString("hex")}`)
  await fs.mkdir(tmp)
  const bytes = Safetensors.encode(
    snapshot.names.map((name, i) => ({ name, shape: snapshot.shapes[i]!, data: snapshot.data[i]! })),
    "F32",
    { format: "pt", policy_version: String(snapshot.version) }
  )
  await fs.writeFile(path.join(tmp, weightsFile), bytes)
  if (options.config !== undefined) {
    await fs.writeFile(path.join(tmp, "config.json"), `${JSON.stringify(options.config, null, 2)}\n`)
  }
  await fs.rm(target, { recursive: true, force: true }) // a version published again replaces the old copy
  await fs.rename(tmp, target)
  const keep = Math.max(1, options.keep ?? 2)
  const versions = (await fs.readdir(root))
    .map((name) => /^v(\d{6,})$/.exec(name))
    .filter((m) => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => b - a)
  for (const old of versions.slice(keep)) await fs.rm(versionDir(root, old), { recursive: true, force: true })
  return { dir: target, bytes: bytes.byteLength }
}

/**
 * A HF directory's tensors as a snapshot. Its version: the `policy_version` metadata of `model.safetensors` when
 * present, else `fallback`. Throws `Checkpoint.CheckpointLoadError` for a directory with no weights.
 */
export const read = async (dir: string, fallback: number): Promise<WeightSnapshot.WeightSnapshot> => {
  const single = path.join(dir, weightsFile)
  const bytes = await fs.readFile(single).catch(() => undefined)
  let tensors: ReadonlyMap<string, Safetensors.Tensor>
  let version = fallback
  if (bytes !== undefined) {
    const decoded = Safetensors.decode(bytes, single)
    tensors = decoded.tensors
    const tagged = Number(decoded.metadata["policy_version"])
    if (Number.isInteger(tagged) && tagged >= 0) version = tagged
  } else {
    tensors = await Checkpoint.readTensors(dir)
  }
  const names = [...tensors.keys()]
  return WeightSnapshot.make({
    version: PolicyVersion.make(version),
    names,
    shapes: names.map((n) => tensors.get(n)!.shape),
    data: names.map((n) => tensors.get(n)!.data)
  })
}
