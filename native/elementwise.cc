// Element-wise kernels, reductions, casts and softmax over float32 tensors, split over the pool. Shapes arrive
// collapsed by the JS side (src/native/Layout.ts) to at most 4 dims.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "abi.generated.h"
#include "pool.h"
#include "row_math.h"

namespace effect_rl {

enum BinaryOp { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kMax = 4, kMin = 5, kSquaredDiff = 6, kPow = 7 };
enum CompareOp { kEqual = 0, kNotEqual = 1, kGreater = 2, kGreaterEqual = 3, kLess = 4, kLessEqual = 5 };

template <int Op>
inline float binaryValue(float a, float b) {
  if (Op == kAdd) return a + b;
  if (Op == kSub) return a - b;
  if (Op == kMul) return a * b;
  if (Op == kDiv) return a / b;
  if (Op == kMax) return a > b || std::isnan(a) ? a : b;
  if (Op == kMin) return a < b || std::isnan(a) ? a : b;
  if (Op == kSquaredDiff) return (a - b) * (a - b);
  return std::pow(a, b);
}

template <int Op>
inline uint8_t compareValue(float a, float b) {
  if (Op == kEqual) return a == b;
  if (Op == kNotEqual) return a != b;
  if (Op == kGreater) return a > b;
  if (Op == kGreaterEqual) return a >= b;
  if (Op == kLess) return a < b;
  return a <= b;
}

template <int Op>
struct BinaryFn {
  inline float operator()(float a, float b) const { return binaryValue<Op>(a, b); }
};
template <int Op>
struct CompareFn {
  inline uint8_t operator()(float a, float b) const { return compareValue<Op>(a, b); }
};

// One row of n outputs; sa/sb ∈ {0, 1} in the common cases, which get their own (vectorisable) loops.
template <typename Out, typename F>
inline void row(Out* out, const float* a, const float* b, int64_t n, int64_t sa, int64_t sb, F f) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; i++) out[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    float bv = b[0];
    for (int64_t i = 0; i < n; i++) out[i] = f(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    float av = a[0];
    for (int64_t i = 0; i < n; i++) out[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; i++) out[i] = f(a[i * sa], b[i * sb]);
  }
}

struct Shape4 {
  int64_t d[4];
  int64_t sa[4];
  int64_t sb[4];
  int64_t size() const { return d[0] * d[1] * d[2] * d[3]; }
};

// out[i0,i1,i2,i3] = f(a[Σ ik·sa_k], b[Σ ik·sb_k]), out contiguous; split over rows (i0,i1,i2).
template <typename Out, typename F>
void broadcastApply(Out* out, const float* a, const float* b, const Shape4& s, F f) {
  int64_t rows = s.d[0] * s.d[1] * s.d[2];
  int64_t n = s.d[3];
  pool.parallelFor(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, n)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      int64_t i2 = r % s.d[2];
      int64_t i1 = (r / s.d[2]) % s.d[1];
      int64_t i0 = r / (s.d[2] * s.d[1]);
      int64_t oa = i0 * s.sa[0] + i1 * s.sa[1] + i2 * s.sa[2];
      int64_t ob = i0 * s.sb[0] + i1 * s.sb[1] + i2 * s.sb[2];
      row(out + r * n, a + oa, b + ob, n, s.sa[3], s.sb[3], f);
    }
  });
}

// Largest element offset reached through strides, + 1.
int64_t extent(const Shape4& s, const int64_t* strides) {
  int64_t e = 0;
  for (int k = 0; k < 4; k++) {
    if (s.d[k] == 0) return 0;
    e += (s.d[k] - 1) * strides[k];
  }
  return e + 1;
}

