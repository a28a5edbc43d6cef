/**
 * Structured outputs for `serve`: a request's format (OpenAI's `response_format`, vLLM's `structured_outputs` and its
 * older `guided_json` / `guided_choice`) read into a JsonGrammar, and the per-request token mask that constrains
 * decoding to it (model/Sampling.ts `Constraint`).
 *
 * Request fields (OpenAI's Chat/Completions API; vLLM's as documented at
 * https://docs.vllm.ai/en/latest/features/structured_outputs/, where the `guided_*` fields were removed in v0.12.0 in
 * favour of `structured_outputs`):
 * - `response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`: the schema (`strict` is
 *   read as always on); `{"type": "json_object"}`: any JSON object; `{"type": "text"}`: unconstrained.
 * - `structured_outputs: {"json": <schema or its JSON text>}`, `{"json_object": true}` or `{"choice": [strings]}`
 *   (vLLM ≥ 0.12); its `regex`, `grammar` and `structural_tag` are refused.
 * - `guided_json: <schema or its JSON text>`, `guided_choice: [strings]` (vLLM < 0.12).
 * At most one of them per request.
 *
 * The mask: each token's bytes are precomputed once per tokenizer (byte tokenizer: ids 0–255 are the bytes; byte-level
 * BPE: the GPT-2 byte alphabet of the token's string; SentencePiece: `<0xNN>` byte fallback and `▁` as a space) and put
 * in a trie; before each draw a walk of the trie from the automaton's state allows exactly the tokens whose bytes all
 * keep it live, pruning a subtree at its first dead byte. Added tokens (special and markup tokens) are never allowed,
 * except the markup tokens a constraint is given (a tool call's `<tool_call>`, which a model writes as one token); the
 * stop tokens are allowed only where the output may end. The walk's masks are memoised per automaton state.
 */
import type * as Sampling from "../model/Sampling.ts"
import type { TokenizerImpl } from "../tokenizer/Tokenizer.ts"
import * as JsonGrammar from "./JsonGrammar.ts"
import * as RequestBody from "./RequestBody.ts"

/** A request's format that cannot be served: `param` names the request field, the message the schema keyword. */
export class FormatError extends Error {
  readonly param: string
  constructor(message: string, param: string) {
    super(message)
    this.param = param
  }
}

type Json = RequestBody.Json

/** A schema given as an object or as its JSON text (vLLM accepts both). */
const schemaOf = (value: unknown, param: string): JsonGrammar.Grammar => {
  let schema = value
  if (typeof value === "string") {
    try {
      schema = JSON.parse(value)
    } catch {
      throw new FormatError(`${param}: the schema is not valid JSON`, param)
    }
  }
  try {
    return JsonGrammar.compile(schema)
  } catch (e) {
    if (e instanceof JsonGrammar.SchemaError) throw new FormatError(`${param}: ${e.message}`, param)
    throw e
  }
}

const choicesOf = (value: unknown, param: string): JsonGrammar.Grammar => {
  if (!Array.isArray(value) || value.length === 0 || !value.every((v) => typeof v === "string" && v !== "")) {
    throw new FormatError(`${param} must be a non-empty list of non-empty strings`, param)
  }
  return JsonGrammar.choices(value as ReadonlyArray<string>)
}

