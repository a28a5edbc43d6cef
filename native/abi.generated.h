// Generated from src/native/Abi.ts by `node native/generate-abi.mjs` (install.mjs runs it too): do not edit.
// Change the table, run that, rebuild (`node native/install.mjs`); test/native/Abi.test.ts fails while this is stale.
//
// Per exported function F: FArgs, its arguments by name; unpack(), which fills FArgs from the call in the table's
// order and fails the call on a wrong argument count or type; and F, the kernel, defined in one of native/*.cc.
#pragma once

#include "napi_args.h"

namespace effect_rl {

// The table's hash (Abi.hash): info() reports it, and the loader refuses an addon built from another table.
constexpr const char kAbiHash[] = "bcbc386fecf0ec10";

// matmul: out[b] = act(op(A[ia(b)]) · op(B[ib(b)]) + bias). ia(b) is aBatchIndex[b] when given (general batch
// broadcasting), else b · aBatchStride; likewise ib. bias is a [N] row.
struct MatmulArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t a;  // byte offset of float32 data
  int64_t b;  // byte offset of float32 data
  int64_t out;  // byte offset of float32 data
  int64_t batch;
  int64_t aBatchStride;  // elements
  int64_t bBatchStride;  // elements
  int m;
  int n;
  int k;
  bool transposeA;
  bool transposeB;
  int64_t bias;  // byte offset of float32 data; < 0: none
  int activation;  // Activation
  float alpha;  // leaky ReLU slope
  Int32s aBatchIndex;  // Int32Array, or null (data == nullptr); element offset of each batch's A
  Int32s bBatchIndex;  // Int32Array, or null (data == nullptr); element offset of each batch's B
};
napi_value Matmul(Args& args, const MatmulArgs& in);
inline bool unpack(Args& args, MatmulArgs* in) {
  if (!args.expectCount(17, "matmul")) return false;
  in->heap = args.heap(0);
  in->a = args.i64(1);
  in->b = args.i64(2);
  in->out = args.i64(3);
  in->batch = args.i64(4);
  in->aBatchStride = args.i64(5);
  in->bBatchStride = args.i64(6);
  in->m = (int)args.i64(7);
  in->n = (int)args.i64(8);
  in->k = (int)args.i64(9);
  in->transposeA = args.flag(10);
  in->transposeB = args.flag(11);
  in->bias = args.i64(12);
  in->activation = (int)args.i64(13);
  in->alpha = (float)args.num(14);
  in->aBatchIndex = args.isNullish(15) ? Int32s{} : args.int32s(15);
  in->bBatchIndex = args.isNullish(16) ? Int32s{} : args.int32s(16);
  return args.ok;
}

// binary: out[i0..i3] = op(a[Σ ik·aStrides[k]], b[Σ ik·bStrides[k]]) over a contiguous 4-d out: float32 in, float32 out
// (compare = false: BinaryOp) or bool bytes (compare = true: CompareOp).
struct BinaryArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int op;
  bool compare;
  int64_t a;  // byte offset of float32 data
  int64_t b;  // byte offset of float32 data
  int64_t out;  // byte offset; float32, or bool bytes when compare
  int64_t dims[4];
  int64_t aStrides[4];  // elements; 0 where a is broadcast
  int64_t bStrides[4];  // elements; 0 where b is broadcast
};
napi_value Binary(Args& args, const BinaryArgs& in);
inline bool unpack(Args& args, BinaryArgs* in) {
  if (!args.expectCount(18, "binary")) return false;
  in->heap = args.heap(0);
  in->op = (int)args.i64(1);
  in->compare = args.flag(2);
  in->a = args.i64(3);
  in->b = args.i64(4);
  in->out = args.i64(5);
  in->dims[0] = args.i64(6);
  in->dims[1] = args.i64(7);
  in->dims[2] = args.i64(8);
  in->dims[3] = args.i64(9);
  in->aStrides[0] = args.i64(10);
  in->aStrides[1] = args.i64(11);
  in->aStrides[2] = args.i64(12);
  in->aStrides[3] = args.i64(13);
  in->bStrides[0] = args.i64(14);
  in->bStrides[1] = args.i64(15);
  in->bStrides[2] = args.i64(16);
  in->bStrides[3] = args.i64(17);
  return args.ok;
}

