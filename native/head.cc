// The LM head's log-probs and entropy (LogProbs.ts's fused path, Fused.headLogProbs) without an [N, V] logits tensor:
// logp_n = z[n, y_n] − lse_n and H_n = lse_n − Σ_v p_nv z_nv, with z = h · W, and their gradient.
//
// Work is tiled over vocabulary blocks: for a chunk of rows, each part of the pool takes a run of blocks of W, computes
// z for its block ([rows, kBlock], in cache) with one single-threaded SGEMM, and folds it into per-row running
// statistics (max m, Σ e^{z−m}, Σ e^{z−m}·z: an online log-sum-exp), merged across parts at the end. So W is streamed
// once per row chunk, not once per row, and scratch is a block per thread plus per-row statistics, never N·V.
// The gradient recomputes each block's z, forms gz = gLogp·(onehot − p) − gH·p·(log p + H) in place with the
// forward's lse and H, and runs dh += gz · Wᵀ (a partial per part, summed in a fixed order: deterministic) and
// dW[block] (+)= hᵀ · gz (blocks are disjoint between parts: no race). W is [D, V] as held (untied lm_head), or the
// embedding [V, D] itself (`transposed`: a tied head, no transposed copy); dW has W's layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "abi.generated.h"
#include "gemm.h"
#include "pool.h"
#include "row_math.h"

namespace effect_rl {

namespace {

constexpr int64_t kBlock = 256;        // vocabulary columns per SGEMM: a [rows, 256] block of z stays in L2
constexpr int64_t kForwardRows = 256;  // rows per chunk in the forward pass (W is streamed once per chunk)

struct Head {
  const float* W;
  int64_t D, V;
  bool transposed;  // W is [V, D] (the embedding), else [D, V]
};

// z [rows, vb] (leading dimension vb) = h [rows, D] · W[:, v0 : v0 + vb].
void logitsBlock(const Head& head, const float* h, int rows, int64_t v0, int vb, float* z) {
  int D = (int)head.D;
  if (head.transposed) {
    gemmS(false, true, rows, vb, D, 1.0f, h, D, head.W + v0 * head.D, D, 0.0f, z, vb);
  } else {
    gemmS(false, false, rows, vb, D, 1.0f, h, D, head.W + v0, (int)head.V, 0.0f, z, vb);
  }
}

inline float maxOf(const float* x, int64_t n) {
  float part[16];
  for (int t = 0; t < 16; t++) part[t] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int t = 0; t < 16; t++) part[t] = std::max(part[t], x[i + t]);
  float m = -std::numeric_limits<float>::infinity();
  for (; i < n; i++) m = std::max(m, x[i]);
  for (int t = 0; t < 16; t++) m = std::max(m, part[t]);
  return m;
}

// Σ e^{x−m} and Σ e^{x−m}·x over a row.
inline void expSums(const float* x, int64_t n, float m, float* s, float* t) {
  float ps[16] = {0}, pt[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; k++) {
      float e = fastExp(x[i + k] - m);
      ps[k] += e;
      pt[k] += e * x[i + k];
    }
  }
  float S = 0.0f, T = 0.0f;
  for (; i < n; i++) {
    float e = fastExp(x[i] - m);
    S += e;
    T += e * x[i];
  }
  for (int k = 0; k < 16; k++) {
    S += ps[k];
    T += pt[k];
  }
  *s = S;
  *t = T;
}

// Running statistics of one row over the blocks seen so far: max, Σ e^{z−max}, Σ e^{z−max}·z.
struct RowStats {
  float m;
  double s, t;
};

inline void fold(RowStats& a, float m, double s, double t) {
  if (s == 0.0) return;
  if (m > a.m) {
    double scale = a.s == 0.0 ? 0.0 : std::exp((double)a.m - m);
    a.s = a.s * scale + s;
    a.t = a.t * scale + t;
    a.m = m;
  } else {
    double scale = std::exp((double)m - a.m);
    a.s += s * scale;
    a.t += t * scale;
  }
}

// Parts of the vocabulary's blocks: a fixed split (results do not depend on which thread runs what), a few per
// thread so a descheduled thread's share is taken by the others.
int64_t partsOf(int64_t blocks, int perThread) {
  return std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)perThread * pool.size()));
}

}  // namespace

