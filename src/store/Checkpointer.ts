/**
 * Checkpoints: one directory per training step under `<run dir>/checkpoints/step-N/`, holding
 *   - the policy as a HF directory (config.json, model.safetensors, tokenizer files): loadable by `model.path`,
 *     HF transformers or vLLM;
 *   - `optimizer.safetensors` (AdamW moments, names `m/<param>` and `v/<param>`);
 *   - `trainer_state.json` (step, policy version, optimizer step, KL coefficient, ExperienceReplay's kept successes
 *     when replay is on, and the caller's data state:
 *     cursor, consumed prompt uids, ...);
 *   - any extra files the caller passes (the async pipeline's `inflight.jsonl`).
 * The `latest` file (the directory name) is written last, by rename, so a crash mid-save leaves the previous
 * checkpoint as `latest`; the step directory's rename and `latest.tmp` are fsync'd before `latest` is replaced, and
 * the directory after, so a power loss cannot leave `latest` empty or naming a step that is not there. Only the
 * newest `keep_n` step directories are kept, and the oldest go before a new one is written (never the one `latest`
 * names), so keep_n checkpoints need the room of keep_n. A save that fails (a full disk: ENOSPC, EDQUOT, said in one
 * line) removes what it wrote; `latest` still names the checkpoint before. `checkSpace` warns when the room left is
 * below two checkpoints.
 *
 * A step directory is complete when it exists under its final name (`step-N`): it is written as `step-N.tmp` and
 * renamed into place. So `--resume latest` with `latest` missing, empty or unreadable resumes from the newest
 * complete one, with a warning (`resumeLatest`), rather than starting fresh and archiving the run.
 *
 * With LoRA adapters attached, `weights` says what is saved:
 *   - `merged` (`sft`): the merged W + s·Aᵀ·Bᵀ, so the directory still loads as `model.path` everywhere (HF, vLLM),
 *     and the adapter alone in `adapter/` (PEFT layout);
 *   - `adapter` (a LoRA RL run): only `adapter/` (PEFT layout, its `base_model_name_or_path` the run's `model.path`)
 *     besides the optimizer and trainer state: megabytes per checkpoint, the base is the run's own. Resuming loads the
 *     base from `model` and attaches the adapter; `model export --merge` writes the merged HF directory.
 * `sft` keeps its step directories and `latest` in its output directory itself (`root`), where they have always been.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { type Cause, Context, Effect, Layer, Schema, SchemaIssue } from "effect"
import * as DiskFull from "../domain/DiskFull.ts"
import { CheckpointError } from "../domain/Errors.ts"
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as SyncedFile from "../domain/SyncedFile.ts"
import * as Checkpoint from "../model/Checkpoint.ts"
import * as Lora from "../model/Lora.ts"
import * as Safetensors from "../model/Safetensors.ts"
import * as Snapshot from "../model/Snapshot.ts"
import type * as Transformer from "../model/Transformer.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import type * as ExperienceReplay from "../trainer/ExperienceReplay.ts"
import type { TrainerState } from "../trainer/Trainer.ts"

export interface Saved {
  readonly dir: string
  readonly step: number
}

export interface Restored {
  readonly dir: string
  readonly trainer: TrainerState
  readonly data: Readonly<Record<string, unknown>>
}

export class Checkpointer extends Context.Service<
  Checkpointer,
  {
    readonly root: string
    readonly save: (
      step: number,
      model: Transformer.Transformer,
      trainer: TrainerState,
      data: Readonly<Record<string, unknown>>,
      /** Extra files (name → text) written into the checkpoint before it is published, e.g. in-flight groups. */
      files?: Readonly<Record<string, string>>
    ) => Effect.Effect<Saved, CheckpointError>
    /** `latest` → the checkpoint to resume from (`resumeLatest`), or `path` itself; undefined when there is none. */
    readonly resolve: (which: string) => Effect.Effect<string | undefined, CheckpointError>
    /** Read the trainer and data state of a checkpoint directory (the weights load via `model.path`). */
    readonly read: (dir: string) => Effect.Effect<Restored, CheckpointError>
    /** Warn when the free space under `root` is below what two checkpoints of `bytes` each need. */
    readonly checkSpace: (bytes: number) => Effect.Effect<void>
  }