// unary: out[i] = op(x[i]) for i < n (UnaryOp; alpha: Step's value at x ≤ 0).
struct UnaryArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int op;
  int64_t x;  // byte offset of float32 data
  int64_t out;  // byte offset of float32 data
  int64_t n;
  float alpha;
};
napi_value Unary(Args& args, const UnaryArgs& in);
inline bool unpack(Args& args, UnaryArgs* in) {
  if (!args.expectCount(6, "unary")) return false;
  in->heap = args.heap(0);
  in->op = (int)args.i64(1);
  in->x = args.i64(2);
  in->out = args.i64(3);
  in->n = args.i64(4);
  in->alpha = (float)args.num(5);
  return args.ok;
}

// reduce: x viewed as [outer, reduce, inner] → out [outer, inner] (ReduceOp).
struct ReduceArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int op;
  int64_t x;  // byte offset of float32 data
  int64_t out;  // byte offset of float32 data
  int64_t outer;
  int64_t reduce;
  int64_t inner;
};
napi_value Reduce(Args& args, const ReduceArgs& in);
inline bool unpack(Args& args, ReduceArgs* in) {
  if (!args.expectCount(7, "reduce")) return false;
  in->heap = args.heap(0);
  in->op = (int)args.i64(1);
  in->x = args.i64(2);
  in->out = args.i64(3);
  in->outer = args.i64(4);
  in->reduce = args.i64(5);
  in->inner = args.i64(6);
  return args.ok;
}

// transpose: out (contiguous, outShape) = x read with inStrides: the stride in x of the axis that becomes each out
// axis. Also a strided slice (x offset to the first element).
struct TransposeArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t x;  // byte offset
  int64_t out;  // byte offset
  int elementBytes;  // 4 or 1
  int rank;
  Int32s outShape;  // Int32Array
  Int32s inStrides;  // Int32Array
};
napi_value Transpose(Args& args, const TransposeArgs& in);
inline bool unpack(Args& args, TransposeArgs* in) {
  if (!args.expectCount(7, "transpose")) return false;
  in->heap = args.heap(0);
  in->x = args.i64(1);
  in->out = args.i64(2);
  in->elementBytes = (int)args.i64(3);
  in->rank = (int)args.i64(4);
  in->outShape = args.int32s(5);
  in->inStrides = args.int32s(6);
  return args.ok;
}

// cast: out[i] = x[i] converted as `kind` says (CastKind), i < n.
struct CastArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int kind;
  int64_t x;  // byte offset
  int64_t out;  // byte offset
  int64_t n;
};
napi_value Cast(Args& args, const CastArgs& in);
inline bool unpack(Args& args, CastArgs* in) {
  if (!args.expectCount(5, "cast")) return false;
  in->heap = args.heap(0);
  in->kind = (int)args.i64(1);
  in->x = args.i64(2);
  in->out = args.i64(3);
  in->n = args.i64(4);
  return args.ok;
}

// softmax: softmax (or log-softmax) over the last axis of x [rows, n].
struct SoftmaxArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t x;  // byte offset of float32 data
  int64_t out;  // byte offset of float32 data
  int64_t rows;
  int64_t n;
  bool log;
};
napi_value Softmax(Args& args, const SoftmaxArgs& in);
inline bool unpack(Args& args, SoftmaxArgs* in) {
  if (!args.expectCount(6, "softmax")) return false;
  in->heap = args.heap(0);
  in->x = args.i64(1);
  in->out = args.i64(2);
  in->rows = args.i64(3);
  in->n = args.i64(4);
  in->log = args.flag(5);
  return args.ok;
}

// gather: x [outer, axisDim, inner] → out [outer, count, inner]. Returns false, writing nothing, when an index is
// outside [0, axisDim): the caller raises tfjs' error.
struct GatherArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t x;  // byte offset
  int64_t indices;  // byte offset of int32 data
  int64_t out;  // byte offset
  int64_t outer;
  int64_t axisDim;
  int64_t count;
  int64_t inner;
  int elementBytes;  // 4 or 1
};
napi_value Gather(Args& args, const GatherArgs& in);
inline bool unpack(Args& args, GatherArgs* in) {
  if (!args.expectCount(9, "gather")) return false;
  in->heap = args.heap(0);
  in->x = args.i64(1);
  in->indices = args.i64(2);
  in->out = args.i64(3);
  in->outer = args.i64(4);
  in->axisDim = args.i64(5);
  in->count = args.i64(6);
  in->inner = args.i64(7);
  in->elementBytes = (int)args.i64(8);
  return args.ok;
}

