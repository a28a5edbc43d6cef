/**
 * Env classes by name: a dataset row's `env_class` picks the factory that builds its environment, as in SkyRL's
 * `register(id=..., entry_point=...)`. Factories are scoped: whatever an env acquires (an MCP session, a server
 * process) is released when the trajectory's scope closes.
 *
 *   registry.register("my_env", (row) => Effect.succeed(myEnv(row)))                    // at startup
 *   EnvRegistry.layerRegister("my_env", (row) => MyEnv.make(row))                      // or as a layer
 */
import { Context, Effect, Layer, Scope } from "effect"
import type { PromptRow } from "../domain/PromptRow.ts"
import { type Env, EnvError } from "./Env.ts"

/** Builds the env of one trajectory from its row (prompt, reward_spec, extra_info, extras). */
export type EnvFactory<R = never> = (row: PromptRow) => Effect.Effect<Env, EnvError, Scope.Scope | R>

export class EnvRegistry extends Context.Service<
  EnvRegistry,
  {
    /** A new env of class `envClass` for `row`, closed with the caller's scope. */
    readonly make: (envClass: string, row: PromptRow) => Effect.Effect<Env, EnvError, Scope.Scope>
    /** Adds or replaces a class. */
    readonly register: (envClass: string, factory: EnvFactory) => Effect.Effect<void>
    readonly classes: Effect.Effect<ReadonlyArray<string>>
  }
>()("rl/env/EnvRegistry") {}

export const make = (initial: Readonly<Record<string, EnvFactory>> = {}) =>
  Effect.sync(() => {
    const factories = new Map<string, EnvFactory>(Object.entries(initial))
    return EnvRegistry.of({
      make: (envClass, row) =>
        Effect.suspend(() => {
          const factory = factories.get(envClass)
          if (factory === undefined) {
            return Effect.fail(
              new EnvError({
                envClass,
                reason: "UnknownEnvClass",
                message: `unknown env_class "${envClass}"; registered: ${[...factories.keys()].sort().join(", ") || "none"}`
              })
            )
          }
          return factory(row).pipe(
            Effect.tap((env) => Effect.addFinalizer(() => env.close)),
            Effect.withSpan("EnvRegistry.make", { attributes: { envClass } })
          )
        }),
      register: (envClass, factory) => Effect.sync(() => void factories.set(envClass, factory)),
      classes: Effect.sync(() => [...factories.keys()].sort())
    })
  })

/** A registry holding `initial`; more classes join through `register` or `layerRegister`. */
export const layer = (initial: Readonly<Record<string, EnvFactory>> = {}): Layer.Layer<EnvRegistry> =>
  Layer.effect(EnvRegistry, make(initial))

/**
 * Registers `envClass` in the registry when the layer is built. The factory's requirements `R` are captured from
 * the layer's context, so the registered factory needs only a Scope.
 */
export const layerRegister = <R>(
  envClass: string,
  factory: EnvFactory<R>
): Layer.Layer<never, never, EnvRegistry | Exclude<R, Scope.Scope>> =>
  Layer.effectDiscard(
    Effect.gen(function* () {
      const registry = yield* EnvRegistry
      // the layer's own Scope must not leak in: an env belongs to its trajectory's scope
      const context = Context.omit(Scope.Scope)(yield* Effect.context<Exclude<R, Scope.Scope>>())
      yield* registry.register(
        envClass,
        (row) => factory(row).pipe(Effect.provideContext(context)) as Effect.Effect<Env, EnvError, Scope.Scope>
      )
    })
  )
