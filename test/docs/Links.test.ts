/**
 * The docs' relative links hold: every link in README.md and docs/*.md that is not a URL names a file that exists, and
 * every `#anchor` (in the page, or `file.md#anchor`) names a heading of that file, by GitHub's slug rules.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { dirname, join, relative } from "node:path"
import { assert, describe, it } from "@effect/vitest"

const root = join(import.meta.dirname, "..", "..")
const pages = [
  "README.md",
  ...readdirSync(join(root, "docs"))
    .filter((f) => f.endsWith(".md"))
    .sort()
    .map((f) => `docs/${f}`)
]

/** The text outside fenced code blocks (``` or ~~~), line by line; fenced lines are blanked, so numbers still hold. */
const prose = (markdown: string): Array<string> => {
  let fence: string | undefined
  return markdown.split("\n").map((line) => {
    const marker = /^ {0,3}(`{3,}|~{3,})/.exec(line)?.[1]
    if (fence === undefined) {
      if (marker === undefined) return line
      fence = marker
      return ""
    }
    if (marker !== undefined && marker[0] === fence[0] && marker.length >= fence.length && line.trim() === marker) {
      fence = undefined
    }
    return ""
  })
}

/** Code spans of any backtick length (`` `a` ``, ```` ``` ````) taken out, so that what they hold is not read as links. */
const withoutCodeSpans = (text: string): string => text.replace(/(?<!`)(`+)(?!`)[\s\S]*?(?<!`)\1(?!`)/g, "")

/**
 * GitHub's heading anchor: the heading's text as rendered (code marks, emphasis marks and link targets gone), lower
 * case, every character that is not a letter, digit, space, hyphen or underscore dropped, spaces turned to hyphens.
 */
const slug = (heading: string): string =>
  heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/<[^>]+>/g, "")
    .replace(/[`*]/g, "")
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "")
    .replace(/ /g, "-")

/** Every anchor a page has: its headings' slugs (the second of a name gets `-1`, …) and explicit `id`/`name`s. */
const anchors = (markdown: string): Set<string> => {
  const seen = new Map<string, number>()
  const found = new Set<string>()
  for (const line of prose(markdown)) {
    const heading = /^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1]
    if (heading !== undefined) {
      const base = slug(heading)
      const n = seen.get(base) ?? 0
      seen.set(base, n + 1)
      found.add(n === 0 ? base : `${base}-${n}`)
    }
    for (const m of line.matchAll(/<a\s[^>]*(?:id|name)="([^"]+)"/g)) found.add(m[1]!)
  }
  return found
}

interface Link {
  readonly page: string
  readonly line: number
  readonly target: string
}

/** The inline links and images (`[text](target)`), and reference definitions (`[id]: target`), outside code. */
const links = (page: string, markdown: string): Array<Link> =>
  prose(withoutCodeSpans(markdown)).flatMap((line, i) => [
    ...[...line.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => ({
      page,
      line: i + 1,
      target: m[1]!
    })),
    ...[...line.matchAll(/^ {0,3}\[[^\]]+\]:\s+<?([^\s>]+)>?/g)].map((m) => ({ page, line: i + 1, target: m[1]! }))
  ])

const isRelative = (target: string) => !/^[a-z][a-z0-9+.-]*:/i.test(target) && !target.startsWith("//")

/** What is wrong with one relative link (paths from the repository root); undefined when nothing is. */
const check = (
  link: Link,
  read: (path: string) => string | undefined,
  exists: (path: string) => boolean
): string | undefined => {
  const [file, anchor] = link.target.split("#", 2) as [string, string | undefined]
  const path = file === "" ? link.page : join(dirname(link.page), decodeURIComponent(file))
  if (!exists(path)) return `${link.page}:${link.line}: ${link.target}: no file ${path}`
  if (anchor === undefined || anchor === "" || !path.endsWith(".md")) return undefined
  const text = read(path)
  if (text === undefined || anchors(text).has(decodeURIComponent(anchor).toLowerCase())) return undefined
  return `${link.page}:${link.line}: ${link.target}: ${path} has no heading #${anchor}`
}

const readPage = (path: string) => {
  try {
    return readFileSync(join(root, path), "utf8")
  } catch {
    return undefined
  }
}
const existsHere = (path: string) => !relative(root, join(root, path)).startsWith("..") && existsSync(join(root, path))
const all = pages.flatMap((page) => links(page, readPage(page) ?? "")).filter((l) => isRelative(l.target))

describe("slug", () => {
  it("follows GitHub's rules: lower case, spaces to hyphens, punctuation dropped but hyphens and underscores", () => {
    assert.strictEqual(
      slug("Quickstart: held-out success before → after RL"),
      "quickstart-held-out-success-before--after-rl"
    )
    assert.strictEqual(
      slug("Taking a trained agent to llama.cpp / Ollama"),
      "taking-a-trained-agent-to-llamacpp--ollama"
    )
    assert.strictEqual(slug("GPU: `backend.name: webgpu`"), "gpu-backendname-webgpu")
    assert.strictEqual(slug("Weight updates on vLLM, SGLang or `serve`"), "weight-updates-on-vllm-sglang-or-serve")
    assert.strictEqual(slug("`max_seq_len` and **bold**"), "max_seq_len-and-bold")
  })

  it("numbers a repeated heading's anchor: the second is -1", () => {
    assert.deepStrictEqual([...anchors("# Usage\n\n## Usage\n\n```\n# not a heading\n```\n")], ["usage", "usage-1"])
  })
})

describe("README.md and docs/*.md", () => {
  it("are read for links: inline, images and definitions, never inside code", () => {
    const sample = "[a](x.md) ![b](img/y.png) `[c](code.md)`\n```\n[d](fenced.md)\n```\n[e]: z.md#top\n"
    assert.deepStrictEqual(
      links("docs/p.md", sample).map((l) => l.target),
      ["x.md", "img/y.png", "z.md#top"]
    )
    assert.isAbove(all.length, 50)
  })

  it("report a link to a missing file, and an anchor that names no heading", () => {
    const pagesHere: Record<string, string> = { "docs/a.md": "# Title\n\n## Some part\n", "docs/b.md": "" }
    const read = (p: string) => pagesHere[p]
    const exists = (p: string) => p in pagesHere
    const problems = links("docs/b.md", "[1](a.md#some-part) [2](a.md#other) [3](gone.md) [4](#title)")
      .map((l) => check(l, read, exists))
      .filter((p) => p !== undefined)
    assert.deepStrictEqual(problems, [
      "docs/b.md:1: a.md#other: docs/a.md has no heading #other",
      "docs/b.md:1: gone.md: no file docs/gone.md",
      "docs/b.md:1: #title: docs/b.md has no heading #title"
    ])
  })

  it("link only to files that exist", () => {
    const missing = all.map((l) => check({ ...l, target: l.target.split("#")[0]! }, readPage, existsHere))
    assert.deepStrictEqual(
      missing.filter((p) => p !== undefined),
      []
    )
  })

  it("link only to anchors that name a heading of the file they point into", () => {
    const broken = all.filter((l) => l.target.includes("#")).map((l) => check(l, readPage, existsHere))
    assert.deepStrictEqual(
      broken.filter((p) => p !== undefined),
      []
    )
  })
})