// segmentSum: out[s, :] = Σ_{i: ids[i] = s} x[i, :]; ids outside [0, numSegments) are dropped.
struct SegmentSumArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t x;  // byte offset of float32 data
  int64_t segmentIds;  // byte offset of int32 data
  int64_t out;  // byte offset of float32 data
  int64_t count;
  int64_t inner;
  int64_t numSegments;
};
napi_value SegmentSum(Args& args, const SegmentSumArgs& in);
inline bool unpack(Args& args, SegmentSumArgs* in) {
  if (!args.expectCount(7, "segmentSum")) return false;
  in->heap = args.heap(0);
  in->x = args.i64(1);
  in->segmentIds = args.i64(2);
  in->out = args.i64(3);
  in->count = args.i64(4);
  in->inner = args.i64(5);
  in->numSegments = args.i64(6);
  return args.ok;
}

// adam: One pass of tfjs' AdamOptimizer update in its operation order: m' = m·β1 + g·(1−β1), v' = v·β2 + g²·(1−β2),
// value' = (m'/c1) / (√(v'/c2) + ε) · (−lr) + value, with c1 = 1 − β1ᵗ, c2 = 1 − β2ᵗ.
struct AdamArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t value;  // byte offset of float32 data
  int64_t grad;  // byte offset of float32 data
  int64_t m;  // byte offset of float32 data
  int64_t v;  // byte offset of float32 data
  int64_t newValue;  // byte offset of float32 data
  int64_t newM;  // byte offset of float32 data
  int64_t newV;  // byte offset of float32 data
  int64_t n;
  float learningRate;
  double beta1;  // 1 − β1 is taken in double, as tfjs does
  double beta2;
  float epsilon;
  float c1;  // 1 − β1ᵗ
  float c2;  // 1 − β2ᵗ
};
napi_value Adam(Args& args, const AdamArgs& in);
inline bool unpack(Args& args, AdamArgs* in) {
  if (!args.expectCount(15, "adam")) return false;
  in->heap = args.heap(0);
  in->value = args.i64(1);
  in->grad = args.i64(2);
  in->m = args.i64(3);
  in->v = args.i64(4);
  in->newValue = args.i64(5);
  in->newM = args.i64(6);
  in->newV = args.i64(7);
  in->n = args.i64(8);
  in->learningRate = (float)args.num(9);
  in->beta1 = args.num(10);
  in->beta2 = args.num(11);
  in->epsilon = (float)args.num(12);
  in->c1 = (float)args.num(13);
  in->c2 = (float)args.num(14);
  return args.ok;
}

// copyBlocks: dst[o·dstStride + :chunk] = src[o·srcStride + :chunk] for o < outer, all in bytes (Concat, SplitV).
struct CopyBlocksArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t src;  // byte offset
  int64_t dst;  // byte offset
  int64_t outer;
  int64_t srcStride;  // bytes
  int64_t dstStride;  // bytes
  int64_t chunk;  // bytes
};
napi_value CopyBlocks(Args& args, const CopyBlocksArgs& in);
inline bool unpack(Args& args, CopyBlocksArgs* in) {
  if (!args.expectCount(7, "copyBlocks")) return false;
  in->heap = args.heap(0);
  in->src = args.i64(1);
  in->dst = args.i64(2);
  in->outer = args.i64(3);
  in->srcStride = args.i64(4);
  in->dstStride = args.i64(5);
  in->chunk = args.i64(6);
  return args.ok;
}

// rmsNorm: out[r] = x[r] · rstd(x[r]) (· w[r mod wRows] when w is given); x, out [rows, n].
struct RmsNormArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t x;  // byte offset of float32 data
  int64_t w;  // byte offset of float32 data; < 0: none
  int64_t out;  // byte offset of float32 data
  int64_t rows;
  int64_t n;
  int64_t wRows;
  float eps;
};
napi_value RmsNorm(Args& args, const RmsNormArgs& in);
inline bool unpack(Args& args, RmsNormArgs* in) {
  if (!args.expectCount(8, "rmsNorm")) return false;
  in->heap = args.heap(0);
  in->x = args.i64(1);
  in->w = args.i64(2);
  in->out = args.i64(3);
  in->rows = args.i64(4);
  in->n = args.i64(5);
  in->wRows = args.i64(6);
  in->eps = (float)args.num(7);
  return args.ok;
}