>()("rl/store/Checkpointer") {}

const attempt = <A>(dir: string, what: string, f: () => Promise<A>) =>
  Effect.tryPromise({
    try: f,
    catch: (cause) =>
      new CheckpointError({
        path: dir,
        message: DiskFull.is(cause)
          ? `no space left on the device writing ${what}: the checkpoint was not written and \`latest\` still names ` +
            "the previous one; free space, then train --resume latest"
          : `${what}: ${cause instanceof Error ? cause.message : String(cause)}`
      })
  })

/** Remove the oldest step directories past the newest `keep`, never the one `latest` names. */
const prune = async (root: string, keep: number): Promise<void> => {
  const latest = await pointedBy(path.join(root, "latest"))
  for (const old of (await stepDirs(root)).slice(keep)) {
    const dir = path.join(root, old)
    if (dir !== latest) await fs.rm(dir, { recursive: true, force: true })
  }
}

/** Free bytes for an unprivileged writer on the file system holding `dir` (or its nearest existing parent). */
const freeBytes = async (dir: string): Promise<number | undefined> => {
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    try {
      const stats = await fs.statfs(d)
      return stats.bavail * stats.bsize
    } catch {
      if (path.dirname(d) === d) return undefined
    }
  }
}

/** `trainer_state.json` as `save` writes it; replay entries are checked by the trainer that restores them. */
const TrainerStateFile = Schema.Struct({
  step: Schema.Int,
  version: Schema.Int,
  optimizerStep: Schema.Int,
  optimizerNames: Schema.Array(Schema.String),
  klCoef: Schema.Finite,
  replay: Schema.optionalKey(Schema.Array(Schema.Unknown)),
  data: Schema.Record(Schema.String, Schema.Unknown)
})

const decodeState = Schema.decodeUnknownExit(TrainerStateFile)

/** `key: what was expected` for the first problem of a decoded trainer_state.json. */
const stateProblem = (cause: Cause.Cause<Schema.SchemaError>): string => {
  const failure = cause.reasons.find((r) => r._tag === "Fail")
  const issue =
    failure !== undefined && failure._tag === "Fail"
      ? SchemaIssue.makeFormatterStandardSchemaV1()(failure.error.issue).issues[0]
      : undefined
  const key = (issue?.path ?? []).map((p) => String(typeof p === "object" ? p.key : p)).join(".")
  return `${key === "" ? "" : `${key}: `}${issue?.message ?? "not a trainer state"}`
}

/** The directory under a run directory that holds the step checkpoints and the `latest` pointer. */
export const dirName = "checkpoints"

/** The checkpoint a `latest` pointer file names (beside it); undefined when it is missing, unreadable or empty. */
const pointedBy = async (pointer: string): Promise<string | undefined> => {
  const name = await fs.readFile(pointer, "utf8").then(
    (text) => text.trim(),
    () => ""
  )
  return name === "" ? undefined : path.join(path.dirname(pointer), name)
}

/** The checkpoint directory `<runDir>/checkpoints/latest` names; undefined when there is none yet. */
export const latestIn = (runDir: string): Promise<string | undefined> => pointedBy(path.join(runDir, dirName, "latest"))

const exists = (p: string) =>
  fs.access(p).then(
    () => true,
    () => false
  )

/** The `step-N` directories under `root` (not `step-N.tmp`: a save that did not finish), newest first. */
const stepDirs = async (root: string): Promise<Array<string>> =>
  (await fs.readdir(root).catch(() => []))
    .filter((d) => /^step-\d+$/.test(d))
    .sort((a, b) => Number(b.slice(5)) - Number(a.slice(5)))

/** resumeLatest for the directory that holds the step directories and `latest` itself. */
const resumeLatestIn = Effect.fn("Checkpointer.resumeLatest")(function* (root: string) {
  const named = yield* Effect.promise(() => pointedBy(path.join(root, "latest")))
  if (named !== undefined) return named
  const steps = yield* Effect.promise(() => stepDirs(root))
  if (steps.length === 0) return undefined
  const pointer = path.join(root, "latest")
  const problem = (yield* Effect.promise(() => exists(pointer))) ? "is empty or unreadable" : "is missing"
  for (const step of steps) {
    const dir = path.join(root, step)
    if (!(yield* Effect.promise(() => exists(path.join(dir, "trainer_state.json"))))) continue
    yield* Effect.logWarning(`${pointer} ${problem}: resuming from the newest complete checkpoint, ${dir}`)
    return dir
  }
  return yield* new CheckpointError({
    path: pointer,
    message:
      `${problem} and no step directory (${steps.join(", ")}) holds trainer_state.json: resume from a checkpoint ` +
      `with --resume PATH, or move ${root} away to start a fresh run`
  })
})

