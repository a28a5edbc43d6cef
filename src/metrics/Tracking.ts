/**
 * Tracking backends beyond metrics.jsonl (`logging.backends`), through Effect's own observability modules:
 *
 * - `otlp`: spans over OTLP/HTTP (`OtlpTracer`) and the training metrics as gauges (`OtlpMetrics`). Only the spans
 *   named in `domain/Spans.ts` are exported (a step, a rollout group, an agent turn, a tool call, a weight sync, the
 *   run); every other span the program opens (each `Effect.fn`) stays local and is transparent, so an exported span's
 *   parent is its nearest exported ancestor. Groups record their span's trace id in `episodes.jsonl` (`trace`).
 * - `prometheus`: a scrape endpoint (`PrometheusMetrics`, text exposition format) serving the latest value of every
 *   metric the run recorded: `Metrics.record` sets one gauge per metric name, which Prometheus sees as
 *   `<prefix>_<name with every character outside [a-zA-Z0-9_:] as _>`, e.g. `loss/policy` → `effect_rl_loss_policy`,
 *   `eval/all/avg_score` → `effect_rl_eval_all_avg_score`.
 *
 * Both live as long as the layer: the server closes and the exporters send what is left when the run ends.
 */
import { Config, Effect, Layer, Option, Redacted, Tracer } from "effect"
import type { HttpClient } from "effect/http"
import { HttpRouter, HttpServer } from "effect/http"
import { OtlpExporter, OtlpMetrics, OtlpSerialization, OtlpTracer, PrometheusMetrics } from "effect/observability"
import type { OtlpConfig, PrometheusConfig } from "../config/StoreConfig.ts"
import { ConfigError } from "../domain/Errors.ts"
import * as Spans from "../domain/Spans.ts"

/**
 * A tracer that hands the spans named in `Spans.tracked` to `inner` and keeps every other span local (never exported):
 * a tracked span's parent is its nearest tracked ancestor (or a span from outside the program, e.g. a propagated one).
 */
export const filtered = (inner: Tracer.Tracer): Tracer.Tracer => {
  const exported = new WeakSet<Tracer.AnySpan>()
  // a span of this program that is not exported (opened here, or before this tracer was installed) is skipped; an
  // external span (a propagated parent) is kept
  const visible = (parent: Option.Option<Tracer.AnySpan>): Option.Option<Tracer.AnySpan> => {
    let p = parent
    while (Option.isSome(p) && p.value._tag === "Span" && !exported.has(p.value)) p = p.value.parent
    return p
  }
  return Tracer.make({
    span(options) {
      const parent = visible(options.parent)
      if (Spans.tracked.has(options.name)) {
        const span = inner.span({ ...options, parent })
        exported.add(span)
        return span
      }
      // a local span: never handed to the exporter; its trace id is its visible parent's, so the spans under it that
      // are exported stay in that trace
      return new Tracer.NativeSpan({ ...options, parent })
    },
    ...(inner.context === undefined ? {} : { context: inner.context })
  })
}

/** The export's headers: strings as they are, `{ env: NAME }` from the environment (an unset one is a ConfigError). */
const headersOf = (headers: OtlpConfig["headers"]) =>
  Effect.forEach(Object.entries(headers), ([name, value]) =>
    typeof value === "string"
      ? Effect.succeed([name, value] as const)
      : Config.Redacted(value.env).pipe(
          Effect.map((r) => [name, Redacted.value(r)] as const),
          Effect.mapError(
            () =>
              new ConfigError({
                path: `logging.otlp.headers.${name}`,
                message: `logging.otlp.headers.${name} names the environment variable ${value.env}, which is not set: set it, or remove the header`
              })
          )
        )
  ).pipe(Effect.map((entries) => Object.fromEntries(entries)))

/** Spans (and, with `metrics`, the metrics) to `config.endpoint` over OTLP/HTTP. */
export const otlp = (config: OtlpConfig): Layer.Layer<never, ConfigError, HttpClient.HttpClient> =>
  Layer.unwrap(
    Effect.gen(function* () {
      const headers = yield* headersOf(config.headers)
      const base = config.endpoint.replace(/\/+$/, "")
      const common = {
        resource: { serviceName: config.service_name, attributes: config.resource_attributes },
        headers,
        exportInterval: `${config.export_interval_seconds} seconds` as const
      }
      const tracer = Layer.effect(
        Tracer.Tracer,
        Effect.map(OtlpTracer.make({ url: `${base}/v1/traces`, ...common }), filtered)
      )
      const metrics = config.metrics ? OtlpMetrics.layer({ url: `${base}/v1/metrics`, ...common }) : Layer.empty
      const serialization =
        config.protocol === "http/json" ? OtlpSerialization.layerJson : OtlpSerialization.layerProtobuf
      const announce = Layer.effectDiscard(
        Effect.logInfo(`otlp: exporting spans${config.metrics ? " and metrics" : ""} to ${base}`)
      )
      return Layer.mergeAll(tracer, metrics, Layer.succeed(Spans.RecordTrace, true), announce).pipe(
        Layer.provide(OtlpExporter.layerFlusher),
        Layer.provide(serialization)
      )
    })
  )

/** The metrics scrape endpoint at `config.path` of the HttpServer given. */
export const prometheus = (config: PrometheusConfig): Layer.Layer<never, never, HttpServer.HttpServer> =>
  Layer.mergeAll(
    HttpRouter.serve(
      PrometheusMetrics.layerHttp({ path: config.path as HttpRouter.PathInput, prefix: config.prefix }),
      {
        disableLogger: true,
        disableListenLog: true
      }
    ),
    Layer.effectDiscard(
      Effect.gen(function* () {
        const server = yield* HttpServer.HttpServer
        yield* Effect.logInfo(
          `prometheus: serving metrics on ${HttpServer.formatAddress(server.address)}${config.path}`
        )
      })
    )
  )