// rmsNormGrad: dx = r·(g − x̂·mean(g·x̂)) with g = dy·w, x̂ = x·r, r = rstd(x); dw[k] = Σ_{r ≡ k mod wRows} dy[r]·x̂[r]
// (when dw is given).
struct RmsNormGradArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t x;  // byte offset of float32 data
  int64_t w;  // byte offset of float32 data; < 0: none
  int64_t dy;  // byte offset of float32 data
  int64_t dx;  // byte offset of float32 data
  int64_t dw;  // byte offset of float32 data; < 0: none
  int64_t rows;
  int64_t n;
  int64_t wRows;
  float eps;
};
napi_value RmsNormGrad(Args& args, const RmsNormGradArgs& in);
inline bool unpack(Args& args, RmsNormGradArgs* in) {
  if (!args.expectCount(10, "rmsNormGrad")) return false;
  in->heap = args.heap(0);
  in->x = args.i64(1);
  in->w = args.i64(2);
  in->dy = args.i64(3);
  in->dx = args.i64(4);
  in->dw = args.i64(5);
  in->rows = args.i64(6);
  in->n = args.i64(7);
  in->wRows = args.i64(8);
  in->eps = (float)args.num(9);
  return args.ok;
}

// swiglu: out[r, i] = silu(gate[r, i]) · up[r, i]; rows of the inputs gateStride/upStride floats apart (a joined
// gate|up tensor is two strided views), out contiguous [rows, n].
struct SwigluArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t gate;  // byte offset of float32 data
  int64_t up;  // byte offset of float32 data
  int64_t out;  // byte offset of float32 data
  int64_t rows;
  int64_t n;
  int64_t gateStride;
  int64_t upStride;
};
napi_value Swiglu(Args& args, const SwigluArgs& in);
inline bool unpack(Args& args, SwigluArgs* in) {
  if (!args.expectCount(8, "swiglu")) return false;
  in->heap = args.heap(0);
  in->gate = args.i64(1);
  in->up = args.i64(2);
  in->out = args.i64(3);
  in->rows = args.i64(4);
  in->n = args.i64(5);
  in->gateStride = args.i64(6);
  in->upStride = args.i64(7);
  return args.ok;
}

// swigluGrad: s = σ(g); dgate = dy·u·s·(1 + g·(1 − s)); dup = dy·g·s, all [rows, n].
struct SwigluGradArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t gate;  // byte offset of float32 data
  int64_t up;  // byte offset of float32 data
  int64_t dy;  // byte offset of float32 data
  int64_t dgate;  // byte offset of float32 data
  int64_t dup;  // byte offset of float32 data
  int64_t rows;
  int64_t n;
};
napi_value SwigluGrad(Args& args, const SwigluGradArgs& in);
inline bool unpack(Args& args, SwigluGradArgs* in) {
  if (!args.expectCount(8, "swigluGrad")) return false;
  in->heap = args.heap(0);
  in->gate = args.i64(1);
  in->up = args.i64(2);
  in->dy = args.i64(3);
  in->dgate = args.i64(4);
  in->dup = args.i64(5);
  in->rows = args.i64(6);
  in->n = args.i64(7);
  return args.ok;
}

// rope: HF rotate_half RoPE (backward: its transpose) of x, out [n, heads, headDim]; cos, sin [n, headDim].
struct RopeArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t x;  // byte offset of float32 data
  int64_t cos;  // byte offset of float32 data
  int64_t sin;  // byte offset of float32 data
  int64_t out;  // byte offset of float32 data
  int64_t n;  // tokens
  int64_t heads;
  int64_t headDim;
  bool backward;
};
napi_value Rope(Args& args, const RopeArgs& in);
inline bool unpack(Args& args, RopeArgs* in) {
  if (!args.expectCount(9, "rope")) return false;
  in->heap = args.heap(0);
  in->x = args.i64(1);
  in->cos = args.i64(2);
  in->sin = args.i64(3);
  in->out = args.i64(4);
  in->n = args.i64(5);
  in->heads = args.i64(6);
  in->headDim = args.i64(7);
  in->backward = args.flag(8);
  return args.ok;
}

