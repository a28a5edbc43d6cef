/**
 * Errors shared across services (design.md, "Errors: who handles what"). Service-specific errors live with their
 * service. All are Schema-backed so they serialise across worker boundaries.
 */
import { Schema } from "effect"
import { CliError } from "effect/cli"

/** A config file or override is invalid: `path` is the dotted key path, `message` what was expected. */
export class ConfigError extends Schema.TaggedError<ConfigError>()("ConfigError", {
  file: Schema.optionalKey(Schema.String),
  path: Schema.String,
  message: Schema.String
}) {
  /** What the CLI prints: `FILE: message` (the message starts with the key path). */
  override get [CliError.userMessage](): string {
    return this.file === undefined ? `invalid config: ${this.message}` : `invalid config ${this.file}: ${this.message}`
  }
}

/** A dataset row or file is invalid. `row` is 1-based (the line number for JSONL). */
export class DatasetError extends Schema.TaggedError<DatasetError>()("DatasetError", {
  file: Schema.String,
  row: Schema.optionalKey(Schema.Int),
  path: Schema.optionalKey(Schema.String),
  detail: Schema.String
}) {
  /** `FILE:ROW: path: detail`, the form editors and terminals turn into links. */
  override get message(): string {
    const where = this.row === undefined ? this.file : `${this.file}:${this.row}`
    return this.path === undefined || this.path === ""
      ? `${where}: ${this.detail}`
      : `${where}: ${this.path}: ${this.detail}`
  }
  override get [CliError.userMessage](): string {
    return this.message
  }
}

/** A checkpoint directory is missing, incomplete or inconsistent with the model config. */
export class CheckpointError extends Schema.TaggedError<CheckpointError>()("CheckpointError", {
  path: Schema.String,
  message: Schema.String
}) {
  override get [CliError.userMessage](): string {
    return `checkpoint ${this.path}: ${this.message}`
  }
}

/**
 * The policy sampled a token whose log-prob is not finite (NaN or ±Infinity): its weights have diverged (a learning
 * rate far too high, no gradient clipping). Nothing sampled from such weights can be trained on or logged, so the run
 * stops here with this error rather than carry on with garbage.
 */
export class PolicyDivergedError extends Schema.TaggedError<PolicyDivergedError>()("PolicyDivergedError", {
  version: Schema.Int, // the policy version that sampled it
  prompt: Schema.String, // the prompt uid
  logprob: Schema.String // the offending value, as text (NaN, Infinity, -Infinity)
}) {
  override get message(): string {
    return (
      `policy version ${this.version} sampled a token with log-prob ${this.logprob} (prompt ${this.prompt}): its weights ` +
      "have diverged. Resume from a checkpoint before the divergence with a lower trainer.optimizer.lr or " +
      "trainer.optimizer.max_grad_norm > 0"
    )
  }
}

/** The inference engine could not serve a request. Transport failures are retryable. */
export class InferenceError extends Schema.TaggedError<InferenceError>()("InferenceError", {
  engine: Schema.String,
  reason: Schema.Literals(["Unreachable", "BadResponse", "Overloaded", "Internal"]),
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return this.reason === "Unreachable" || this.reason === "Overloaded"
  }
}
