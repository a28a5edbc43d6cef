/**
 * Weight sync through a directory: for an engine in another process on the same machine or a shared file system
 * (`serve --watch DIR`, or any LocalEngine given to `watch`). Layout:
 *
 *   DIR/v000012/model.safetensors    one version's weights (HF names and shapes, F32), or for a LoRA run
 *   DIR/v000012/adapter_config.json  its adapter alone, as PEFT saves it (over the base the reader already has)
 *   DIR/v000012/adapter_model.safetensors
 *   DIR/LATEST                       "12\n": the newest complete version
 *
 * Writes are atomic, so a reader never sees half a version: the weights go to `DIR/.tmp-…/`, are fsync'd, and the
 * directory is renamed to `v000012`; then `LATEST` is written the same way (temp file, fsync, rename) and the
 * directory entry fsync'd. Versions older than the newest `keep` are deleted afterwards (a watcher that is reading one
 * just skips it and takes the next).
 *
 * `watch(dir, engine)` polls `LATEST` (every 200 ms by default; polling works on every file system, fs.watch does not)
 * and loads each newer version into the engine, which swaps it in between decode steps.
 */
import { randomBytes } from "node:crypto"
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Clock, Duration, Effect, Layer } from "effect"
import * as DiskFull from "../domain/DiskFull.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as SyncedFile from "../domain/SyncedFile.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"
import { InferenceEngine } from "../inference/InferenceEngine.ts"
import * as Lora from "../model/Lora.ts"
import * as Safetensors from "../model/Safetensors.ts"
import { WeightSync, WeightSyncError } from "./WeightSync.ts"

export interface FileWeightSyncOptions {
  readonly dir: string
  /** Versions kept on disk (≥ 1); default 2. */
  readonly keep?: number
  /** Called after each sync with its size and wall time. */
  readonly onSynced?: (timing: { readonly version: number; readonly bytes: number; readonly seconds: number }) => void
}

const latestFile = "LATEST"
const weightsFile = "model.safetensors"

export const versionDir = (dir: string, version: number): string =>
  path.join(dir, `v${String(version).padStart(6, "0")}`)

/** fsync a directory, so a rename inside it survives a crash (a no-op where directories cannot be opened). */
const syncDir = async (dir: string): Promise<void> => {
  const handle = await fs.open(dir, "r").catch(() => undefined)
  if (handle === undefined) return
  try {
    await handle.sync().catch(() => undefined)
  } finally {
    await handle.close()
  }
}

/** Write one version atomically and point LATEST at it; returns the bytes written. Promise-based (one seam). */
export const writeVersion = async (dir: string, snapshot: WeightSnapshot.WeightSnapshot, keep = 2): Promise<number> => {
  await fs.mkdir(dir, { recursive: true })
  const tmp = path.join(dir, `.tmp-${randomBytes(6).toString("hex")}`)
  await fs.mkdir(tmp)
  try {
    return await writeVersionFrom(tmp, dir, snapshot, keep)
  } finally {
    await fs.rm(tmp, { recursive: true, force: true }) // renamed into place, or half-written (a full disk): gone
  }
}

const writeVersionFrom = async (
  tmp: string,
  dir: string,
  snapshot: WeightSnapshot.WeightSnapshot,
  keep: number
): Promise<number> => {
  const target = versionDir(dir, snapshot.version)
  let written = 0
  if (snapshot.adapter !== undefined) {
    written += await Lora.writeDir(tmp, snapshot.adapter)
    for (const file of [Lora.configFile, Lora.weightsFile]) await fsyncFile(path.join(tmp, file))
  }
  if (snapshot.names.length > 0 || snapshot.adapter === undefined) {
    const bytes = Safetensors.encode(
      snapshot.names.map((name, i) => ({ name, shape: snapshot.shapes[i]!, data: snapshot.data[i]! })),
      "F32",
      { format: "pt", policy_version: String(snapshot.version) }
    )
    await SyncedFile.write(path.join(tmp, weightsFile), bytes)
    written += bytes.byteLength
  }
  await syncDir(tmp)
  await fs.rm(target, { recursive: true, force: true }) // a re-published version replaces the old files
  await fs.rename(tmp, target)
  const latestTmp = path.join(dir, `.${latestFile}-${randomBytes(6).toString("hex")}`)
  try {
    await SyncedFile.write(latestTmp, `${snapshot.version}\n`)
    await fs.rename(latestTmp, path.join(dir, latestFile))
  } finally {
    await fs.rm(latestTmp, { force: true })
  }
  await syncDir(dir)
  const versions = (await fs.readdir(dir))
    .filter((name) => /^v\d+$/.test(name))
    .map((name) => Number(name.slice(1)))
    .sort((a, b) => b - a)
  for (const old of versions.slice(Math.max(1, keep))) {
    await fs.rm(versionDir(dir, old), { recursive: true, force: true })
  }
  return written
}