// qkvPrep: Inference. qkv [B·T, (H + 2Hkv)·hd] → q [B·T, H, hd] and the new tokens' k, v: each q/k head RMS-normed by
// norm [H + Hkv, hd] (when given) then rotated (cos, sin [B·T, hd]). keys/values [B, capacity, Hkv, hd] hold the P past
// slots (pastK/pastV [B, pastCapacity, Hkv, hd]), then the new ones; keys == pastK: appended in place.
struct QkvPrepArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t qkv;  // byte offset of float32 data
  int64_t cos;  // byte offset of float32 data
  int64_t sin;  // byte offset of float32 data
  int64_t norm;  // byte offset of float32 data; < 0: none
  float eps;
  int64_t pastK;  // byte offset of float32 data; < 0: none
  int64_t pastV;  // byte offset of float32 data; < 0: none
  int64_t q;  // byte offset of float32 data
  int64_t keys;  // byte offset of float32 data
  int64_t values;  // byte offset of float32 data
  int64_t batch;  // B
  int64_t tokens;  // T
  int64_t pastLength;  // P
  int64_t heads;  // H
  int64_t kvHeads;  // Hkv
  int64_t headDim;  // hd
  int64_t pastCapacity;  // slots per row of pastK/pastV
  int64_t capacity;  // slots per row of keys/values (≥ P + T)
};
napi_value QkvPrep(Args& args, const QkvPrepArgs& in);
inline bool unpack(Args& args, QkvPrepArgs* in) {
  if (!args.expectCount(19, "qkvPrep")) return false;
  in->heap = args.heap(0);
  in->qkv = args.i64(1);
  in->cos = args.i64(2);
  in->sin = args.i64(3);
  in->norm = args.i64(4);
  in->eps = (float)args.num(5);
  in->pastK = args.i64(6);
  in->pastV = args.i64(7);
  in->q = args.i64(8);
  in->keys = args.i64(9);
  in->values = args.i64(10);
  in->batch = args.i64(11);
  in->tokens = args.i64(12);
  in->pastLength = args.i64(13);
  in->heads = args.i64(14);
  in->kvHeads = args.i64(15);
  in->headDim = args.i64(16);
  in->pastCapacity = args.i64(17);
  in->capacity = args.i64(18);
  return args.ok;
}

// attention: q, out [B, T, H, hd]; k, v [B, capacity, Hkv, hd] of which the first L = length slots count; bias [B, T,
// L] additive; probs [B, H, T, L] kept when given. Query head h reads KV head h / (H / Hkv).
struct AttentionArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t q;  // byte offset of float32 data
  int64_t k;  // byte offset of float32 data
  int64_t v;  // byte offset of float32 data
  int64_t bias;  // byte offset of float32 data; < 0: none
  int64_t out;  // byte offset of float32 data
  int64_t probs;  // byte offset of float32 data; < 0: none
  int64_t batch;  // B
  int64_t tokens;  // T
  int64_t length;  // L
  int64_t heads;  // H
  int64_t kvHeads;  // Hkv
  int64_t headDim;  // hd
  float scale;
  int64_t capacity;  // slots per row of k, v
};
napi_value Attention(Args& args, const AttentionArgs& in);
inline bool unpack(Args& args, AttentionArgs* in) {
  if (!args.expectCount(15, "attention")) return false;
  in->heap = args.heap(0);
  in->q = args.i64(1);
  in->k = args.i64(2);
  in->v = args.i64(3);
  in->bias = args.i64(4);
  in->out = args.i64(5);
  in->probs = args.i64(6);
  in->batch = args.i64(7);
  in->tokens = args.i64(8);
  in->length = args.i64(9);
  in->heads = args.i64(10);
  in->kvHeads = args.i64(11);
  in->headDim = args.i64(12);
  in->scale = (float)args.num(13);
  in->capacity = args.i64(14);
  return args.ok;
}

