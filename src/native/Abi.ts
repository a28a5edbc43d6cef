/**
 * The addon's ABI: every function native/ exports, with its arguments in the order JS passes them. This table is the
 * only place the order is written down. Both sides are derived from it:
 * - TS: `bind` turns the loaded addon into typed functions that take one record of named fields (`Args<"matmul">`),
 *   so call sites never count positions;
 * - C++: src/native/AbiHeader.ts renders native/abi.generated.h (`node native/generate-abi.mjs`): per function a
 *   struct of its fields, the reader that fills it from the call (checking the argument count and types) and the
 *   exported entry point. A kernel is `napi_value Matmul(Args& args, const MatmulArgs& in)` and reads `in.bias`, so a
 *   renamed or retyped field stops the build; test/native/Abi.test.ts fails while the header is stale.
 * `hash` (of names, kinds and order) is compiled into the addon and checked on load: an addon built from another
 * table is reported unavailable (rebuild: `node native/install.mjs`) rather than called with shifted arguments.
 *
 * Buffers are byte offsets into the wasm heap (`heap`, passed first), or, when `heap` is null, absolute addresses (the
 * `native` backend's tensors live in JS memory, each at its own address: `addressOf`); strides, sizes and indices
 * count elements.
 */
import { createHash } from "node:crypto"

/**
 * How one argument crosses from JS to C++.
 * - `heap`: the wasm heap, a Uint8Array (C++ `Heap`: base and length, for bounds checks); null: buffers are absolute
 *   addresses (C++ `Heap` with base 0 and no upper bound)
 * - `f32Buffer`, `i32Buffer`, `byteBuffer`: byte offset of a tensor's data in the heap (C++ `int64_t`); `byteBuffer`
 *   when the element type is given by another argument. A trailing `?`: −1 means "none".
 * - `int32Array`: an Int32Array passed by reference (C++ `Int32s`); `int32Array?` also takes null
 * - `view`: any typed array or DataView, by reference (C++ `View`: its first byte and byte length)
 * - `string`: a JS string (C++ `std::string`)
 * - `int` (C++ `int`), `i64` (C++ `int64_t`), `f32` (C++ `float`), `f64` (C++ `double`): a JS number, converted
 * - `bool`: a JS boolean
 * - `i64x4`: four integers, passed as four arguments (C++ `int64_t[4]`)
 */
export type Kind =
  | "heap"
  | "view"
  | "string"
  | "f32Buffer"
  | "f32Buffer?"
  | "i32Buffer"
  | "byteBuffer"
  | "int32Array"
  | "int32Array?"
  | "int"
  | "i64"
  | "f32"
  | "f64"
  | "bool"
  | "i64x4"

/** What a function hands back: nothing, a boolean, a number, or the addon's self-description (`info`). */
export type Returns = "void" | "bool" | "number" | "info"

/** [field name, kind] or [field name, kind, note for the C++ field]. */
export type Arg = readonly [name: string, kind: Kind, note?: string]

export interface FunctionSpec {
  /** What it computes, in the kernel's own notation; becomes the comment above the C++ struct. */
  readonly doc: string
  readonly args: ReadonlyArray<Arg>
  readonly returns: Returns
}

const heap = ["heap", "heap"] as const