/** fsync a file written by someone else's writeFile. */
const fsyncFile = async (file: string): Promise<void> => {
  const handle = await fs.open(file, "r+")
  try {
    await handle.sync()
  } finally {
    await handle.close()
  }
}

/** The newest complete version in `dir`, or undefined when none has been written. */
export const readLatest = async (dir: string): Promise<number | undefined> => {
  const text = await fs.readFile(path.join(dir, latestFile), "utf8").catch(() => undefined)
  if (text === undefined) return undefined
  const version = Number(text.trim())
  return Number.isInteger(version) && version >= 0 ? version : undefined
}

/** One version's weights as a snapshot. */
export const readVersion = async (dir: string, version: number): Promise<WeightSnapshot.WeightSnapshot> => {
  const at = versionDir(dir, version)
  if (await Lora.isAdapterDir(at)) {
    return WeightSnapshot.make({
      version: PolicyVersion.make(version),
      names: [],
      shapes: [],
      data: [],
      adapter: await Lora.readDir(at)
    })
  }
  const file = path.join(at, weightsFile)
  const decoded = Safetensors.decode(await fs.readFile(file), file)
  const names = [...decoded.tensors.keys()]
  return WeightSnapshot.make({
    version: PolicyVersion.make(version),
    names,
    shapes: names.map((n) => decoded.tensors.get(n)!.shape),
    data: names.map((n) => decoded.tensors.get(n)!.data)
  })
}

export const make = (options: FileWeightSyncOptions): WeightSync["Service"] =>
  WeightSync.of({
    kind: "file",
    published: Effect.promise(() => readLatest(options.dir)),
    publish: Effect.fn("FileWeightSync.publish")(function* (update) {
      const startedAt = yield* Clock.currentTimeMillis
      const snapshot = yield* update.snapshot
      const bytes = yield* Effect.tryPromise({
        try: () => writeVersion(options.dir, snapshot, options.keep ?? 2),
        // a full disk stops the run in one line, as everywhere a run writes
        catch: DiskFull.orElse(
          options.dir,
          (cause) =>
            new WeightSyncError({
              target: options.dir,
              message: `cannot write v${snapshot.version}: ${cause instanceof Error ? cause.message : String(cause)}`
            })
        )
      }).pipe(Effect.catchTag("DiskFullError", (e) => Effect.die(e)))
      const seconds = ((yield* Clock.currentTimeMillis) - startedAt) / 1000
      options.onSynced?.({ version: snapshot.version, bytes, seconds })
      yield* Effect.logDebug(`weight sync v${snapshot.version}: ${bytes} bytes to ${options.dir} in ${seconds}s`)
    })
  })

export const layer = (options: FileWeightSyncOptions): Layer.Layer<WeightSync> =>
  Layer.succeed(WeightSync, make(options))

/**
 * Write each version to the directory, then tell the engine in context its version with a tensor-less snapshot: for
 * an engine whose weights arrive another way — a RemoteEngine in front of `serve --watch DIR`, or a LocalEngine
 * sampling from the trainer's own variables. Not for a WorkerEngine (it would keep its old weights).
 */
export const layerFollowing = (options: FileWeightSyncOptions): Layer.Layer<WeightSync, never, InferenceEngine> =>
  Layer.effect(
    WeightSync,
    Effect.gen(function* () {
      const engine = yield* InferenceEngine
      const files = make(options)
      return WeightSync.of({
        ...files,
        publish: (update) =>
          files.publish(update).pipe(
            Effect.andThen(
              engine.updateWeights(
                WeightSnapshot.make({ version: PolicyVersion.make(update.version), names: [], shapes: [], data: [] })
              )
            ),
            Effect.mapError((e) => new WeightSyncError({ target: options.dir, message: e.message }))
          )
      })
    })
  )

/**
 * Load every new version written to `dir` into `engine`, polling `LATEST`, until the scope closes. A version that
 * cannot be read (pruned meanwhile, a model of another shape) is logged and skipped.
 */
export const watch = (
  dir: string,
  engine: InferenceEngine["Service"],
  options?: { readonly interval?: Duration.Input }
) =>
  Effect.gen(function* () {
    const interval = options?.interval ?? Duration.millis(200)
    let seen = -1
    const poll = Effect.gen(function* () {
      const latest = yield* Effect.promise(() => readLatest(dir))
      const current = yield* engine.version
      if (latest === undefined || latest <= seen || latest <= current) return
      seen = latest
      const snapshot = yield* Effect.tryPromise(() => readVersion(dir, latest))
      yield* engine.updateWeights(snapshot)
      yield* Effect.logDebug(`loaded weights v${latest} from ${dir}`)
    }).pipe(Effect.catch((e) => Effect.logWarning(`FileWeightSync.watch ${dir}: ${e.message}`)))
    yield* Effect.forkScoped(Effect.forever(Effect.andThen(poll, Effect.sleep(interval))))
  })