// attentionGrad: The gradients of attention (bias is constant) from its kept probs; k, v, dk, dv [B, L, Hkv, hd].
struct AttentionGradArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t q;  // byte offset of float32 data
  int64_t k;  // byte offset of float32 data
  int64_t v;  // byte offset of float32 data
  int64_t probs;  // byte offset of float32 data
  int64_t dOut;  // byte offset of float32 data
  int64_t dq;  // byte offset of float32 data
  int64_t dk;  // byte offset of float32 data
  int64_t dv;  // byte offset of float32 data
  int64_t batch;  // B
  int64_t tokens;  // T
  int64_t length;  // L
  int64_t heads;  // H
  int64_t kvHeads;  // Hkv
  int64_t headDim;  // hd
  float scale;
};
napi_value AttentionGrad(Args& args, const AttentionGradArgs& in);
inline bool unpack(Args& args, AttentionGradArgs* in) {
  if (!args.expectCount(16, "attentionGrad")) return false;
  in->heap = args.heap(0);
  in->q = args.i64(1);
  in->k = args.i64(2);
  in->v = args.i64(3);
  in->probs = args.i64(4);
  in->dOut = args.i64(5);
  in->dq = args.i64(6);
  in->dk = args.i64(7);
  in->dv = args.i64(8);
  in->batch = args.i64(9);
  in->tokens = args.i64(10);
  in->length = args.i64(11);
  in->heads = args.i64(12);
  in->kvHeads = args.i64(13);
  in->headDim = args.i64(14);
  in->scale = (float)args.num(15);
  return args.ok;
}

// linear: out = diag(r) · (a @ b) + residual, a [m, k], b [k, n]; r_i = rstd(a_i) when normEps ≥ 0 (an RMSNorm whose
// weight is folded into b's rows), else 1.
struct LinearArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t a;  // byte offset of float32 data
  int64_t b;  // byte offset of float32 data
  int64_t out;  // byte offset of float32 data
  int m;
  int n;
  int k;
  int64_t residual;  // byte offset of float32 data; < 0: none
  double normEps;  // < 0: no norm
};
napi_value Linear(Args& args, const LinearArgs& in);
inline bool unpack(Args& args, LinearArgs* in) {
  if (!args.expectCount(9, "linear")) return false;
  in->heap = args.heap(0);
  in->a = args.i64(1);
  in->b = args.i64(2);
  in->out = args.i64(3);
  in->m = (int)args.i64(4);
  in->n = (int)args.i64(5);
  in->k = (int)args.i64(6);
  in->residual = args.i64(7);
  in->normEps = args.num(8);
  return args.ok;
}

// addressOf: The address of a view's first byte (a JS number; exact below 2⁵³). V8 never moves an ArrayBuffer's backing
// store once it has one, and asking for the address gives a small on-heap typed array its own, so the address holds as
// long as the view is alive.
struct AddressOfArgs {
  View view;  // a typed array or DataView
};
napi_value AddressOf(Args& args, const AddressOfArgs& in);
inline bool unpack(Args& args, AddressOfArgs* in) {
  if (!args.expectCount(1, "addressOf")) return false;
  in->view = args.view(0);
  return args.ok;
}

// loadTensor: Read `rows · cols` elements of type `dtype` (0 float32, 1 bfloat16, 2 float16) at byte `offset` of the
// file at `path` and write them widened to float32 into `out` (transposed to [cols, rows] when `transpose`), in blocks
// through a small buffer: no copy of the file's bytes is kept. Returns the bytes read; throws naming the file when it
// is shorter than the range.
struct LoadTensorArgs {
  std::string path;
  int64_t offset;  // bytes
  int dtype;  // 0 float32, 1 bfloat16, 2 float16
  int64_t rows;
  int64_t cols;
  bool transpose;
  View out;  // a typed array or DataView; float32, rows · cols elements
};
napi_value LoadTensor(Args& args, const LoadTensorArgs& in);
inline bool unpack(Args& args, LoadTensorArgs* in) {
  if (!args.expectCount(7, "loadTensor")) return false;
  in->path = args.string(0);
  in->offset = args.i64(1);
  in->dtype = (int)args.i64(2);
  in->rows = args.i64(3);
  in->cols = args.i64(4);
  in->transpose = args.flag(5);
  in->out = args.view(6);
  return args.ok;
}

