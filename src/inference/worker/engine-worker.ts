/**
 * The worker-thread side of WorkerEngine (../WorkerEngine.ts has the protocol): its own tfjs backend, a Transformer
 * built from the shared weight board, and a LocalEngine that serves the main thread's messages. The LocalEngine
 * scheduler yields to the event loop between decode steps, so messages (new weights, pause, abort) are handled
 * between two steps.
 */
import { parentPort, workerData } from "node:worker_threads"
import { Effect, Fiber, Logger, Queue } from "effect"
import * as TensorBackend from "../../backend/TensorBackend.ts"
import { InferenceError } from "../../domain/Errors.ts"
import * as PolicyVersion from "../../domain/PolicyVersion.ts"
import * as Lora from "../../model/Lora.ts"
import * as Transformer from "../../model/Transformer.ts"
import * as ByteTokenizer from "../../tokenizer/ByteTokenizer.ts"
import * as HfTokenizer from "../../tokenizer/HfTokenizer.ts"
import * as WeightBoard from "../../weights/WeightBoard.ts"
import * as LocalEngine from "../LocalEngine.ts"
import type { FromWorker, ToWorker, WorkerInit } from "../WorkerEngine.ts"

const port = parentPort!
const init = workerData as WorkerInit
const post = (message: FromWorker) => port.postMessage(message)

const decoderOf = (files: WorkerInit["tokenizer"]) => {
  if (files === undefined) return undefined
  const impl = ByteTokenizer.isByteTokenizerJson(files["tokenizer.json"])
    ? ByteTokenizer.fromHfFiles(files["tokenizer.json"], files["tokenizer_config.json"])
    : HfTokenizer.fromFiles({ tokenizerJson: files["tokenizer.json"], tokenizerConfig: files["tokenizer_config.json"] })
  return (ids: ReadonlyArray<number>) => impl.decode(ids)
}

const toError = (e: unknown) =>
  e instanceof InferenceError
    ? { reason: e.reason, message: e.message }
    : { reason: "Internal" as const, message: e instanceof Error ? e.message : String(e) }

const program = Effect.gen(function* () {
  yield* TensorBackend.initialise(init.backend)
  const board = init.board
  const initial = WeightBoard.read(
    board,
    init.initialVersion,
    board.names.map((_, i) => i)
  )
  const model = yield* Effect.acquireRelease(
    Effect.sync(() =>
      Transformer.fromHfArrays(init.config, (name) => {
        const i = initial.names.indexOf(name)
        return i < 0 ? undefined : { shape: initial.shapes[i]!, data: initial.data[i]! }
      })
    ),
    (m) => Effect.sync(() => Transformer.dispose(m))
  )
  if (init.adapter !== undefined) Lora.attachWeights(model, init.adapter)
  const decode = decoderOf(init.tokenizer)
  const engine = yield* LocalEngine.make({
    model,
    initialVersion: PolicyVersion.make(init.initialVersion),
    maxBatch: init.maxBatch,
    ...(decode === undefined ? {} : { decode }),
    ...(init.logprobsMode === undefined ? {} : { logprobsMode: init.logprobsMode })
  })
  const running = new Map<number, Fiber.Fiber<void>>()
  const inbox = yield* Queue.unbounded<ToWorker>()
  port.on("message", (message: ToWorker) => Queue.offerUnsafe(inbox, message))

  const handle = (message: ToWorker): Effect.Effect<void> => {
    switch (message.type) {
      case "generate":
        return Effect.gen(function* () {
          const fiber = yield* engine.generate(message.requests).pipe(
            Effect.match({
              onFailure: (e) => post({ type: "result", id: message.id, error: toError(e) }),
              onSuccess: (results) => post({ type: "result", id: message.id, results })
            }),
            Effect.ensuring(Effect.sync(() => running.delete(message.id))),
            Effect.forkDetach
          )
          running.set(message.id, fiber)
        })
      case "cancel":
        return Effect.suspend(() => {
          const fiber = running.get(message.id)
          return fiber === undefined ? Effect.void : Fiber.interrupt(fiber)
        })
      case "abort":
        // every call in flight ends now, without a result; the main thread resubmits it after `resume`
        return Effect.gen(function* () {
          const ids = [...running.keys()]
          yield* Fiber.interruptAll([...running.values()])
          for (const id of ids) post({ type: "result", id, aborted: true })
          post({ type: "ack", id: message.id })
        })
      case "weights":
        return Effect.suspend(() =>
          // transposed weights are copied by the load itself (while the main thread waits for our ack): view those;
          // the others may be kept by reference by a tfjs backend (cpu), so they must be private copies
          engine.updateWeights({
            ...WeightBoard.read(board, message.version, message.tensors, Transformer.isTransposed),
            ...(message.adapter === undefined ? {} : { adapter: message.adapter })
          })
        ).pipe(
          Effect.match({
            onFailure: (e) => post({ type: "ack", id: message.id, error: toError(e) }),
            onSuccess: () => post({ type: "ack", id: message.id })
          })
        )
      case "pause":
        return Effect.map(engine.pause, () => post({ type: "ack", id: message.id }))
      case "resume":
        return Effect.map(engine.resume, () => post({ type: "ack", id: message.id }))
    }
  }

  post({ type: "ready" })
  return yield* Effect.forever(Effect.flatMap(Queue.take(inbox), handle))
})

Effect.runFork(
  Effect.scoped(program).pipe(
    Effect.catchCause((cause) => Effect.sync(() => post({ type: "failed", message: String(cause) }))),
    // the worker shares the process's stdout, whose last line is a command's JSON result: logs go to stderr
    Effect.provideService(Logger.LogToStderr, true)
  )
)