/**
 * The checkpoint `--resume latest` continues from: the one `latest` names; when `latest` is missing, empty or
 * unreadable but step directories are there, the newest complete one (renamed into place and holding
 * trainer_state.json), with a warning. Undefined when the run has no checkpoint yet. Step directories none of which is
 * complete are a CheckpointError that says what to do: starting fresh would move them to `earlier/`.
 */
export const resumeLatest = (runDir: string) => resumeLatestIn(path.join(runDir, dirName))

/** fsync a file or directory: what a rename or a write left in the page cache reaches the disk. */
const fsync = async (p: string) => {
  const handle = await fs.open(p, "r")
  try {
    await handle.sync()
  } catch (cause) {
    // some platforms cannot fsync a directory (EISDIR, EINVAL, EPERM): nothing more can be done there
    if (!["EISDIR", "EINVAL", "EPERM"].includes((cause as NodeJS.ErrnoException).code ?? "")) throw cause
  } finally {
    await handle.close()
  }
}

/** The newest complete `step-N` directory of a run (holding trainer_state.json); undefined when there is none. */
const newestComplete = async (runDir: string): Promise<string | undefined> => {
  const root = path.join(runDir, dirName)
  for (const step of await stepDirs(root)) {
    if (await exists(path.join(root, step, "trainer_state.json"))) return path.join(root, step)
  }
  return undefined
}

/**
 * The checkpoint directory a user means by `p`: a run directory → its latest checkpoint (what `latest` names, or
 * the newest complete step when `latest` is missing or empty); a `checkpoints/latest` pointer file → the checkpoint
 * it names; anything else → `p` itself (read as a model directory).
 */
export const resolveModelDir = async (p: string): Promise<string> => {
  const stat = await fs.stat(p).catch(() => undefined)
  if (stat?.isFile() === true && path.basename(p) === "latest") return (await pointedBy(p)) ?? p
  if (stat?.isDirectory() === true) {
    const hasConfig = await fs.access(path.join(p, "config.json")).then(
      () => true,
      () => false
    )
    if (!hasConfig) return (await latestIn(p)) ?? (await newestComplete(p)) ?? p
  }
  return p
}

export interface Options {
  readonly runDir: string
  /** Where the step directories and `latest` go; default `<runDir>/checkpoints`. */
  readonly root?: string
  /** Step directories kept, newest first; `Infinity` keeps every one. */
  readonly keepN: number
  readonly tokenizer: TokenizerImpl
  /** The attached adapters' options, for `adapter/adapter_config.json`; without them no `adapter/` is written. */
  readonly lora?: Lora.LoraOptions
  /** With adapters attached: merged weights + `adapter/` (default), or `adapter/` alone. */
  readonly weights?: "merged" | "adapter"
  /** The base model directory recorded in `adapter/adapter_config.json` (`base_model_name_or_path`). */
  readonly baseModelPath?: string
}

/** The PEFT adapter directory inside a checkpoint. */
export const adapterDir = (checkpoint: string): string => path.join(checkpoint, "adapter")

/** An adapter that needs a base model: its directory, and the base its adapter_config.json names (if any). */
export interface AdapterSource {
  readonly adapterDir: string
  readonly base: string | undefined
}

/**
 * Whether a resolved model directory is an adapter without weights of its own — a PEFT directory, or a LoRA run's
 * checkpoint (`adapter/` and no config.json) — and if so where it is and which base it names. Undefined for a model
 * directory (with or without an `adapter/` beside merged weights).
 */