// headLogProbs: LM head log-probs without [N, V] logits: z = h · W (W [D, V], or the embedding [V, D] used as Wᵀ when
// `transposed`), out [N, 2] = (z[n, y_n] − lse_n, lse_n − Σ p z), lse [N] kept for the gradient. Returns false, writing
// nothing, when a target is outside [0, V).
struct HeadLogProbsArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t h;  // byte offset of float32 data; [N, D]
  int64_t w;  // byte offset of float32 data; [D, V], or [V, D] when transposed
  int64_t targets;  // byte offset of int32 data; [N]
  int64_t out;  // byte offset of float32 data; [N, 2]: logp, entropy
  int64_t lse;  // byte offset of float32 data; [N]
  int64_t n;  // N
  int64_t d;  // D
  int64_t v;  // V
  bool transposed;
};
napi_value HeadLogProbs(Args& args, const HeadLogProbsArgs& in);
inline bool unpack(Args& args, HeadLogProbsArgs* in) {
  if (!args.expectCount(10, "headLogProbs")) return false;
  in->heap = args.heap(0);
  in->h = args.i64(1);
  in->w = args.i64(2);
  in->targets = args.i64(3);
  in->out = args.i64(4);
  in->lse = args.i64(5);
  in->n = args.i64(6);
  in->d = args.i64(7);
  in->v = args.i64(8);
  in->transposed = args.flag(9);
  return args.ok;
}

// headLogProbsGrad: The gradient of headLogProbs from its out and lse: gz = gLogp·(onehot − p) − gH·p·(log p + H) per
// row (dy [N, 2] = gLogp, gH), recomputing z per block; dh = gz · Wᵀ, and with trainW dw = hᵀ · gz in W's layout.
struct HeadLogProbsGradArgs {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t h;  // byte offset of float32 data; [N, D]
  int64_t w;  // byte offset of float32 data; [D, V], or [V, D] when transposed
  int64_t targets;  // byte offset of int32 data; [N]
  int64_t out;  // byte offset of float32 data; the forward's [N, 2] (its entropy column is read)
  int64_t lse;  // byte offset of float32 data; the forward's [N]
  int64_t dy;  // byte offset of float32 data; [N, 2]
  int64_t dh;  // byte offset of float32 data; [N, D]
  int64_t dw;  // byte offset of float32 data; W's shape; not read or written unless trainW
  int64_t n;  // N
  int64_t d;  // D
  int64_t v;  // V
  bool transposed;
  bool trainW;  // whether to compute dw: false for a frozen head (a LoRA base's tied embedding)
};
napi_value HeadLogProbsGrad(Args& args, const HeadLogProbsGradArgs& in);
inline bool unpack(Args& args, HeadLogProbsGradArgs* in) {
  if (!args.expectCount(14, "headLogProbsGrad")) return false;
  in->heap = args.heap(0);
  in->h = args.i64(1);
  in->w = args.i64(2);
  in->targets = args.i64(3);
  in->out = args.i64(4);
  in->lse = args.i64(5);
  in->dy = args.i64(6);
  in->dh = args.i64(7);
  in->dw = args.i64(8);
  in->n = args.i64(9);
  in->d = args.i64(10);
  in->v = args.i64(11);
  in->transposed = args.flag(12);
  in->trainW = args.flag(13);
  return args.ok;
}

// matmulBf16: out [m, n] = a [m, k] · op(b), b bfloat16 bits stored [k, n] (or [n, k] with transposeB, giving a · bᵀ):
// frozen weights kept as bfloat16, widened a block of columns at a time in each thread's scratch.
struct MatmulBf16Args {
  Heap heap;  // the wasm heap; null: absolute addresses
  int64_t a;  // byte offset of float32 data
  int64_t b;  // byte offset; bfloat16 bits
  int64_t out;  // byte offset of float32 data
  int m;
  int n;
  int k;
  bool transposeB;
};
napi_value MatmulBf16(Args& args, const MatmulBf16Args& in);
inline bool unpack(Args& args, MatmulBf16Args* in) {
  if (!args.expectCount(8, "matmulBf16")) return false;
  in->heap = args.heap(0);
  in->a = args.i64(1);
  in->b = args.i64(2);
  in->out = args.i64(3);
  in->m = (int)args.i64(4);
  in->n = (int)args.i64(5);
  in->k = (int)args.i64(6);
  in->transposeB = args.flag(7);
  return args.ok;
}

// toBf16: out[i] = x[i] rounded to bfloat16 (to nearest even; NaN stays NaN), i < n.
struct ToBf16Args {
  View x;  // a typed array or DataView; float32
  View out;  // a typed array or DataView; bfloat16 bits
  int64_t n;
};
napi_value ToBf16(Args& args, const ToBf16Args& in);
inline bool unpack(Args& args, ToBf16Args* in) {
  if (!args.expectCount(3, "toBf16")) return false;
  in->x = args.view(0);
  in->out = args.view(1);
  in->n = args.i64(2);
  return args.ok;
}