napi_value Binary(Args& args, const BinaryArgs& in) {
  const Heap& heap = in.heap;
  int op = in.op;
  bool compare = in.compare;
  int64_t aOff = in.a, bOff = in.b, outOff = in.out;
  Shape4 s;
  for (int k = 0; k < 4; k++) {
    s.d[k] = in.dims[k];
    s.sa[k] = in.aStrides[k];
    s.sb[k] = in.bStrides[k];
  }
  int64_t size = s.size();
  if (!heap.contains(aOff, extent(s, s.sa)) || !heap.contains(bOff, extent(s, s.sb)) ||
      !heap.containsBytes(outOff, size, compare ? 1 : 4)) {
    args.fail("binary: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* a = heap.f32(aOff);
  const float* b = heap.f32(bOff);
  if (compare) {
    uint8_t* out = heap.base + outOff;
    switch (op) {
#define CMP(OP) \
  case OP:      \
    broadcastApply(out, a, b, s, CompareFn<OP>()); \
    break;
      CMP(kEqual) CMP(kNotEqual) CMP(kGreater) CMP(kGreaterEqual) CMP(kLess) CMP(kLessEqual)
#undef CMP
      default:
        args.fail("binary: unknown compare op");
    }
  } else {
    float* out = heap.f32(outOff);
    switch (op) {
#define BIN(OP) \
  case OP:      \
    broadcastApply(out, a, b, s, BinaryFn<OP>()); \
    break;
      BIN(kAdd) BIN(kSub) BIN(kMul) BIN(kDiv) BIN(kMax) BIN(kMin) BIN(kSquaredDiff) BIN(kPow)
#undef BIN
      default:
        args.fail("binary: unknown op");
    }
  }
  return args.ok ? undefinedValue(args.env) : nullptr;
}

enum UnaryOp {
  kExp = 0, kLog = 1, kSqrt = 2, kRsqrt = 3, kSquare = 4, kNeg = 5, kSigmoidU = 6, kTanh = 7, kAbs = 8, kReluU = 9,
  kReciprocal = 10, kStep = 11
};

template <int Op>
inline float unaryValue(float x, float alpha) {
  (void)alpha;
  if (Op == kExp) return fastExp(x);
  if (Op == kLog) return std::log(x);
  if (Op == kSqrt) return std::sqrt(x);
  if (Op == kRsqrt) return 1.0f / std::sqrt(x);
  if (Op == kSquare) return x * x;
  if (Op == kNeg) return -x;
  if (Op == kSigmoidU) return 1.0f / (1.0f + fastExp(-x));
  if (Op == kTanh) return std::tanh(x);
  if (Op == kAbs) return std::fabs(x);
  if (Op == kReluU) return x > 0.0f ? x : 0.0f;
  if (Op == kReciprocal) return 1.0f / x;
  return std::isnan(x) ? x : (x > 0.0f ? 1.0f : alpha);  // Step
}

template <int Op>
void unaryRun(const float* x, float* out, int64_t n, float alpha) {
  pool.parallelFor(n, 32768, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) out[i] = unaryValue<Op>(x[i], alpha);
  });
}

napi_value Unary(Args& args, const UnaryArgs& in) {
  const Heap& heap = in.heap;
  int op = in.op;
  int64_t xOff = in.x, outOff = in.out, n = in.n;
  float alpha = in.alpha;
  if (!heap.contains(xOff, n) || !heap.contains(outOff, n)) {
    args.fail("unary: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* x = heap.f32(xOff);
  float* out = heap.f32(outOff);
  switch (op) {
#define UN(OP)                       \
  case OP:                           \
    unaryRun<OP>(x, out, n, alpha);  \
    break;
    UN(kExp) UN(kLog) UN(kSqrt) UN(kRsqrt) UN(kSquare) UN(kNeg) UN(kSigmoidU) UN(kTanh) UN(kAbs) UN(kReluU)
    UN(kReciprocal) UN(kStep)
#undef UN
    default:
      args.fail("unary: unknown op");
      return nullptr;
  }
  return undefinedValue(args.env);
}

enum ReduceOp { kSum = 0, kMean = 1, kMaxR = 2, kMinR = 3, kProd = 4 };

napi_value Reduce(Args& args, const ReduceArgs& in) {
  const Heap& heap = in.heap;
  int op = in.op;
  int64_t xOff = in.x, outOff = in.out;
  int64_t outer = in.outer, red = in.reduce, inner = in.inner;
  if (!heap.contains(xOff, outer * red * inner) || !heap.contains(outOff, outer * inner) || red <= 0) {
    args.fail("reduce: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* x = heap.f32(xOff);
  float* out = heap.f32(outOff);
  float init = op == kMaxR ? -INFINITY : op == kMinR ? INFINITY : op == kProd ? 1.0f : 0.0f;
  if (inner == 1) {
    pool.parallelFor(outer, std::max<int64_t>(1, 32768 / red), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; o++) {
        const float* v = x + o * red;
        float acc = init;
        if (op == kSum || op == kMean) {
          // 8 partial sums (vectorised, and closer to pairwise summation than one running sum)
          float part[16] = {0};
          int64_t i = 0;
          for (; i + 16 <= red; i += 16)
            for (int j = 0; j < 16; j++) part[j] += v[i + j];
          for (; i < red; i++) part[0] += v[i];
          for (int j = 0; j < 16; j++) acc += part[j];
          if (op == kMean) acc /= (float)red;
        } else if (op == kMaxR) {
          for (int64_t i = 0; i < red; i++) acc = v[i] > acc || std::isnan(v[i]) ? v[i] : acc;
        } else if (op == kMinR) {
          for (int64_t i = 0; i < red; i++) acc = v[i] < acc || std::isnan(v[i]) ? v[i] : acc;
        } else {
          for (int64_t i = 0; i < red; i++) acc *= v[i];
        }
        out[o] = acc;
      }
    });
  } else {
    // Reduce over a strided axis: accumulate whole inner rows (vectorised over inner), split over outer × inner blocks.
    int64_t blocks = outer * ((inner + 255) / 256);
    int64_t innerBlocks = (inner + 255) / 256;
    pool.parallelFor(blocks, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, red * 256)), [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; blk++) {
        int64_t o = blk / innerBlocks;
        int64_t j0 = (blk % innerBlocks) * 256;
        int64_t j1 = std::min(inner, j0 + 256);
        float* acc = out + o * inner;
        for (int64_t j = j0; j < j1; j++) acc[j] = init;
        for (int64_t r = 0; r < red; r++) {
          const float* v = x + (o * red + r) * inner;
          if (op == kSum || op == kMean) {
            for (int64_t j = j0; j < j1; j++) acc[j] += v[j];
          } else if (op == kMaxR) {
            for (int64_t j = j0; j < j1; j++) acc[j] = v[j] > acc[j] || std::isnan(v[j]) ? v[j] : acc[j];
          } else if (op == kMinR) {
            for (int64_t j = j0; j < j1; j++) acc[j] = v[j] < acc[j] || std::isnan(v[j]) ? v[j] : acc[j];
          } else {
            for (int64_t j = j0; j < j1; j++) acc[j] *= v[j];
          }
        }
        if (op == kMean)
          for (int64_t j = j0; j < j1; j++) acc[j] /= (float)red;
      }
    });
  }
  return undefinedValue(args.env);
}