export const adapterSourceOf = async (dir: string): Promise<AdapterSource | undefined> => {
  const at = (await Lora.isAdapterDir(dir))
    ? dir
    : !(await exists(path.join(dir, "config.json"))) && (await Lora.isAdapterDir(adapterDir(dir)))
      ? adapterDir(dir)
      : undefined
  return at === undefined ? undefined : { adapterDir: at, base: await Lora.baseModelOf(at) }
}

/**
 * The model's effective weights as a HF directory: with LoRA adapters attached, the merged W + s·Aᵀ·Bᵀ (written over
 * the base weights Checkpoint.save wrote beside config.json), and the adapter alone in `adapter/` when its options are
 * known.
 */
const saveWeights = async (
  model: Transformer.Transformer,
  dir: string,
  step: number,
  options: Options
): Promise<void> => {
  const lora = options.lora
  if (options.weights === "adapter" && model.adapters.size > 0) {
    await fs.mkdir(dir, { recursive: true })
    await Lora.save(model, adapterDir(dir), lora ?? Lora.optionsOf(model), options.baseModelPath ?? null)
    return
  }
  await Checkpoint.save(model, dir)
  if (model.adapters.size === 0) return
  const snapshot = await Snapshot.fromModel(model, PolicyVersion.make(step))
  await Checkpoint.writeTensors(
    dir,
    snapshot.names.map((name, i) => ({ name, shape: snapshot.shapes[i]!, data: snapshot.data[i]! }))
  )
  if (lora !== undefined) await Lora.save(model, adapterDir(dir), lora, options.baseModelPath ?? null)
}