napi_value HeadLogProbs(Args& args, const HeadLogProbsArgs& in) {
  const Heap& heap = in.heap;
  int64_t N = in.n, D = in.d, V = in.v;
  if (N < 0 || D <= 0 || V <= 0 || D > INT32_MAX || V > INT32_MAX || !heap.contains(in.w, D * V) ||
      (N > 0 && (!heap.contains(in.h, N * D) || !heap.contains(in.targets, N) || !heap.contains(in.out, 2 * N) ||
                 !heap.contains(in.lse, N)))) {
    args.fail("headLogProbs: tensor range outside the heap");
    return nullptr;
  }
  const int32_t* Y = N > 0 ? heap.i32(in.targets) : nullptr;
  bool valid = true;
  for (int64_t n = 0; n < N; n++) valid = valid && Y[n] >= 0 && Y[n] < V;
  napi_value result;
  napi_get_boolean(args.env, valid, &result);
  if (!valid || N == 0) return result;
  calls++;
  const Head head{heap.f32(in.w), D, V, in.transposed};
  const float* H = heap.f32(in.h);
  float* out = heap.f32(in.out);
  float* lseOut = heap.f32(in.lse);
  int64_t blocks = (V + kBlock - 1) / kBlock;
  int64_t parts = partsOf(blocks, 4);
  int64_t rowsMax = std::min(N, kForwardRows);
  Scratch statsBuf((size_t)(parts * rowsMax * sizeof(RowStats) / sizeof(float)));
  Scratch pickedBuf((size_t)rowsMax);
  RowStats* stats = reinterpret_cast<RowStats*>(statsBuf.p);
  float* picked = pickedBuf.p;
  for (int64_t r0 = 0; r0 < N; r0 += rowsMax) {
    int rows = (int)std::min(rowsMax, N - r0);
    const float* h = H + r0 * D;
    const int32_t* y = Y + r0;
    pool.parallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
      Scratch zBuf((size_t)(rows * kBlock));
      for (int64_t p = p0; p < p1; p++) {
        RowStats* st = stats + p * rowsMax;
        for (int r = 0; r < rows; r++) st[r] = {-std::numeric_limits<float>::infinity(), 0.0, 0.0};
        for (int64_t b = blocks * p / parts; b < blocks * (p + 1) / parts; b++) {
          int64_t v0 = b * kBlock;
          int vb = (int)std::min(kBlock, V - v0);
          logitsBlock(head, h, rows, v0, vb, zBuf.p);
          for (int r = 0; r < rows; r++) {
            const float* z = zBuf.p + (int64_t)r * vb;
            float m = maxOf(z, vb), s, t;
            expSums(z, vb, m, &s, &t);
            fold(st[r], m, s, t);
            if (y[r] >= v0 && y[r] < v0 + vb) picked[r] = z[y[r] - v0];  // one block holds each target
          }
        }
      }
    });
    for (int r = 0; r < rows; r++) {
      RowStats all{-std::numeric_limits<float>::infinity(), 0.0, 0.0};
      for (int64_t p = 0; p < parts; p++) {
        const RowStats& st = stats[p * rowsMax + r];
        fold(all, st.m, st.s, st.t);
      }
      double lse = (double)all.m + std::log(all.s);
      int64_t n = r0 + r;
      out[2 * n] = (float)((double)picked[r] - lse);  // logp = z_y − lse
      out[2 * n + 1] = (float)(lse - all.t / all.s);  // H = lse − Σ p z
      lseOut[n] = (float)lse;
    }
  }
  return result;
}