export const functions = {
  matmul: {
    doc:
      "out[b] = act(op(A[ia(b)]) · op(B[ib(b)]) + bias). ia(b) is aBatchIndex[b] when given (general batch " +
      "broadcasting), else b · aBatchStride; likewise ib. bias is a [N] row.",
    args: [
      heap,
      ["a", "f32Buffer"],
      ["b", "f32Buffer"],
      ["out", "f32Buffer"],
      ["batch", "i64"],
      ["aBatchStride", "i64", "elements"],
      ["bBatchStride", "i64", "elements"],
      ["m", "int"],
      ["n", "int"],
      ["k", "int"],
      ["transposeA", "bool"],
      ["transposeB", "bool"],
      ["bias", "f32Buffer?"],
      ["activation", "int", "Activation"],
      ["alpha", "f32", "leaky ReLU slope"],
      ["aBatchIndex", "int32Array?", "element offset of each batch's A"],
      ["bBatchIndex", "int32Array?", "element offset of each batch's B"]
    ],
    returns: "void"
  },
  binary: {
    doc:
      "out[i0..i3] = op(a[Σ ik·aStrides[k]], b[Σ ik·bStrides[k]]) over a contiguous 4-d out: float32 in, float32 out " +
      "(compare = false: BinaryOp) or bool bytes (compare = true: CompareOp).",
    args: [
      heap,
      ["op", "int"],
      ["compare", "bool"],
      ["a", "f32Buffer"],
      ["b", "f32Buffer"],
      ["out", "byteBuffer", "float32, or bool bytes when compare"],
      ["dims", "i64x4"],
      ["aStrides", "i64x4", "elements; 0 where a is broadcast"],
      ["bStrides", "i64x4", "elements; 0 where b is broadcast"]
    ],
    returns: "void"
  },
  unary: {
    doc: "out[i] = op(x[i]) for i < n (UnaryOp; alpha: Step's value at x ≤ 0).",
    args: [heap, ["op", "int"], ["x", "f32Buffer"], ["out", "f32Buffer"], ["n", "i64"], ["alpha", "f32"]],
    returns: "void"
  },
  reduce: {
    doc: "x viewed as [outer, reduce, inner] → out [outer, inner] (ReduceOp).",
    args: [
      heap,
      ["op", "int"],
      ["x", "f32Buffer"],
      ["out", "f32Buffer"],
      ["outer", "i64"],
      ["reduce", "i64"],
      ["inner", "i64"]
    ],
    returns: "void"
  },
  transpose: {
    doc:
      "out (contiguous, outShape) = x read with inStrides: the stride in x of the axis that becomes each out axis. " +
      "Also a strided slice (x offset to the first element).",
    args: [
      heap,
      ["x", "byteBuffer"],
      ["out", "byteBuffer"],
      ["elementBytes", "int", "4 or 1"],
      ["rank", "int"],
      ["outShape", "int32Array"],
      ["inStrides", "int32Array"]
    ],
    returns: "void"
  },
  cast: {
    doc: "out[i] = x[i] converted as `kind` says (CastKind), i < n.",
    args: [heap, ["kind", "int"], ["x", "byteBuffer"], ["out", "byteBuffer"], ["n", "i64"]],
    returns: "void"
  },
  softmax: {
    doc: "softmax (or log-softmax) over the last axis of x [rows, n].",
    args: [heap, ["x", "f32Buffer"], ["out", "f32Buffer"], ["rows", "i64"], ["n", "i64"], ["log", "bool"]],
    returns: "void"
  },
  gather: {
    doc:
      "x [outer, axisDim, inner] → out [outer, count, inner]. Returns false, writing nothing, when an index is " +
      "outside [0, axisDim): the caller raises tfjs' error.",
    args: [
      heap,
      ["x", "byteBuffer"],
      ["indices", "i32Buffer"],
      ["out", "byteBuffer"],
      ["outer", "i64"],
      ["axisDim", "i64"],
      ["count", "i64"],
      ["inner", "i64"],
      ["elementBytes", "int", "4 or 1"]
    ],
    returns: "bool"
  },
  segmentSum: {
    doc: "out[s, :] = Σ_{i: ids[i] = s} x[i, :]; ids outside [0, numSegments) are dropped.",
    args: [
      heap,
      ["x", "f32Buffer"],
      ["segmentIds", "i32Buffer"],
      ["out", "f32Buffer"],
      ["count", "i64"],
      ["inner", "i64"],
      ["numSegments", "i64"]
    ],
    returns: "void"
  },
  adam: {
    doc:
      "One pass of tfjs' AdamOptimizer update in its operation order: m' = m·β1 + g·(1−β1), v' = v·β2 + g²·(1−β2), " +
      "value' = (m'/c1) / (√(v'/c2) + ε) · (−lr) + value, with c1 = 1 − β1ᵗ, c2 = 1 − β2ᵗ.",
    args: [
      heap,
      ["value", "f32Buffer"],
      ["grad", "f32Buffer"],
      ["m", "f32Buffer"],
      ["v", "f32Buffer"],
      ["newValue", "f32Buffer"],
      ["newM", "f32Buffer"],
      ["newV", "f32Buffer"],
      ["n", "i64"],
      ["learningRate", "f32"],
      ["beta1", "f64", "1 − β1 is taken in double, as tfjs does"],
      ["beta2", "f64"],
      ["epsilon", "f32"],
      ["c1", "f32", "1 − β1ᵗ"],
      ["c2", "f32", "1 − β2ᵗ"]
    ],
    returns: "void"
  },
  copyBlocks: {
    doc: "dst[o·dstStride + :chunk] = src[o·srcStride + :chunk] for o < outer, all in bytes (Concat, SplitV).",
    args: [
      heap,
      ["src", "byteBuffer"],
      ["dst", "byteBuffer"],
      ["outer", "i64"],
      ["srcStride", "i64", "bytes"],
      ["dstStride", "i64", "bytes"],
      ["chunk", "i64", "bytes"]
    ],
    returns: "void"
  },
  rmsNorm: {
    doc: "out[r] = x[r] · rstd(x[r]) (· w[r mod wRows] when w is given); x, out [rows, n].",
    args: [
      heap,
      ["x", "f32Buffer"],
      ["w", "f32Buffer?"],
      ["out", "f32Buffer"],
      ["rows", "i64"],
      ["n", "i64"],
      ["wRows", "i64"],
      ["eps", "f32"]
    ],
    returns: "void"
  },
  rmsNormGrad: {
    doc:
      "dx = r·(g − x̂·mean(g·x̂)) with g = dy·w, x̂ = x·r, r = rstd(x); dw[k] = Σ_{r ≡ k mod wRows} dy[r]·x̂[r] " +
      "(when dw is given).",
    args: [
      heap,
      ["x", "f32Buffer"],
      ["w", "f32Buffer?"],
      ["dy", "f32Buffer"],
      ["dx", "f32Buffer"],
      ["dw", "f32Buffer?"],
      ["rows", "i64"],
      ["n", "i64"],
      ["wRows", "i64"],
      ["eps", "f32"]
    ],
    returns: "void"
  },
  swiglu: {
    doc:
      "out[r, i] = silu(gate[r, i]) · up[r, i]; rows of the inputs gateStride/upStride floats apart (a joined " +
      "gate|up tensor is two strided views), out contiguous [rows, n].",
    args: [
      heap,
      ["gate", "f32Buffer"],
      ["up", "f32Buffer"],
      ["out", "f32Buffer"],
      ["rows", "i64"],
      ["n", "i64"],
      ["gateStride", "i64"],
      ["upStride", "i64"]
    ],
    returns: "void"
  },
  swigluGrad: {
    doc: "s = σ(g); dgate = dy·u·s·(1 + g·(1 − s)); dup = dy·g·s, all [rows, n].",
    args: [
      heap,
      ["gate", "f32Buffer"],
      ["up", "f32Buffer"],
      ["dy", "f32Buffer"],
      ["dgate", "f32Buffer"],
      ["dup", "f32Buffer"],
      ["rows", "i64"],
      ["n", "i64"]
    ],
    returns: "void"
  },
  rope: {
    doc: "HF rotate_half RoPE (backward: its transpose) of x, out [n, heads, headDim]; cos, sin [n, headDim].",
    args: [
      heap,
      ["x", "f32Buffer"],
      ["cos", "f32Buffer"],
      ["sin", "f32Buffer"],
      ["out", "f32Buffer"],
      ["n", "i64", "tokens"],
      ["heads", "i64"],
      ["headDim", "i64"],
      ["backward", "bool"]
    ],
    returns: "void"
  },
  qkvPrep: {
    doc:
      "Inference. qkv [B·T, (H + 2Hkv)·hd] → q [B·T, H, hd] and the new tokens' k, v: each q/k head RMS-normed by " +
      "norm [H + Hkv, hd] (when given) then rotated (cos, sin [B·T, hd]). keys/values [B, capacity, Hkv, hd] hold the " +
      "P past slots (pastK/pastV [B, pastCapacity, Hkv, hd]), then the new ones; keys == pastK: appended in place.",
    args: [
      heap,
      ["qkv", "f32Buffer"],
      ["cos", "f32Buffer"],
      ["sin", "f32Buffer"],
      ["norm", "f32Buffer?"],
      ["eps", "f32"],
      ["pastK", "f32Buffer?"],
      ["pastV", "f32Buffer?"],
      ["q", "f32Buffer"],
      ["keys", "f32Buffer"],
      ["values", "f32Buffer"],
      ["batch", "i64", "B"],
      ["tokens", "i64", "T"],
      ["pastLength", "i64", "P"],
      ["heads", "i64", "H"],
      ["kvHeads", "i64", "Hkv"],
      ["headDim", "i64", "hd"],
      ["pastCapacity", "i64", "slots per row of pastK/pastV"],
      ["capacity", "i64", "slots per row of keys/values (≥ P + T)"]
    ],
    returns: "void"
  },
  attention: {
    doc:
      "q, out [B, T, H, hd]; k, v [B, capacity, Hkv, hd] of which the first L = length slots count; bias [B, T, L] " +
      "additive; probs [B, H, T, L] kept when given. Query head h reads KV head h / (H / Hkv).",
    args: [
      heap,
      ["q", "f32Buffer"],
      ["k", "f32Buffer"],
      ["v", "f32Buffer"],
      ["bias", "f32Buffer?"],
      ["out", "f32Buffer"],
      ["probs", "f32Buffer?"],
      ["batch", "i64", "B"],
      ["tokens", "i64", "T"],
      ["length", "i64", "L"],
      ["heads", "i64", "H"],
      ["kvHeads", "i64", "Hkv"],
      ["headDim", "i64", "hd"],
      ["scale", "f32"],
      ["capacity", "i64", "slots per row of k, v"]
    ],
    returns: "void"
  },
  attentionGrad: {
    doc: "The gradients of attention (bias is constant) from its kept probs; k, v, dk, dv [B, L, Hkv, hd].",
    args: [
      heap,
      ["q", "f32Buffer"],
      ["k", "f32Buffer"],
      ["v", "f32Buffer"],
      ["probs", "f32Buffer"],
      ["dOut", "f32Buffer"],
      ["dq", "f32Buffer"],
      ["dk", "f32Buffer"],
      ["dv", "f32Buffer"],
      ["batch", "i64", "B"],
      ["tokens", "i64", "T"],
      ["length", "i64", "L"],
      ["heads", "i64", "H"],
      ["kvHeads", "i64", "Hkv"],
      ["headDim", "i64", "hd"],
      ["scale", "f32"]
    ],
    returns: "void"
  },
  linear: {
    doc:
      "out = diag(r) · (a @ b) + residual, a [m, k], b [k, n]; r_i = rstd(a_i) when normEps ≥ 0 (an RMSNorm whose " +
      "weight is folded into b's rows), else 1.",
    args: [
      heap,
      ["a", "f32Buffer"],
      ["b", "f32Buffer"],
      ["out", "f32Buffer"],
      ["m", "int"],
      ["n", "int"],
      ["k", "int"],
      ["residual", "f32Buffer?"],
      ["normEps", "f64", "< 0: no norm"]
    ],
    returns: "void"
  },
  addressOf: {
    doc:
      "The address of a view's first byte (a JS number; exact below 2⁵³). V8 never moves an ArrayBuffer's backing " +
      "store once it has one, and asking for the address gives a small on-heap typed array its own, so the address " +
      "holds as long as the view is alive.",
    args: [["view", "view"]],
    returns: "number"
  },
  loadTensor: {
    doc:
      "Read `rows · cols` elements of type `dtype` (0 float32, 1 bfloat16, 2 float16) at byte `offset` of the file " +
      "at `path` and write them widened to float32 into `out` (transposed to [cols, rows] when `transpose`), in " +
      "blocks through a small buffer: no copy of the file's bytes is kept. Returns the bytes read; throws naming the " +
      "file when it is shorter than the range.",
    args: [
      ["path", "string"],
      ["offset", "i64", "bytes"],
      ["dtype", "int", "0 float32, 1 bfloat16, 2 float16"],
      ["rows", "i64"],
      ["cols", "i64"],
      ["transpose", "bool"],
      ["out", "view", "float32, rows · cols elements"]
    ],
    returns: "number"
  },
  headLogProbs: {
    doc:
      "LM head log-probs without [N, V] logits: z = h · W (W [D, V], or the embedding [V, D] used as Wᵀ when " +
      "`transposed`), out [N, 2] = (z[n, y_n] − lse_n, lse_n − Σ p z), lse [N] kept for the gradient. Returns false, " +
      "writing nothing, when a target is outside [0, V).",
    args: [
      heap,
      ["h", "f32Buffer", "[N, D]"],
      ["w", "f32Buffer", "[D, V], or [V, D] when transposed"],
      ["targets", "i32Buffer", "[N]"],
      ["out", "f32Buffer", "[N, 2]: logp, entropy"],
      ["lse", "f32Buffer", "[N]"],
      ["n", "i64", "N"],
      ["d", "i64", "D"],
      ["v", "i64", "V"],
      ["transposed", "bool"]
    ],
    returns: "bool"
  },
  headLogProbsGrad: {
    doc:
      "The gradient of headLogProbs from its out and lse: gz = gLogp·(onehot − p) − gH·p·(log p + H) per row " +
      "(dy [N, 2] = gLogp, gH), recomputing z per block; dh = gz · Wᵀ, and with trainW dw = hᵀ · gz in W's layout.",
    args: [
      heap,
      ["h", "f32Buffer", "[N, D]"],
      ["w", "f32Buffer", "[D, V], or [V, D] when transposed"],
      ["targets", "i32Buffer", "[N]"],
      ["out", "f32Buffer", "the forward's [N, 2] (its entropy column is read)"],
      ["lse", "f32Buffer", "the forward's [N]"],
      ["dy", "f32Buffer", "[N, 2]"],
      ["dh", "f32Buffer", "[N, D]"],
      ["dw", "f32Buffer", "W's shape; not read or written unless trainW"],
      ["n", "i64", "N"],
      ["d", "i64", "D"],
      ["v", "i64", "V"],
      ["transposed", "bool"],
      ["trainW", "bool", "whether to compute dw: false for a frozen head (a LoRA base's tied embedding)"]
    ],
    returns: "void"
  },
  matmulBf16: {
    doc:
      "out [m, n] = a [m, k] · op(b), b bfloat16 bits stored [k, n] (or [n, k] with transposeB, giving a · bᵀ): frozen " +
      "weights kept as bfloat16, widened a block of columns at a time in each thread's scratch.",
    args: [
      heap,
      ["a", "f32Buffer"],
      ["b", "byteBuffer", "bfloat16 bits"],
      ["out", "f32Buffer"],
      ["m", "int"],
      ["n", "int"],
      ["k", "int"],
      ["transposeB", "bool"]
    ],
    returns: "void"
  },
  toBf16: {
    doc: "out[i] = x[i] rounded to bfloat16 (to nearest even; NaN stays NaN), i < n.",
    args: [
      ["x", "view", "float32"],
      ["out", "view", "bfloat16 bits"],
      ["n", "i64"]
    ],
    returns: "void"
  },
  fromBf16: {
    doc: "out[i] = x[i] widened to float32, i < n.",
    args: [
      ["x", "view", "bfloat16 bits"],
      ["out", "view", "float32"],
      ["n", "i64"]
    ],
    returns: "void"
  },
  setThreads: {
    doc: "Resize the thread pool (threads ≤ 0: one per hardware thread).",
    args: [["threads", "int"]],
    returns: "void"
  },
  mallocTrim: {
    doc:
      "Give the C allocator's free memory back to the system (glibc's malloc_trim): true when some was. A no-op " +
      "returning false where the C library is not glibc.",
    args: [],
    returns: "bool"
  },
  info: {
    doc: "The build (BLAS, SIMD, ABI hash) and counters: pool threads, scratch bytes held, kernel calls so far.",
    args: [],
    returns: "info"
  }
} as const satisfies Record<string, FunctionSpec>

