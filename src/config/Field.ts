/**
 * Builders for config fields: a default for an absent key, and bounded numbers. Defaults are given in the encoded
 * (YAML) form, so a nested section's default `{}` is decoded through its own field defaults.
 */
import { Effect, Schema } from "effect"

export const withDefault =
  <S extends Schema.Top>(value: S["Encoded"]) =>
  (self: S) =>
    self.pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))

export const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))
export const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
export const NonNegative = Schema.Finite.check(Schema.isGreaterThanOrEqualTo(0))
export const Positive = Schema.Finite.check(Schema.isGreaterThan(0))
export const Probability = Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 }))

/**
 * A secret given by reference, never inline: `{ env: OPENAI_API_KEY }` in YAML. It is resolved when a layer needs it,
 * and printed as `<redacted>`.
 */
export const SecretRef = Schema.Struct({ env: Schema.NonEmptyString })
export type SecretRef = typeof SecretRef.Type
