/**
 * Statistics of a dataset for `data inspect`: counts by env class and data source, prompt length distribution, and
 * every bad row (validation continues past them so one run lists them all).
 */
import type { DatasetError } from "../domain/Errors.ts"
import type { PromptRow } from "../domain/PromptRow.ts"

export interface Summary {
  readonly count: number
  readonly min: number
  readonly mean: number
  readonly p50: number
  readonly p95: number
  readonly max: number
}

export interface Stats {
  readonly file: string
  readonly rows: number
  readonly badRows: number
  readonly envClasses: Readonly<Record<string, number>>
  readonly dataSources: Readonly<Record<string, number>>
  readonly promptChars: Summary
  readonly promptMessages: Summary
  readonly withGroundTruth: number
}

export const summarise = (values: ReadonlyArray<number>): Summary => {
  if (values.length === 0) return { count: 0, min: 0, mean: 0, p50: 0, p95: 0, max: 0 }
  const sorted = [...values].sort((a, b) => a - b)
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
  const mean = sorted.reduce((a, b) => a + b, 0) / sorted.length
  return {
    count: sorted.length,
    min: sorted[0]!,
    mean: Math.round(mean * 10) / 10,
    p50: at(0.5),
    p95: at(0.95),
    max: sorted[sorted.length - 1]!
  }
}

export class Accumulator {
  private readonly envClasses = new Map<string, number>()
  private readonly dataSources = new Map<string, number>()
  private readonly chars: Array<number> = []
  private readonly messages: Array<number> = []
  private groundTruth = 0
  readonly errors: Array<DatasetError> = []

  readonly file: string

  constructor(file: string) {
    this.file = file
  }

  add(row: PromptRow): void {
    this.envClasses.set(row.env_class, (this.envClasses.get(row.env_class) ?? 0) + 1)
    this.dataSources.set(row.data_source, (this.dataSources.get(row.data_source) ?? 0) + 1)
    this.chars.push(row.prompt.reduce((n, m) => n + m.content.length, 0))
    this.messages.push(row.prompt.length)
    if (row.reward_spec?.ground_truth !== undefined) this.groundTruth++
  }

  fail(error: DatasetError): void {
    this.errors.push(error)
  }

  stats(): Stats {
    return {
      file: this.file,
      rows: this.chars.length + this.errors.length,
      badRows: this.errors.length,
      envClasses: Object.fromEntries(this.envClasses),
      dataSources: Object.fromEntries(this.dataSources),
      promptChars: summarise(this.chars),
      promptMessages: summarise(this.messages),
      withGroundTruth: this.groundTruth
    }
  }
}
