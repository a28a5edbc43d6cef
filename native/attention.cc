// Attention kernels (src/model/Fused.ts) over a token-major KV cache: the inference q|k|v preparation (qk-norm +
// RoPE + cache append), attention and its gradient. Masked key slots are skipped, not computed (see Attention).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "abi.generated.h"
#include "gemm.h"
#include "pool.h"
#include "row_math.h"

namespace effect_rl {

// Queries per block in attention: the unit whose masked trailing key slots are skipped (see Attention).
constexpr int64_t kQueryBlock = 32;

// In-place softmax of one row (max-subtracted).
inline void softmaxRow(float* y, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; i++) m = std::max(m, y[i]);
  for (int64_t i = 0; i < n; i++) y[i] = fastExp(y[i] - m);
  float inv = 1.0f / sumOf(y, n);
  for (int64_t i = 0; i < n; i++) y[i] *= inv;
}

// One query's scores s[0, L) → its attention probabilities over the slots [lo, hi) it may see (the additive `bias` row
// added when given); the slots outside are set to exactly 0, as a kept probability row must be.
inline void maskedSoftmaxRow(float* s, const float* bias, int64_t lo, int64_t hi, int64_t L) {
  if (lo > 0) std::memset(s, 0, sizeof(float) * lo);
  if (hi < L) std::memset(s + hi, 0, sizeof(float) * (L - hi));
  if (bias != nullptr)
    for (int64_t i = lo; i < hi; i++) s[i] += bias[i];
  softmaxRow(s + lo, hi - lo);
}

// keys == pastK: the new slots are appended in place (capacity to spare), no copy.
napi_value QkvPrep(Args& args, const QkvPrepArgs& in) {
  const Heap& heap = in.heap;
  int64_t qkvOff = in.qkv, cOff = in.cos, sOff = in.sin, nOff = in.norm;
  float eps = in.eps;
  int64_t pkOff = in.pastK, pvOff = in.pastV, qOff = in.q, kOff = in.keys, vOff = in.values;
  int64_t B = in.batch, T = in.tokens, P = in.pastLength, H = in.heads, Hkv = in.kvHeads, hd = in.headDim;
  int64_t pastCap = in.pastCapacity, L = in.capacity;  // L: the outputs' slots per row (capacity ≥ P + T)
  int64_t N = B * T, row = (H + 2 * Hkv) * hd, kvRow = Hkv * hd;
  bool inPlace = P > 0 && kOff == pkOff && vOff == pvOff;
  if (hd % 2 != 0 || hd > 1024 || L < P + T || (P > 0 && pastCap < P) || (inPlace && pastCap != L) ||
      !heap.contains(qkvOff, N * row) || !heap.contains(cOff, N * hd) || !heap.contains(sOff, N * hd) ||
      (nOff >= 0 && !heap.contains(nOff, (H + Hkv) * hd)) ||
      (P > 0 && (!heap.contains(pkOff, B * pastCap * kvRow) || !heap.contains(pvOff, B * pastCap * kvRow))) ||
      !heap.contains(qOff, N * H * hd) || !heap.contains(kOff, B * L * kvRow) || !heap.contains(vOff, B * L * kvRow)) {
    args.fail("qkvPrep: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  float* keys = heap.f32(kOff);
  float* values = heap.f32(vOff);
  if (P > 0 && !inPlace) {
    pool.parallelFor(B, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, P * kvRow)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b++) {
        std::memcpy(keys + b * L * kvRow, heap.f32(pkOff) + b * pastCap * kvRow, sizeof(float) * P * kvRow);
        std::memcpy(values + b * L * kvRow, heap.f32(pvOff) + b * pastCap * kvRow, sizeof(float) * P * kvRow);
      }
    });
  }
  pool.parallelFor(N, std::max<int64_t>(1, 4096 / row), [&](int64_t n0, int64_t n1) {
    float tmp[1024];
    for (int64_t n = n0; n < n1; n++) {
      int64_t b = n / T, t = n % T;
      const float* src = heap.f32(qkvOff) + n * row;
      const float* c = heap.f32(cOff) + n * hd;
      const float* s = heap.f32(sOff) + n * hd;
      float* kDst = keys + (b * L + P + t) * kvRow;
      for (int64_t head = 0; head < H + Hkv; head++) {
        const float* x = src + head * hd;
        float* dst = head < H ? heap.f32(qOff) + (n * H + head) * hd : kDst + (head - H) * hd;
        if (nOff >= 0) {
          float rs = rstdOf(x, hd, eps);
          const float* w = heap.f32(nOff) + head * hd;
          for (int64_t i = 0; i < hd; i++) tmp[i] = (x[i] * rs) * w[i];
          x = tmp;
        }
        ropeVec(x, c, s, dst, (int)hd, false);
      }
      std::memcpy(values + (b * L + P + t) * kvRow, src + (H + Hkv) * hd, sizeof(float) * kvRow);
    }
  });
  return undefinedValue(args.env);
}