export type Name = keyof typeof functions

/** What `info` returns. */
export interface Info {
  readonly blas: string
  readonly simd: string
  readonly abi: string
  readonly threads: number
  readonly scratchBytes: number
  readonly calls: number
}

type JsType<K extends Kind> = K extends "heap"
  ? Uint8Array | null
  : K extends "view"
    ? ArrayBufferView
    : K extends "string"
      ? string
      : K extends "int32Array"
        ? Int32Array
        : K extends "int32Array?"
          ? Int32Array | null
          : K extends "bool"
            ? boolean
            : K extends "i64x4"
              ? readonly [number, number, number, number]
              : number

type ResultOf<R extends Returns> = R extends "bool"
  ? boolean
  : R extends "number"
    ? number
    : R extends "info"
      ? Info
      : undefined

/** The named fields of one function's call, e.g. `Args<"rope">` = { heap, x, cos, sin, out, n, heads, headDim, backward }. */
export type Args<N extends Name> = {
  readonly [A in (typeof functions)[N]["args"][number] as A[0]]: JsType<A[1]>
}

/** The addon, called by field name. */
export type Kernels = {
  readonly [N in Name]: (args: Args<N>) => ResultOf<(typeof functions)[N]["returns"]>
}

/** The addon's exports as loaded: positional functions. */
export type RawAddon = Readonly<Record<string, unknown>>

