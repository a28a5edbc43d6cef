import { Schema } from "effect"
import { NonNegativeInt, Positive, PositiveInt, SecretRef, withDefault } from "./Field.ts"

/** When `train` checkpoints (RUN_DIR/checkpoints/step-N) and what it resumes from. */
export const CheckpointConfig = Schema.Struct({
  interval: NonNegativeInt.pipe(withDefault(0)), // steps between checkpoints; 0 = only at the end
  keep_n: PositiveInt.pipe(withDefault(2)), // the newest this many checkpoints are kept, older ones deleted
  resume: Schema.optionalKey(Schema.NonEmptyString) // "latest" or a checkpoint directory
})
export type CheckpointConfig = typeof CheckpointConfig.Type

/** Where a training run's spans (and metrics) go over OTLP/HTTP: an OpenTelemetry collector, Jaeger, Tempo, … */
export const OtlpConfig = Schema.Struct({
  // the collector's base URL: traces go to <endpoint>/v1/traces, metrics to <endpoint>/v1/metrics
  endpoint: Schema.NonEmptyString.pipe(withDefault("http://127.0.0.1:4318")),
  protocol: Schema.Literals(["http/protobuf", "http/json"]).pipe(withDefault("http/protobuf")), // the OTLP/HTTP body
  // sent with every export; a value is a string or { env: NAME } (a secret read from the environment, never inline)
  headers: Schema.Record(Schema.String, Schema.Union([Schema.String, SecretRef])).pipe(withDefault({})),
  service_name: Schema.NonEmptyString.pipe(withDefault("effect-rl")), // the resource's service.name
  // more resource attributes, e.g. { wandb.entity: my-team, wandb.project: my-project } for W&B Weave
  resource_attributes: Schema.Record(Schema.String, Schema.String).pipe(withDefault({})),
  metrics: Schema.Boolean.pipe(withDefault(true)), // also export the training metrics (gauges) to <endpoint>/v1/metrics
  export_interval_seconds: Positive.pipe(withDefault(5)) // batches are sent this often, and the rest when the run ends
})
export type OtlpConfig = typeof OtlpConfig.Type

/** A Prometheus scrape endpoint serving the latest value of every training metric while `train` runs. */
export const PrometheusConfig = Schema.Struct({
  host: Schema.NonEmptyString.pipe(withDefault("127.0.0.1")), // 0.0.0.0 to be scraped from other machines
  port: NonNegativeInt.check(Schema.isLessThanOrEqualTo(65_535)).pipe(withDefault(9464)), // 0 = any free port
  path: Schema.NonEmptyString.pipe(withDefault("/metrics")), // the scrape path
  prefix: Schema.String.pipe(withDefault("effect_rl")) // `loss/policy` is served as effect_rl_loss_policy
})
export type PrometheusConfig = typeof PrometheusConfig.Type

/**
 * Where a run's tracking goes: `jsonl` (metrics.jsonl in the run directory, which the report, replay and resume
 * read: always on), `otlp` (spans of steps, groups, turns, tool calls and weight syncs, and the metrics, to an OTLP/HTTP
 * collector), `prometheus` (a scrape endpoint).
 */
export const TrackingBackend = Schema.Literals(["jsonl", "otlp", "prometheus"])
export type TrackingBackend = typeof TrackingBackend.Type

/** The run directory, and what a run writes and shows there and elsewhere. */
export const LoggingConfig = Schema.Struct({
  run_dir: Schema.NonEmptyString.pipe(withDefault("runs/latest")), // the run directory (train --run-dir overrides it)
  // not read by any command yet: the global flag `--log-level` (e.g. `--log-level debug`) sets what stderr shows
  level: Schema.Literals(["Debug", "Info", "Warn", "Error"]).pipe(withDefault("Info")),
  progress: Schema.Boolean.pipe(withDefault(true)), // a live progress line on stderr: step, reward, pass@n, ETA
  // write every trajectory group to episodes.jsonl (replay reads it)
  record_episodes: Schema.Boolean.pipe(withDefault(true)),
  report: Schema.Boolean.pipe(withDefault(true)), // rewrite report.html after each evaluation and checkpoint
  backends: Schema.Array(TrackingBackend).pipe(withDefault(["jsonl"])), // e.g. [jsonl, otlp, prometheus]
  otlp: OtlpConfig.pipe(withDefault({})), // read when backends has otlp
  prometheus: PrometheusConfig.pipe(withDefault({})) // read when backends has prometheus
}).check(
  Schema.makeFilter(
    (l) =>
      l.backends.includes("jsonl") || {
        path: ["backends"],
        issue: "backends must include jsonl: metrics.jsonl is the run's own record (report, replay and resume read it)"
      }
  )
)
export type LoggingConfig = typeof LoggingConfig.Type

/** The prompts: SkyRL rows for training and held-out evaluation. */
export const DataConfig = Schema.Struct({
  train: Schema.Array(Schema.NonEmptyString).pipe(withDefault([])), // .json, .jsonl or .parquet files
  // held-out files, evaluated before, during (trainer.eval_interval) and after training
  val: Schema.Array(Schema.NonEmptyString).pipe(withDefault([])),
  // a shuffle of the training prompts every epoch, seeded by trainer.seed; else the file order
  shuffle: Schema.Boolean.pipe(withDefault(true)),
  // keep only the rows whose extra_info.<key> is one of the values (all keys must match), e.g. {family: [unit_sum]};
  // applied to train and val before max_prompts / max_eval_prompts
  include: Schema.optionalKey(
    Schema.Record(Schema.NonEmptyString, Schema.Array(Schema.Union([Schema.String, Schema.Number, Schema.Boolean])))
  ),
  max_prompts: Schema.optionalKey(PositiveInt), // use only the first N training prompts
  max_eval_prompts: Schema.optionalKey(PositiveInt) // evaluate on the first N held-out prompts
})
export type DataConfig = typeof DataConfig.Type