/** The grammar a request body asks its output to follow; undefined: unconstrained. Throws FormatError. */
export const grammarOf = (body: Json): JsonGrammar.Grammar | undefined => {
  const asked = ["response_format", "structured_outputs", "guided_json", "guided_choice"].filter(
    (k) => body[k] !== undefined && body[k] !== null
  )
  // `response_format: {"type": "text"}` asks for nothing
  const format = body["response_format"]
  const given = asked.filter(
    (k) => !(k === "response_format" && RequestBody.isJson(format) && format["type"] === "text")
  )
  if (given.length > 1) {
    throw new FormatError(`only one of ${given.join(", ")} may be given`, given[1]!)
  }
  const key = given[0]
  if (key === undefined) {
    if (format !== undefined && format !== null && !RequestBody.isJson(format)) {
      throw new FormatError(`"response_format" must be an object`, "response_format")
    }
    return undefined
  }
  const value = body[key]
  switch (key) {
    case "response_format": {
      const f = value as Json
      if (!RequestBody.isJson(f)) throw new FormatError(`"response_format" must be an object`, key)
      if (f["type"] === "json_object") return JsonGrammar.anyObject
      if (f["type"] === "json_schema") {
        const spec = f["json_schema"]
        if (!RequestBody.isJson(spec) || spec["schema"] === undefined) {
          throw new FormatError(`response_format.json_schema.schema is required`, key)
        }
        return schemaOf(spec["schema"], "response_format.json_schema.schema")
      }
      throw new FormatError(
        `response_format.type ${JSON.stringify(f["type"])} is not supported (text, json_object or json_schema)`,
        key
      )
    }
    case "structured_outputs": {
      if (!RequestBody.isJson(value)) throw new FormatError(`"structured_outputs" must be an object`, key)
      const kinds = Object.keys(value).filter((k) => value[k] !== undefined && value[k] !== null && value[k] !== false)
      const known = kinds.filter((k) => k !== "disable_any_whitespace" && k !== "disable_additional_properties")
      const unsupported = known.find((k) => k !== "json" && k !== "json_object" && k !== "choice")
      if (unsupported !== undefined) {
        throw new FormatError(`structured_outputs.${unsupported} is not supported (json, json_object, choice)`, key)
      }
      if (known.length !== 1)
        throw new FormatError(`structured_outputs must hold one of json, json_object, choice`, key)
      if (known[0] === "json") return schemaOf(value["json"], "structured_outputs.json")
      if (known[0] === "choice") return choicesOf(value["choice"], "structured_outputs.choice")
      return JsonGrammar.anyObject
    }
    case "guided_json":
      return schemaOf(value, key)
    default:
      return choicesOf(value, key)
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Token bytes and the trie

/** GPT-2's byte ↔ printable-character table (byte-level BPE vocabularies spell bytes with it). */
const gpt2Bytes: ReadonlyMap<string, number> = (() => {
  const bs: Array<number> = []
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b)
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b)
  for (let b = 0xae; b <= 0xff; b++) bs.push(b)
  const cs = [...bs]
  let n = 0
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b)
      cs.push(256 + n++)
    }
  }
  return new Map(bs.map((b, i) => [String.fromCodePoint(cs[i]!), b]))
})()

const encoder = new TextEncoder()

/** Each token's bytes (undefined: not text, never allowed under a grammar). */
export const tokenBytes = (tokenizer: TokenizerImpl): ReadonlyArray<Uint8Array | undefined> => {
  const added = new Set(tokenizer.addedTokens.map((t) => t.id))
  const out: Array<Uint8Array | undefined> = []
  const pieces: Array<string | undefined> = []
  for (let id = 0; id < tokenizer.vocabSize; id++) {
    pieces.push(added.has(id) ? undefined : tokenizer.idToToken(id))
  }
  if (tokenizer.kind === "byte") {
    for (let id = 0; id < tokenizer.vocabSize; id++) out.push(id < 256 ? Uint8Array.of(id) : undefined)
    return out
  }
  // byte-level BPE when (nearly) every token is spelt in GPT-2's byte alphabet
  const spelt = pieces.filter((p) => p !== undefined && p.length > 0)
  const byteLevel = spelt.filter((p) => [...p!].every((ch) => gpt2Bytes.has(ch))).length >= 0.99 * spelt.length
  for (const piece of pieces) {
    if (piece === undefined || piece.length === 0) out.push(undefined)
    else if (byteLevel) {
      const chars = [...piece]
      out.push(chars.every((ch) => gpt2Bytes.has(ch)) ? Uint8Array.from(chars, (ch) => gpt2Bytes.get(ch)!) : undefined)
    } else {
      const fallback = /^<0x([0-9A-Fa-f]{2})>$/.exec(piece)
      out.push(
        fallback !== null
          ? Uint8Array.of(Number.parseInt(fallback[1]!, 16))
          : encoder.encode(piece.replaceAll("▁", " "))
      )
    }
  }
  return out
}

