/**
 * The one owner of the async pipeline's admission invariant (SkyRL's staleness manager):
 *
 *   a group may start only while  accepted + running < (maxStaleness + trainerStep + 1) · B
 *
 * Counters, each in one sentence:
 * - `trainerStep`: the number of training steps finished and published (0 before the first), i.e. the step whose
 *   weights a group admitted now samples from.
 * - `accepted`: the number of groups whose generation finished, since the start of the run, whether the trainer has
 *   consumed them yet or not (a resumed run counts the groups of the steps before it and its restored in-flight ones).
 * - `running`: the number of groups admitted whose generation has not finished yet.
 * - `consumed`: the number of groups the trainer has trained on (always `trainerStep · B`).
 * - `B`: the training batch size in groups (`trainer.train_batch_size`).
 *
 * So `accepted + running` is every group ever admitted, and admission stops `maxStaleness + 1` batches ahead of the
 * trainer. Why that bounds staleness per group (not only in steady state, as in SkyRL): the pipeline hands prompts
 * out in cursor order and trains step s on exactly the groups at cursors [(s−1)·B, s·B). When the group at cursor c
 * is admitted every cursor below it has been admitted too, so c + 1 ≤ accepted + running ≤ (S + t + 1)·B, i.e. its
 * trainer step at admission t ≥ ⌊c/B⌋ − S; it trains at step ⌊c/B⌋ + 1 on the weights of step ⌊c/B⌋, so its
 * staleness ⌊c/B⌋ − t ≤ S. With S = 0 generation and training strictly alternate: the synchronous loop.
 *
 * The state and its transitions are pure (`State`, `canAdmit`, `admit`, ...); `make` wraps them in an Effect service
 * whose `admit` suspends (no polling) until the trainer's next step frees capacity.
 */
import { Deferred, Effect } from "effect"

export interface State {
  readonly batchSize: number // B, in groups
  readonly maxStaleness: number // S, in training steps
  readonly trainerStep: number
  readonly accepted: number
  readonly running: number
  readonly consumed: number
}

export const initial = (options: {
  readonly batchSize: number
  readonly maxStaleness: number
  readonly trainerStep?: number
  readonly accepted?: number
}): State => {
  const trainerStep = options.trainerStep ?? 0
  return {
    batchSize: options.batchSize,
    maxStaleness: options.maxStaleness,
    trainerStep,
    accepted: options.accepted ?? trainerStep * options.batchSize,
    running: 0,
    consumed: trainerStep * options.batchSize
  }
}

/** (S + t + 1) · B: how many groups may have been admitted in total by now. */
export const capacity = (s: State): number => (s.maxStaleness + s.trainerStep + 1) * s.batchSize

export const canAdmit = (s: State): boolean => s.accepted + s.running < capacity(s)

/** A group starts generating. Admitting past capacity is a defect (callers check `canAdmit`). */
export const admit = (s: State): State => {
  if (!canAdmit(s)) throw new Error(`StalenessManager: admission past capacity ${capacity(s)} (${describe(s)})`)
  return { ...s, running: s.running + 1 }
}

/** A running group finished generating. */
export const accept = (s: State): State => {
  if (s.running < 1) throw new Error(`StalenessManager: accept with no group running (${describe(s)})`)
  return { ...s, running: s.running - 1, accepted: s.accepted + 1 }
}

/** A running group was interrupted before it finished: its slot is free again. */
export const abandon = (s: State): State => {
  if (s.running < 1) throw new Error(`StalenessManager: abandon with no group running (${describe(s)})`)
  return { ...s, running: s.running - 1 }
}

/** The trainer finished a step on B accepted groups and published its weights. */
export const step = (s: State): State => {
  if (s.accepted - s.consumed < s.batchSize) {
    throw new Error(`StalenessManager: a step needs ${s.batchSize} accepted unconsumed groups (${describe(s)})`)
  }
  return { ...s, trainerStep: s.trainerStep + 1, consumed: s.consumed + s.batchSize }
}

export const describe = (s: State): string =>
  `trainerStep ${s.trainerStep}, accepted ${s.accepted}, running ${s.running}, consumed ${s.consumed}, ` +
  `B ${s.batchSize}, maxStaleness ${s.maxStaleness}`

export interface StalenessManager {
  /** Suspends until `canAdmit`, then counts the group as running. */
  readonly admit: Effect.Effect<void>
  readonly accept: Effect.Effect<void>
  readonly abandon: Effect.Effect<void>
  /** Counts a finished training step and wakes the generation fibers waiting for admission. */
  readonly step: Effect.Effect<void>
  /**
   * Run one group's generation under admission: admit (waiting if needed), run, then accept; an interruption or
   * failure frees the slot instead.
   */
  readonly withAdmission: <A, E, R>(generate: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  readonly state: Effect.Effect<State>
}

/**
 * Gotcha: a transition that breaks the invariant (`accept` with nothing running, a step without B groups) is a
 * defect, raised in the fiber that attempted it.
 */
export const make = (start: State): Effect.Effect<StalenessManager> =>
  Effect.sync(() => {
    let state = start
    let waiters: Array<Deferred.Deferred<void>> = []
    // Fibers of one runtime never run simultaneously, so each Effect.sync below is an atomic transition.
    const transition = (f: (s: State) => State) =>
      Effect.sync(() => {
        state = f(state)
      })
    const wakeAll = Effect.suspend(() => {
      const woken = waiters
      waiters = []
      return Effect.forEach(woken, (d) => Deferred.succeed(d, undefined), { discard: true })
    })
    const waitForAdmission: Effect.Effect<void> = Effect.suspend(() => {
      if (canAdmit(state)) return transition(admit)
      return Effect.gen(function* () {
        const wake = yield* Deferred.make<void>()
        waiters.push(wake)
        yield* Deferred.await(wake).pipe(
          Effect.onInterrupt(() =>
            Effect.sync(() => {
              waiters = waiters.filter((w) => w !== wake)
            })
          )
        )
        return yield* waitForAdmission
      })
    })
    const accepted = transition(accept)
    // freeing a slot can let another fiber in (a group interrupted mid-generation)
    const abandoned = transition(abandon).pipe(Effect.andThen(wakeAll))
    return {
      admit: waitForAdmission,
      accept: accepted,
      abandon: abandoned,
      step: transition(step).pipe(Effect.andThen(wakeAll)),
      withAdmission: <A, E, R>(generate: Effect.Effect<A, E, R>) =>
        Effect.uninterruptibleMask((restore) =>
          restore(waitForAdmission).pipe(
            Effect.andThen(
              restore(generate).pipe(Effect.onExit((exit) => (exit._tag === "Success" ? accepted : abandoned)))
            )
          )
        ),
      state: Effect.sync(() => state)
    }
  })