enum CastKind { kIntToFloat = 0, kBoolToFloat = 1, kBoolToInt = 2, kFloatToInt = 3 };

napi_value Cast(Args& args, const CastArgs& in) {
  const Heap& heap = in.heap;
  int kind = in.kind;
  int64_t xOff = in.x, outOff = in.out, n = in.n;
  bool fromBool = kind == kBoolToFloat || kind == kBoolToInt;
  if (!heap.containsBytes(xOff, n, fromBool ? 1 : 4) || !heap.contains(outOff, n)) {
    args.fail("cast: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(n, 65536, [&](int64_t i0, int64_t i1) {
    switch (kind) {
      case kIntToFloat:
        for (int64_t i = i0; i < i1; i++) heap.f32(outOff)[i] = (float)heap.i32(xOff)[i];
        break;
      case kBoolToFloat:
        for (int64_t i = i0; i < i1; i++) heap.f32(outOff)[i] = (float)heap.base[xOff + i];
        break;
      case kBoolToInt:
        for (int64_t i = i0; i < i1; i++) heap.i32(outOff)[i] = (int32_t)heap.base[xOff + i];
        break;
      default:
        for (int64_t i = i0; i < i1; i++) heap.i32(outOff)[i] = (int32_t)heap.f32(xOff)[i];
        break;
    }
  });
  return undefinedValue(args.env);
}

napi_value Softmax(Args& args, const SoftmaxArgs& in) {
  const Heap& heap = in.heap;
  int64_t xOff = in.x, outOff = in.out, rows = in.rows, n = in.n;
  bool log = in.log;
  if (!heap.contains(xOff, rows * n) || !heap.contains(outOff, rows * n) || n <= 0) {
    args.fail("softmax: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float* x = heap.f32(xOff) + r * n;
      float* y = heap.f32(outOff) + r * n;
      // 16 partial maxima / sums: float reductions only vectorise when split by hand (no -ffast-math here).
      float part[16];
      for (int t = 0; t < 16; t++) part[t] = -INFINITY;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16)
        for (int t = 0; t < 16; t++) part[t] = std::max(part[t], x[i + t]);
      float m = -INFINITY;
      for (; i < n; i++) m = std::max(m, x[i]);
      for (int t = 0; t < 16; t++) m = std::max(m, part[t]);
      for (i = 0; i < n; i++) y[i] = fastExp(x[i] - m);
      for (int t = 0; t < 16; t++) part[t] = 0.0f;
      for (i = 0; i + 16 <= n; i += 16)
        for (int t = 0; t < 16; t++) part[t] += y[i + t];
      float sum = 0.0f;
      for (; i < n; i++) sum += y[i];
      for (int t = 0; t < 16; t++) sum += part[t];
      if (log) {
        float lse = m + std::log(sum);
        for (i = 0; i < n; i++) y[i] = x[i] - lse;
      } else {
        float inv = 1.0f / sum;
        for (i = 0; i < n; i++) y[i] *= inv;
      }
    }
  });
  return undefinedValue(args.env);
}

}  // namespace effect_rl
