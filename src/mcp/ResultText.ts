/**
 * The text a model is shown for a tool result: the result's content flattened to text, capped at a length with a
 * mark where it was cut.
 */

type Content = { readonly type: string; readonly [key: string]: unknown }

const contentText = (item: Content): string => {
  switch (item.type) {
    case "text":
      return String(item["text"] ?? "")
    case "resource": {
      const r = item["resource"] as { uri?: string; text?: string } | undefined
      return r?.text ?? `[resource ${r?.uri ?? ""}]`
    }
    case "resource_link":
      return `[resource ${String(item["uri"] ?? "")}]`
    default:
      return `[${item.type}${item["mimeType"] === undefined ? "" : ` ${String(item["mimeType"])}`}]`
  }
}

/** The text a model is shown for a result: its content joined by newlines, else its structured content as JSON. */
export const resultText = (result: { readonly content?: unknown; readonly structuredContent?: unknown }): string => {
  const content = Array.isArray(result.content) ? (result.content as ReadonlyArray<Content>) : []
  if (content.length === 0 && result.structuredContent !== undefined) return JSON.stringify(result.structuredContent)
  return content.length === 1 ? contentText(content[0]!) : content.map(contentText).join("\n")
}

/** Caps `text` at `max` characters; the cut is marked so the model (and a reader) knows output is missing. */
export const truncate = (text: string, max: number): { readonly text: string; readonly truncated: boolean } =>
  text.length <= max
    ? { text, truncated: false }
    : { text: `${text.slice(0, max)}…[truncated ${text.length - max} chars]`, truncated: true }