interface TrieNode {
  readonly children: Map<number, TrieNode>
  readonly ids: Array<number>
}

/** The tokens' bytes as a trie, and the tokenizer's vocabulary size. */
export interface TokenTrie {
  readonly root: TrieNode
  readonly vocabSize: number
  readonly bytes: ReadonlyArray<Uint8Array | undefined>
}

const tries = new WeakMap<TokenizerImpl, TokenTrie>()

/** The tokenizer's trie, built on first use and kept with the tokenizer. */
export const trieOf = (tokenizer: TokenizerImpl): TokenTrie => {
  const known = tries.get(tokenizer)
  if (known !== undefined) return known
  const bytes = tokenBytes(tokenizer)
  const root: TrieNode = { children: new Map(), ids: [] }
  bytes.forEach((b, id) => {
    if (b === undefined || b.length === 0) return
    let node = root
    for (const c of b) {
      let child = node.children.get(c)
      if (child === undefined) {
        child = { children: new Map(), ids: [] }
        node.children.set(c, child)
      }
      node = child
    }
    node.ids.push(id)
  })
  const trie = { root, vocabSize: tokenizer.vocabSize, bytes }
  tries.set(tokenizer, trie)
  return trie
}

/** The tokens (ids) whose bytes keep `state` live. */
export const allowedTokens = (trie: TokenTrie, state: JsonGrammar.State): Array<number> => {
  const allowed: Array<number> = []
  const walk = (node: TrieNode, s: JsonGrammar.State) => {
    for (const [c, child] of node.children) {
      const next = JsonGrammar.step(s, c)
      if (next === undefined) continue
      for (const id of child.ids) allowed.push(id)
      if (child.children.size > 0) walk(child, next)
    }
  }
  walk(trie.root, state)
  return allowed
}

/**
 * A key of an automaton state for memoising its mask, within one grammar: each frame's fields but its node (which the
 * frames below it determine), a string's length only as far as its limits care, a literal's live options.
 */
const keyOf = (state: JsonGrammar.State): string => {
  const parts: Array<string> = []
  for (let s: JsonGrammar.State | undefined = state; s !== undefined; s = s.up) {
    const f = s.frame
    switch (f.t) {
      case "str":
        parts.push(
          `s${f.phase}${f.pending}${f.lead}:${f.node.max === Number.POSITIVE_INFINITY ? Math.min(f.count, f.node.min) : f.count}`
        )
        break
      case "lit":
        parts.push(`l${f.pos}:${f.alive.join(",")}`)
        break
      case "num":
        parts.push(`n${f.text}`)
        break
      case "value":
        parts.push("v")
        break
      case "obj":
        parts.push(`o${f.phase}${f.next},${f.pos},${f.current},${f.cands.join(",")}`)
        break
      case "anyObj":
        parts.push(`a${f.phase}`)
        break
      case "arr":
        parts.push(`r${f.phase}${f.node.max === Number.POSITIVE_INFINITY ? Math.min(f.count, f.node.min) : f.count}`)
        break
      case "seq":
        parts.push(`q${f.index}`)
        break
      case "switch":
        parts.push(`w${f.phase}${f.pos}:${f.alive.join(",")}`)
        break
      case "rep":
        parts.push("p") // no bound on the count: it changes nothing that may follow
        break
    }
  }
  return parts.join("|")
}

/** Masks memoised per automaton state (the allowed ids), within a budget of ids held. */
export interface MaskMemo {
  readonly masks: Map<string, Int32Array>
  ids: number
}