napi_value Attention(Args& args, const AttentionArgs& in) {
  const Heap& heap = in.heap;
  int64_t qOff = in.q, kOff = in.k, vOff = in.v, bOff = in.bias, oOff = in.out;
  int64_t pOff = in.probs, B = in.batch, T = in.tokens, L = in.length, H = in.heads, Hkv = in.kvHeads;
  int64_t hd = in.headDim;
  float scale = in.scale;
  int64_t cap = in.capacity;
  if (Hkv <= 0 || H % Hkv != 0 || L <= 0 || cap < L || !heap.contains(qOff, B * T * H * hd) ||
      !heap.contains(oOff, B * T * H * hd) || !heap.contains(kOff, B * cap * Hkv * hd) ||
      !heap.contains(vOff, B * cap * Hkv * hd) ||
      (bOff >= 0 && !heap.contains(bOff, B * T * L)) || (pOff >= 0 && !heap.contains(pOff, B * H * T * L))) {
    args.fail("attention: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  int64_t rep = H / Hkv;
  // Key slots masked (bias ≤ −1e8, the −1e9 of padding and of the causal mask) weigh exactly 0 after the softmax (exp
  // underflows) as long as the query sees some key, so they need not be computed: the leading ones masked for every
  // query of a row (left padding: decode steps of rows of unequal lengths, padded to the longest) and, per block of
  // queries, the trailing ones masked for every query of the block (the causal mask: a training or prefill pass over
  // T tokens computes about half of the T×L scores). A query that sees nothing keeps every slot (the stock result:
  // uniform weights).
  std::vector<int64_t> from(B, 0);
  std::vector<int64_t> upto(B * T, L);  // per query: one past its last visible slot
  if (bOff >= 0) {
    for (int64_t b = 0; b < B; b++) {
      int64_t first = L;
      for (int64_t t = 0; t < T; t++) {
        const float* bias = heap.f32(bOff) + (b * T + t) * L;
        int64_t i = 0;
        while (i < L && bias[i] <= -1e8f) i++;
        if (i == L) {
          first = 0;
          continue;
        }
        first = std::min(first, i);
        int64_t e = L;
        while (e > i && bias[e - 1] <= -1e8f) e--;
        upto[b * T + t] = e;
      }
      from[b] = first == L ? 0 : first;
    }
  }
  if (T == 1 && rep > 1) {
    // A decode step: the `rep` query heads that share a KV head are rows of one [rep, hd] block (for one token they
    // are adjacent in q, out and probs), so each cached key and value is read once per KV head, not once per head.
    int64_t grain = std::max<int64_t>(1, 262144 / std::max<int64_t>(1, 2 * rep * L * hd));
    pool.parallelFor(B * Hkv, grain, [&](int64_t j0, int64_t j1) {
      Scratch own(pOff >= 0 ? 0 : (size_t)(rep * L));
      for (int64_t j = j0; j < j1; j++) {
        int64_t b = j / Hkv, g = j % Hkv;
        int64_t lo = from[b], hi = std::max(lo + 1, upto[b]), n = hi - lo;
        float* S = pOff >= 0 ? heap.f32(pOff) + (b * H + g * rep) * L : own.p;
        const float* K = heap.f32(kOff) + ((b * cap + lo) * Hkv + g) * hd;
        const float* V = heap.f32(vOff) + ((b * cap + lo) * Hkv + g) * hd;
        const float* Q = heap.f32(qOff) + (b * H + g * rep) * hd;
        gemmS(false, true, (int)rep, (int)n, (int)hd, scale, Q, (int)hd, K, (int)(Hkv * hd), 0.0f, S + lo, (int)L);
        const float* bias = bOff >= 0 ? heap.f32(bOff) + b * L : nullptr;
        for (int64_t r = 0; r < rep; r++) maskedSoftmaxRow(S + r * L, bias, lo, hi, L);
        gemmS(false, false, (int)rep, (int)hd, (int)n, 1.0f, S + lo, (int)L, V, (int)(Hkv * hd), 0.0f,
              heap.f32(oOff) + (b * H + g * rep) * hd, (int)hd);
      }
    });
    return undefinedValue(args.env);
  }
  // ~2·T·L·hd multiply-adds a task: decode steps (T = 1) are too small to split.
  int64_t grain = std::max<int64_t>(1, 262144 / std::max<int64_t>(1, 2 * T * L * hd));
  pool.parallelFor(B * H, grain, [&](int64_t j0, int64_t j1) {
    Scratch own(pOff >= 0 ? 0 : (size_t)(T * L));
    for (int64_t j = j0; j < j1; j++) {
      int64_t b = j / H, h = j % H, g = h / rep;
      int64_t lo = from[b];
      float* S = pOff >= 0 ? heap.f32(pOff) + j * T * L : own.p;
      const float* K = heap.f32(kOff) + ((b * cap + lo) * Hkv + g) * hd;
      const float* V = heap.f32(vOff) + ((b * cap + lo) * Hkv + g) * hd;
      for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
        int64_t t1 = std::min(T, t0 + kQueryBlock), hi = lo + 1;
        for (int64_t t = t0; t < t1; t++) hi = std::max(hi, upto[b * T + t]);
        int64_t n = hi - lo;
        const float* Q = heap.f32(qOff) + ((b * T + t0) * H + h) * hd;
        gemmS(false, true, (int)(t1 - t0), (int)n, (int)hd, scale, Q, (int)(H * hd), K, (int)(Hkv * hd), 0.0f,
              S + t0 * L + lo, (int)L);
        for (int64_t t = t0; t < t1; t++)
          maskedSoftmaxRow(S + t * L, bOff >= 0 ? heap.f32(bOff) + (b * T + t) * L : nullptr, lo, hi, L);
        gemmS(false, false, (int)(t1 - t0), (int)hd, (int)n, 1.0f, S + t0 * L + lo, (int)L, V, (int)(Hkv * hd), 0.0f,
              heap.f32(oOff) + ((b * T + t0) * H + h) * hd, (int)(H * hd));
      }
    }
  });
  return undefinedValue(args.env);
}

// One task per (batch, KV head): it owns its dk/dv rows, summing over the heads that share them.
napi_value AttentionGrad(Args& args, const AttentionGradArgs& in) {
  const Heap& heap = in.heap;
  int64_t qOff = in.q, kOff = in.k, vOff = in.v, pOff = in.probs, doOff = in.dOut;
  int64_t dqOff = in.dq, dkOff = in.dk, dvOff = in.dv;
  int64_t B = in.batch, T = in.tokens, L = in.length, H = in.heads, Hkv = in.kvHeads, hd = in.headDim;
  float scale = in.scale;
  int64_t qSize = B * T * H * hd, kvSize = B * L * Hkv * hd;
  if (Hkv <= 0 || H % Hkv != 0 || L <= 0 || !heap.contains(qOff, qSize) || !heap.contains(doOff, qSize) ||
      !heap.contains(dqOff, qSize) || !heap.contains(kOff, kvSize) || !heap.contains(vOff, kvSize) ||
      !heap.contains(dkOff, kvSize) || !heap.contains(dvOff, kvSize) || !heap.contains(pOff, B * H * T * L)) {
    args.fail("attentionGrad: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  int64_t rep = H / Hkv;
  int qld = (int)(H * hd), kld = (int)(Hkv * hd);
  // Per block of queries, only the key slots where some probability of the block is non-zero contribute (elsewhere
  // P = 0, so dS = P·(dP − dot) = 0 and nothing reaches dq, dk or dv): the causal mask's trailing zeros and the left
  // padding's leading ones are skipped, as in the forward pass.
  pool.parallelFor(B * Hkv, 1, [&](int64_t j0, int64_t j1) {
    Scratch dP((size_t)(std::min(T, kQueryBlock) * L));
    for (int64_t j = j0; j < j1; j++) {
      int64_t b = j / Hkv, g = j % Hkv;
      const float* K = heap.f32(kOff) + (b * L * Hkv + g) * hd;
      const float* V = heap.f32(vOff) + (b * L * Hkv + g) * hd;
      float* dK = heap.f32(dkOff) + (b * L * Hkv + g) * hd;
      float* dV = heap.f32(dvOff) + (b * L * Hkv + g) * hd;
      for (int64_t i = 0; i < L; i++) {
        std::memset(dK + i * kld, 0, sizeof(float) * hd);
        std::memset(dV + i * kld, 0, sizeof(float) * hd);
      }
      for (int64_t r = 0; r < rep; r++) {
        int64_t h = g * rep + r;
        const float* P = heap.f32(pOff) + (b * H + h) * T * L;
        for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
          int64_t t1 = std::min(T, t0 + kQueryBlock);
          int tb = (int)(t1 - t0);
          const float* Q = heap.f32(qOff) + ((b * T + t0) * H + h) * hd;
          const float* dO = heap.f32(doOff) + ((b * T + t0) * H + h) * hd;
          float* dQ = heap.f32(dqOff) + ((b * T + t0) * H + h) * hd;
          int64_t a = L, c = 0;
          for (int64_t t = t0; t < t1; t++) {
            const float* p = P + t * L;
            int64_t i = 0, e = L;
            while (i < L && p[i] == 0.0f) i++;
            while (e > i && p[e - 1] == 0.0f) e--;
            if (i < e) a = std::min(a, i), c = std::max(c, e);
          }
          if (a >= c) {  // every probability 0 (not a softmax's output): no gradient
            for (int64_t t = 0; t < tb; t++) std::memset(dQ + t * qld, 0, sizeof(float) * hd);
            continue;
          }
          int n = (int)(c - a);
          const float* Pb = P + t0 * L + a;
          gemmS(true, false, n, (int)hd, tb, 1.0f, Pb, (int)L, dO, qld, 1.0f, dV + a * kld, kld);  // dV += Pᵀ dO
          gemmS(false, true, tb, n, (int)hd, 1.0f, dO, qld, V + a * kld, kld, 0.0f, dP.p, n);  // dP = dO Vᵀ
          for (int t = 0; t < tb; t++) {
            float* d = dP.p + (int64_t)t * n;
            const float* p = Pb + (int64_t)t * L;
            float dot = dotOf(d, p, n);
            for (int i = 0; i < n; i++) d[i] = p[i] * (d[i] - dot);  // dS
          }
          gemmS(false, false, tb, (int)hd, n, scale, dP.p, n, K + a * kld, kld, 0.0f, dQ, qld);  // dQ = s·dS K
          gemmS(true, false, n, (int)hd, tb, scale, dP.p, n, Q, qld, 1.0f, dK + a * kld, kld);  // dK += s·dSᵀ Q
        }
      }
    }
  });
  return undefinedValue(args.env);
}

}  // namespace effect_rl