napi_value HeadLogProbsGrad(Args& args, const HeadLogProbsGradArgs& in) {
  const Heap& heap = in.heap;
  int64_t N = in.n, D = in.d, V = in.v;
  if (N < 0 || D <= 0 || V <= 0 || D > INT32_MAX || V > INT32_MAX || !heap.contains(in.w, D * V) ||
      (in.trainW && !heap.contains(in.dw, D * V)) ||
      (N > 0 && (!heap.contains(in.h, N * D) || !heap.contains(in.targets, N) || !heap.contains(in.out, 2 * N) ||
                 !heap.contains(in.lse, N) || !heap.contains(in.dy, 2 * N) || !heap.contains(in.dh, N * D)))) {
    args.fail("headLogProbsGrad: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const Head head{heap.f32(in.w), D, V, in.transposed};
  float* dW = in.trainW ? heap.f32(in.dw) : nullptr;  // a frozen head: no dW, half the gradient's work
  if (N == 0) {
    if (dW == nullptr) return undefinedValue(args.env);
    pool.parallelFor(D * V, 1 << 16, [&](int64_t i0, int64_t i1) { std::memset(dW + i0, 0, sizeof(float) * (i1 - i0)); });
    return undefinedValue(args.env);
  }
  const float* H = heap.f32(in.h);
  const int32_t* Y = heap.i32(in.targets);
  const float* fwd = heap.f32(in.out);
  const float* LSE = heap.f32(in.lse);
  const float* DY = heap.f32(in.dy);
  float* dH = heap.f32(in.dh);
  int64_t blocks = (V + kBlock - 1) / kBlock;
  int64_t parts = partsOf(blocks, 2);
  // Each part keeps its own dh partial [rows, D]: rows per chunk so that all partials fit in 16 MB.
  int64_t rowsMax = std::min(N, std::max<int64_t>(8, std::min<int64_t>(256, ((int64_t)1 << 22) / (parts * D))));
  Scratch partial((size_t)(parts * rowsMax * D));
  for (int64_t r0 = 0; r0 < N; r0 += rowsMax) {
    int rows = (int)std::min(rowsMax, N - r0);
    const float* h = H + r0 * D;
    float beta = r0 == 0 ? 0.0f : 1.0f;  // dW: the first chunk writes, later ones add
    pool.parallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
      Scratch zBuf((size_t)(rows * kBlock));
      float* gz = zBuf.p;
      for (int64_t p = p0; p < p1; p++) {
        float* dh = partial.p + p * rowsMax * D;
        std::memset(dh, 0, sizeof(float) * rows * D);
        for (int64_t b = blocks * p / parts; b < blocks * (p + 1) / parts; b++) {
          int64_t v0 = b * kBlock;
          int vb = (int)std::min(kBlock, V - v0);
          logitsBlock(head, h, rows, v0, vb, gz);
          // gz = gLogp·(onehot − p) − gH·p·(log p + H), in place over z
          for (int r = 0; r < rows; r++) {
            int64_t n = r0 + r;
            float* g = gz + (int64_t)r * vb;
            float lse = LSE[n], entropy = fwd[2 * n + 1], gLogp = DY[2 * n], gH = DY[2 * n + 1];
            for (int j = 0; j < vb; j++) {
              float logp = g[j] - lse;
              float pj = fastExp(logp);
              g[j] = -gLogp * pj - gH * (pj * (logp + entropy));
            }
            int64_t y = Y[n];
            if (y >= v0 && y < v0 + vb) g[y - v0] += gLogp;
          }
          if (head.transposed) {
            // W = E [V, D]: dh += gz · E[block], dE[block] (+)= gzᵀ · h
            const float* e = head.W + v0 * D;
            gemmS(false, false, rows, (int)D, vb, 1.0f, gz, vb, e, (int)D, 1.0f, dh, (int)D);
            if (dW != nullptr) gemmS(true, false, vb, (int)D, rows, 1.0f, gz, vb, h, (int)D, beta, dW + v0 * D, (int)D);
          } else {
            // W [D, V]: dh += gz · W[:, block]ᵀ, dW[:, block] (+)= hᵀ · gz
            gemmS(false, true, rows, (int)D, vb, 1.0f, gz, vb, head.W + v0, (int)V, 1.0f, dh, (int)D);
            if (dW != nullptr) gemmS(true, false, (int)D, vb, rows, 1.0f, h, (int)D, gz, vb, beta, dW + v0, (int)V);
          }
        }
      }
    });
    // dh = Σ_p partial_p, in part order
    pool.parallelFor((int64_t)rows * D, 1 << 14, [&](int64_t i0, int64_t i1) {
      float* dst = dH + r0 * D;
      for (int64_t i = i0; i < i1; i++) {
        float s = 0.0f;
        for (int64_t p = 0; p < parts; p++) s += partial.p[p * rowsMax * D + i];
        dst[i] = s;
      }
    });
  }
  return undefinedValue(args.env);
}

}  // namespace effect_rl