/**
 * Names, kinds and order of every argument, hashed (sha256, first 16 hex digits): what an addon must have been built
 * from for `bind` to call it correctly. Docs and notes are left out: editing them needs no rebuild.
 */
export const hash: string = createHash("sha256")
  .update(
    JSON.stringify(
      Object.entries(functions).map(([name, spec]) => [
        name,
        spec.args.map(([field, kind]) => [field, kind]),
        spec.returns
      ])
    )
  )
  .digest("hex")
  .slice(0, 16)

/** The table functions the addon does not export (an addon built from older sources). */
export const missing = (addon: RawAddon): ReadonlyArray<Name> =>
  (Object.keys(functions) as Array<Name>).filter((name) => typeof addon[name] !== "function")

const positional = (fn: (...argv: Array<unknown>) => unknown, args: ReadonlyArray<Arg>) => {
  const names = args.map(([name]) => name)
  const spread = args.map(([, kind]) => kind === "i64x4")
  const count = args.reduce((n, [, kind]) => n + (kind === "i64x4" ? 4 : 1), 0)
  return (fields: Readonly<Record<string, unknown>>): unknown => {
    const argv = new Array<unknown>(count)
    let at = 0
    for (let i = 0; i < names.length; i++) {
      const value = fields[names[i]!]
      if (spread[i]) {
        for (const v of value as ReadonlyArray<number>) argv[at++] = v
      } else {
        argv[at++] = value
      }
    }
    return fn(...argv)
  }
}

/** The addon's functions taking named fields, each laid out in the table's order. Every name must be exported. */
export const bind = (addon: RawAddon): Kernels =>
  Object.fromEntries(
    Object.entries(functions).map(([name, spec]) => [
      name,
      positional(addon[name] as (...argv: Array<unknown>) => unknown, spec.args)
    ])
  ) as unknown as Kernels