// fromBf16: out[i] = x[i] widened to float32, i < n.
struct FromBf16Args {
  View x;  // a typed array or DataView; bfloat16 bits
  View out;  // a typed array or DataView; float32
  int64_t n;
};
napi_value FromBf16(Args& args, const FromBf16Args& in);
inline bool unpack(Args& args, FromBf16Args* in) {
  if (!args.expectCount(3, "fromBf16")) return false;
  in->x = args.view(0);
  in->out = args.view(1);
  in->n = args.i64(2);
  return args.ok;
}

// setThreads: Resize the thread pool (threads ≤ 0: one per hardware thread).
struct SetThreadsArgs {
  int threads;
};
napi_value SetThreads(Args& args, const SetThreadsArgs& in);
inline bool unpack(Args& args, SetThreadsArgs* in) {
  if (!args.expectCount(1, "setThreads")) return false;
  in->threads = (int)args.i64(0);
  return args.ok;
}

// mallocTrim: Give the C allocator's free memory back to the system (glibc's malloc_trim): true when some was. A no-op
// returning false where the C library is not glibc.
struct MallocTrimArgs {};
napi_value MallocTrim(Args& args, const MallocTrimArgs& in);
inline bool unpack(Args& args, MallocTrimArgs* in) {
  (void)in;
  if (!args.expectCount(0, "mallocTrim")) return false;
  return args.ok;
}

// info: The build (BLAS, SIMD, ABI hash) and counters: pool threads, scratch bytes held, kernel calls so far.
struct InfoArgs {};
napi_value Info(Args& args, const InfoArgs& in);
inline bool unpack(Args& args, InfoArgs* in) {
  (void)in;
  if (!args.expectCount(0, "info")) return false;
  return args.ok;
}

// The exported entry point of a kernel: read its arguments, then run it.
template <typename In, napi_value (*Kernel)(Args&, const In&)>
napi_value entry(napi_env env, napi_callback_info info) {
  Args args(env, info);
  In in;
  if (!unpack(args, &in)) return nullptr;
  return Kernel(args, in);
}

struct Export {
  const char* name;
  napi_callback callback;
};

constexpr Export kExports[] = {
    {"matmul", entry<MatmulArgs, Matmul>},
    {"binary", entry<BinaryArgs, Binary>},
    {"unary", entry<UnaryArgs, Unary>},
    {"reduce", entry<ReduceArgs, Reduce>},
    {"transpose", entry<TransposeArgs, Transpose>},
    {"cast", entry<CastArgs, Cast>},
    {"softmax", entry<SoftmaxArgs, Softmax>},
    {"gather", entry<GatherArgs, Gather>},
    {"segmentSum", entry<SegmentSumArgs, SegmentSum>},
    {"adam", entry<AdamArgs, Adam>},
    {"copyBlocks", entry<CopyBlocksArgs, CopyBlocks>},
    {"rmsNorm", entry<RmsNormArgs, RmsNorm>},
    {"rmsNormGrad", entry<RmsNormGradArgs, RmsNormGrad>},
    {"swiglu", entry<SwigluArgs, Swiglu>},
    {"swigluGrad", entry<SwigluGradArgs, SwigluGrad>},
    {"rope", entry<RopeArgs, Rope>},
    {"qkvPrep", entry<QkvPrepArgs, QkvPrep>},
    {"attention", entry<AttentionArgs, Attention>},
    {"attentionGrad", entry<AttentionGradArgs, AttentionGrad>},
    {"linear", entry<LinearArgs, Linear>},
    {"addressOf", entry<AddressOfArgs, AddressOf>},
    {"loadTensor", entry<LoadTensorArgs, LoadTensor>},
    {"headLogProbs", entry<HeadLogProbsArgs, HeadLogProbs>},
    {"headLogProbsGrad", entry<HeadLogProbsGradArgs, HeadLogProbsGrad>},
    {"matmulBf16", entry<MatmulBf16Args, MatmulBf16>},
    {"toBf16", entry<ToBf16Args, ToBf16>},
    {"fromBf16", entry<FromBf16Args, FromBf16>},
    {"setThreads", entry<SetThreadsArgs, SetThreads>},
    {"mallocTrim", entry<MallocTrimArgs, MallocTrim>},
    {"info", entry<InfoArgs, Info>},
};

}  // namespace effect_rl
