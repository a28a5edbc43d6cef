/**
 * Errors shared across services (design.md, "Errors: who handles what"). Service-specific errors live with their
 * service. All are Schema-backed so they serialise across worker boundaries.
 */
import { Schema } from "effect"

/** A config file or override is invalid: `path` is the dotted key path, `message` what was expected. */
export class ConfigError extends Schema.TaggedError<ConfigError>()("ConfigError", {
  file: Schema.optionalKey(Schema.String),
  path: Schema.String,
  message: Schema.String
}) {}

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
    return this.path === undefined || this.path === "" ? `${where}: ${this.detail}` : `${where}: ${this.path}: ${this.detail}`
  }
}

/** A checkpoint directory is missing, incomplete or inconsistent with the model config. */
export class CheckpointError extends Schema.TaggedError<CheckpointError>()("CheckpointError", {
  path: Schema.String,
  message: Schema.String
}) {}

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