export const make = (options: Options) => {
  const root = options.root ?? path.join(options.runDir, dirName)
  const save = Effect.fn("Checkpointer.save")(function* (
    step: number,
    model: Transformer.Transformer,
    trainer: TrainerState,
    data: Readonly<Record<string, unknown>>,
    files: Readonly<Record<string, string>> = {}
  ) {
    const name = `step-${step}`
    const dir = path.join(root, name)
    const tmp = `${dir}.tmp`
    // room first: the oldest checkpoints past keep_n go before the new one is written (never the one `latest` names)
    yield* attempt(root, "prune", () => prune(root, Math.max(1, options.keepN - 1)))
    yield* attempt(tmp, "clear", () => fs.rm(tmp, { recursive: true, force: true }))
    return yield* write(step, name, dir, tmp, model, trainer, data, files).pipe(
      // a half-written checkpoint gives back its space
      Effect.tapError(() => Effect.promise(() => fs.rm(tmp, { recursive: true, force: true }).catch(() => undefined)))
    )
  })
  const write = (
    step: number,
    name: string,
    dir: string,
    tmp: string,
    model: Transformer.Transformer,
    trainer: TrainerState,
    data: Readonly<Record<string, unknown>>,
    files: Readonly<Record<string, string>>
  ) =>
    Effect.gen(function* () {
      yield* attempt(tmp, "weights", () => saveWeights(model, tmp, step, options))
      const hf = options.tokenizer.hfFiles()
      yield* attempt(tmp, "tokenizer", async () => {
        await fs.writeFile(path.join(tmp, "tokenizer.json"), JSON.stringify(hf["tokenizer.json"]))
        await fs.writeFile(
          path.join(tmp, "tokenizer_config.json"),
          `${JSON.stringify(hf["tokenizer_config.json"], null, 2)}\n`
        )
      })
      const moments: Array<Safetensors.NamedTensor> = trainer.optimizer.names.flatMap((n, i) => [
        { name: `m/${n}`, shape: [trainer.optimizer.m[i]!.length], data: trainer.optimizer.m[i]! },
        { name: `v/${n}`, shape: [trainer.optimizer.v[i]!.length], data: trainer.optimizer.v[i]! }
      ])
      yield* attempt(tmp, "optimizer", () =>
        fs.writeFile(path.join(tmp, "optimizer.safetensors"), Safetensors.encode(moments))
      )
      const state = {
        step: trainer.step,
        version: trainer.version,
        optimizerStep: trainer.optimizer.step,
        optimizerNames: trainer.optimizer.names,
        klCoef: trainer.klCoef,
        ...(trainer.replay === undefined ? {} : { replay: trainer.replay }),
        data
      }
      yield* attempt(tmp, "trainer state", () =>
        fs.writeFile(path.join(tmp, "trainer_state.json"), `${JSON.stringify(state, null, 2)}\n`)
      )
      for (const [file, text] of Object.entries(files)) {
        yield* attempt(tmp, file, () => fs.writeFile(path.join(tmp, path.basename(file)), text))
      }
      yield* attempt(dir, "publish", async () => {
        await fs.rm(dir, { recursive: true, force: true })
        await fs.rename(tmp, dir)
        await fsync(root) // the step directory is in place before `latest` may name it
        const pointer = path.join(root, "latest.tmp")
        await SyncedFile.write(pointer, name)
        await fs.rename(pointer, path.join(root, "latest"))
        await fsync(root)
      })
      yield* attempt(root, "prune", () => prune(root, options.keepN))
      return { dir, step }
    })
  const checkSpace = (bytes: number) =>
    Effect.gen(function* () {
      const free = yield* Effect.promise(() => freeBytes(root))
      if (free === undefined || free >= 2 * bytes) return
      const mb = (n: number) => `${Math.round(n / 2 ** 20)} MB`
      yield* Effect.logWarning(
        `${mb(free)} free under ${root}, below two checkpoints (about ${mb(bytes)} each): a checkpoint that fills the ` +
          "disk stops the run (resumable from the one before); free space or lower checkpoint.keep_n"
      )
    })
  const resolve = (which: string) => (which === "latest" ? resumeLatestIn(root) : Effect.succeed(which))
  const read = (dir: string) =>
    Effect.gen(function* () {
      const raw = yield* attempt(dir, "trainer_state.json", () =>
        fs.readFile(path.join(dir, "trainer_state.json"), "utf8")
      )
      const json = yield* Effect.try({
        try: (): unknown => JSON.parse(raw),
        catch: (cause) =>
          new CheckpointError({
            path: dir,
            message: `trainer_state.json is not valid JSON (${cause instanceof Error ? cause.message : String(cause)})`
          })
      })
      const decoded = decodeState(json)
      // an `sft` checkpoint (its state under data.sft; snake_case at the top level before sft saved through here):
      // its weights start a run, its step, optimizer moments and data state are not an RL run's to resume
      const sft =
        decoded._tag === "Success"
          ? decoded.value.data["sft"] !== undefined
          : typeof json === "object" && json !== null && "optimizer_step" in json
      if (sft) {
        return yield* new CheckpointError({
          path: dir,
          message: `trainer_state.json is an sft checkpoint's: start a run from its weights with model.path=${dir}, not --resume`
        })
      }
      if (decoded._tag === "Failure") {
        return yield* new CheckpointError({ path: dir, message: `trainer_state.json: ${stateProblem(decoded.cause)}` })
      }
      const state = decoded.value
      const bytes = yield* attempt(dir, "optimizer.safetensors", () =>
        fs.readFile(path.join(dir, "optimizer.safetensors"))
      )
      const moments = yield* Effect.try({
        try: () => Safetensors.decode(new Uint8Array(bytes), path.join(dir, "optimizer.safetensors")),
        catch: (cause) =>
          new CheckpointError({
            path: dir,
            message: `optimizer.safetensors: ${cause instanceof Error ? cause.message : String(cause)}`
          })
      })
      const get = (key: string) => {
        const t = moments.tensors.get(key)
        if (t === undefined) throw new Error(`missing ${key}`)
        return t.data
      }
      const optimizer = yield* Effect.try({
        try: () => ({
          step: state.optimizerStep,
          names: state.optimizerNames,
          m: state.optimizerNames.map((n) => get(`m/${n}`)),
          v: state.optimizerNames.map((n) => get(`v/${n}`))
        }),
        catch: (cause) => new CheckpointError({ path: dir, message: `optimizer.safetensors: ${String(cause)}` })
      })
      const restored: Restored = {
        dir,
        trainer: {
          step: state.step,
          version: state.version,
          optimizer,
          klCoef: state.klCoef,
          ...(state.replay === undefined ? {} : { replay: state.replay as ReadonlyArray<ExperienceReplay.Entry> })
        },
        data: state.data
      }
      return restored
    })
  return Checkpointer.of({ root, save, resolve, read, checkSpace })
}

export const layer = (options: Options) => Layer.succeed(Checkpointer, make(options))
