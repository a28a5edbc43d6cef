/**
 * WorkerEngine's weight board: one SharedArrayBuffer per weight tensor (HF names and shapes, F32), allocated once when
 * the engine starts and handed to the worker once. WorkerEngine.ts writes each new version into it (`write`) and posts
 * only the version number and which tensors changed; the worker (worker/engine-worker.ts) copies them out into its own
 * tfjs variables between two decode steps (`read`) and acknowledges. The board is never written while the worker reads
 * it: an update waits for the worker's acknowledgement, and updates are serialised. So no per-step copy of the model
 * goes through postMessage (which would structured-clone every array), and the trainer never shares live tensors.
 */
import * as PolicyVersion from "../domain/PolicyVersion.ts"
import * as WeightSnapshot from "../domain/WeightSnapshot.ts"

/** What crosses to the worker once: plain data and shared buffers (structured-clonable, buffers shared not copied). */
export interface Board {
  readonly names: ReadonlyArray<string>
  readonly shapes: ReadonlyArray<ReadonlyArray<number>>
  readonly buffers: ReadonlyArray<SharedArrayBuffer>
}

/** One SharedArrayBuffer per tensor, holding `snapshot`'s weights. */
export const allocate = (snapshot: WeightSnapshot.WeightSnapshot): Board => {
  const buffers = snapshot.data.map((d) => {
    const buffer = new SharedArrayBuffer(d.byteLength)
    new Float32Array(buffer).set(d)
    return buffer
  })
  return { names: [...snapshot.names], shapes: snapshot.shapes.map((s) => [...s]), buffers }
}

/**
 * Copy a snapshot (all tensors or a subset) into the board; returns the indices written. Throws on an unknown name
 * or a shape mismatch before writing anything.
 */
export const write = (board: Board, snapshot: WeightSnapshot.WeightSnapshot): Array<number> => {
  const index = new Map(board.names.map((n, i) => [n, i]))
  const indices = snapshot.names.map((name, i) => {
    const at = index.get(name)
    if (at === undefined) throw new Error(`weight ${name} is not on the board`)
    const shape = board.shapes[at]!
    const given = snapshot.shapes[i]!
    if (shape.length !== given.length || shape.some((d, j) => d !== given[j])) {
      throw new Error(`weight ${name} has shape [${given.join(", ")}], the board's is [${shape.join(", ")}]`)
    }
    return at
  })
  indices.forEach((at, i) => new Float32Array(board.buffers[at]!).set(snapshot.data[i]!))
  return indices
}

/**
 * The board's tensors at `indices` as a snapshot. By default each array is a private copy (the reader owns it; the
 * board may change later). `shared(name)` = true hands out a view of the shared buffer instead, for tensors the reader
 * copies anyway while the board is held still (a weight the model transposes on load), to save one copy of them.
 */
export const read = (
  board: Board,
  version: number,
  indices: ReadonlyArray<number>,
  shared: (name: string) => boolean = () => false
): WeightSnapshot.WeightSnapshot =>
  WeightSnapshot.make({
    version: PolicyVersion.make(version),
    names: indices.map((i) => board.names[i]!),
    shapes: indices.map((i) => board.shapes[i]!),
    data: indices.map((i) => {
      const view = new Float32Array(board.buffers[i]!)
      return shared(board.names[i]!) ? view : view.slice()
    })
  })