/** Ids one grammar's memo holds at most (16 MiB). */
const memoBudget = 4 * 2 ** 20

const memos = new WeakMap<TokenTrie, Map<string, MaskMemo>>()

/**
 * The memo of masks for one grammar (named by `key`, e.g. the request's format as JSON) and stop tokens over `trie`,
 * kept across requests: a judge asking with the same schema again walks the trie only for states not seen before.
 * The 16 most recently used grammars are kept per tokenizer.
 */
export const memoFor = (trie: TokenTrie, key: string): MaskMemo => {
  let byGrammar = memos.get(trie)
  if (byGrammar === undefined) {
    byGrammar = new Map()
    memos.set(trie, byGrammar)
  }
  const memo = byGrammar.get(key) ?? { masks: new Map(), ids: 0 }
  byGrammar.delete(key)
  byGrammar.set(key, memo) // most recently used last
  if (byGrammar.size > 16) byGrammar.delete(byGrammar.keys().next().value!)
  return memo
}

/**
 * The added tokens whose text is part of one of `texts` (e.g. `<tool_call>` in a call's opening markup), as id → bytes:
 * a model writes such markup as one token, which the byte trie does not hold.
 */
export const markupTokens = (tokenizer: TokenizerImpl, texts: ReadonlyArray<string>): ReadonlyMap<number, Uint8Array> =>
  new Map(
    tokenizer.addedTokens
      .filter((t) => t.content !== "" && texts.some((text) => text.includes(t.content)))
      .map((t) => [t.id, encoder.encode(t.content)])
  )

/**
 * A fresh per-request constraint: the grammar's automaton over the tokenizer's tokens. `stopTokenIds` are allowed
 * once the output may end (an output that can go on, e.g. a bare number, ends at a stop token or when nothing can
 * follow). `markup` (`markupTokens`) are allowed where their bytes fit outside JSON values. Masks are memoised per
 * state in `memo` (shared by the requests of one grammar and markup).
 */
export const constraint = (
  grammar: JsonGrammar.Grammar,
  trie: TokenTrie,
  stopTokenIds: ReadonlyArray<number>,
  memo: MaskMemo = { masks: new Map(), ids: 0 },
  markup: ReadonlyMap<number, Uint8Array> = new Map()
): Sampling.Constraint => {
  let state = JsonGrammar.start(grammar)
  return {
    mask: (logits) => {
      const key = keyOf(state)
      let allowed = memo.masks.get(key)
      if (allowed === undefined) {
        const ids = allowedTokens(trie, state)
        // a markup token stands for the text around values, never for characters inside one (a string argument)
        if (!JsonGrammar.inValue(state)) {
          for (const [id, bytes] of markup) {
            const next = JsonGrammar.run(state, bytes)
            if (next !== undefined && !JsonGrammar.inValue(next)) ids.push(id)
          }
        }
        if (JsonGrammar.accepting(state)) ids.push(...stopTokenIds)
        allowed = Int32Array.from(ids.filter((id) => id < logits.length))
        if (memo.ids + allowed.length <= memoBudget) {
          memo.masks.set(key, allowed)
          memo.ids += allowed.length
        }
      }
      const keep = new Float32Array(allowed.length)
      for (let i = 0; i < allowed.length; i++) keep[i] = logits[allowed[i]!]!
      logits.fill(Number.NEGATIVE_INFINITY)
      for (let i = 0; i < allowed.length; i++) logits[allowed[i]!] = keep[i]!
      return allowed.length > 0
    },
    accept: (token) => {
      const bytes = trie.bytes[token] ?? markup.get(token)
      const next = bytes === undefined ? undefined : JsonGrammar.run(state, bytes)
      if (next === undefined) throw new Error(`StructuredOutput: token ${token} was drawn but the mask forbids it`)
      state = next
      return JsonGrammar.final(state)
    }
  }
}
