#include "gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pool.h"

namespace effect_rl {

// SGEMM without BLAS: C[M,N] = op(A)[M,K] · op(B)[K,N] (row-major; lda/ldb are the stored row lengths).
// Blocked for cache (KC × NC panels of B packed row-major), 4-row register blocking, inner loop over N written so
// the compiler vectorises it with the widest FMA the build machine has (-march=native).
#ifndef EFFECT_RL_OPENBLAS
constexpr int KC = 256;
constexpr int NC = 512;

static void gemmBlock(const float* A, int lda, bool ta, const float* Bp, int nc, int kc, int k0, float* C, int ldc,
                      int i0, int i1) {
  int i = i0;
  auto a = [&](int row, int k) { return ta ? A[(int64_t)k * lda + row] : A[(int64_t)row * lda + k]; };
  for (; i + 4 <= i1; i += 4) {
    float* c0 = C + (int64_t)i * ldc;
    float* c1 = c0 + ldc;
    float* c2 = c1 + ldc;
    float* c3 = c2 + ldc;
    for (int k = 0; k < kc; k++) {
      const float* b = Bp + (int64_t)k * nc;
      float a0 = a(i, k0 + k), a1 = a(i + 1, k0 + k), a2 = a(i + 2, k0 + k), a3 = a(i + 3, k0 + k);
#pragma GCC ivdep
      for (int j = 0; j < nc; j++) {
        float bj = b[j];
        c0[j] += a0 * bj;
        c1[j] += a1 * bj;
        c2[j] += a2 * bj;
        c3[j] += a3 * bj;
      }
    }
  }
  for (; i < i1; i++) {
    float* c0 = C + (int64_t)i * ldc;
    for (int k = 0; k < kc; k++) {
      const float* b = Bp + (int64_t)k * nc;
      float a0 = a(i, k0 + k);
#pragma GCC ivdep
      for (int j = 0; j < nc; j++) c0[j] += a0 * b[j];
    }
  }
}

// Single-threaded: callers parallelise over batches or row blocks. `accumulate`: C += op(A)·op(B) instead of =.
static void sgemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                  int ldc, int rowBegin, int rowEnd, bool accumulate = false) {
  if (!accumulate)
    for (int i = rowBegin; i < rowEnd; i++) std::memset(C + (int64_t)i * ldc, 0, sizeof(float) * N);
  Scratch pack((size_t)KC * NC);
  for (int j0 = 0; j0 < N; j0 += NC) {
    int nc = std::min(NC, N - j0);
    for (int k0 = 0; k0 < K; k0 += KC) {
      int kc = std::min(KC, K - k0);
      for (int k = 0; k < kc; k++) {
        float* dst = pack.p + (int64_t)k * nc;
        if (tb) {
          for (int j = 0; j < nc; j++) dst[j] = B[(int64_t)(j0 + j) * ldb + k0 + k];
        } else {
          std::memcpy(dst, B + (int64_t)(k0 + k) * ldb + j0, sizeof(float) * nc);
        }
      }
      gemmBlock(A, lda, ta, pack.p, nc, kc, k0, C + j0, ldc, rowBegin, rowEnd);
    }
  }
}
#endif

// Rows [rowBegin, rowEnd) of one matmul, on the calling thread. OpenBLAS runs single-threaded (set at load):
// the pool splits rows or batches, so two thread pools never fight over the cores.
void gemmRows(bool ta, bool tb, int M, int N, int K, const float* A, const float* B, float* C, int rowBegin,
              int rowEnd) {
  int lda = ta ? M : K;
  int ldb = tb ? K : N;
  int rows = rowEnd - rowBegin;
  if (rows <= 0) return;
  if (K == 0) {
    std::memset(C + (int64_t)rowBegin * N, 0, sizeof(float) * (size_t)rows * N);
    return;
  }
  // Row i of op(A) starts at A + i·lda (not transposed) or at column i of the stored [K, M] (transposed).
  const float* a = ta ? A + rowBegin : A + (int64_t)rowBegin * lda;
#ifdef EFFECT_RL_OPENBLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, rows, N, K, 1.0f, a, lda,
              B, ldb, 0.0f, C + (int64_t)rowBegin * N, N);
#else
  (void)a;
  sgemm(ta, tb, M, N, K, A, lda, B, ldb, C, N, rowBegin, rowEnd);
#endif
}

// Few rows (decode steps: M = batch ≤ kSmallM): stream B once, rows of C stay in L1. BLAS GEMMs pack all of B per
// call, which costs more than the multiply at this size. Columns [n0, n1) of C.
//
// R rows × (kLanes·V) columns of C in R·V vector registers, B streamed once per row group. V = tileVectors(R) fits
// the tile in the target's registers (gemm.h): 8 rows × 2 vectors of 16 floats (16 of AVX-512's 32 registers) were
// 32 of AVX2's 16 when the vector type was fixed at 16 floats, and the spills made a decode step 10x slower there.
// The tile walks its columns of B down K, a row N floats after the last: a stride the hardware prefetchers do not
// follow far enough when B is not in L2 (a decode step's weights, layer after layer, are not), so the tile asks for
// the rows kPrefetchRows ahead itself. A perf-model decode step's products (16.8 MB of weights), one thread: 5.8 ms
// without, 1.7-1.8 ms with (an AVX-512 build; an AVX2 one 7.1 -> 3.0-3.5 ms); 16-24 rows ahead did about as well.
// Returns the first column it did not reach (fewer than kLanes·V columns were left).
constexpr int kPrefetchRows = 20;
template <int R, int V>
static int smallTiles(int N, int K, const float* A, const float* B, float* C, int i0, int n0, int n1) {
  static_assert(R * V + V + 1 <= kVectorRegisters || V == 1, "the tile must fit in the vector registers");
  int j0 = n0;
  for (; j0 + kLanes * V <= n1; j0 += kLanes * V) {
    vfloat c[R][V] = {};
    const float* a0 = A + (int64_t)i0 * K;
    for (int k = 0; k < K; k++) {
      const float* b = B + (int64_t)k * N + j0;
      if (k + kPrefetchRows < K) {
        const float* ahead = b + (int64_t)kPrefetchRows * N;
        for (int j = 0; j < kLanes * V; j += 16) __builtin_prefetch(ahead + j);
        __builtin_prefetch(ahead + kLanes * V - 1);
      }
      vfloat bv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) bv[v] = *reinterpret_cast<const vfloatu*>(b + kLanes * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; r++) {
        float a = a0[(int64_t)r * K + k];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) c[r][v] += a * bv[v];
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
      float* out = C + (int64_t)(i0 + r) * N + j0;
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) *reinterpret_cast<vfloatu*>(out + kLanes * v) = c[r][v];
    }
  }
  return j0;
}

// R rows of C, columns [n0, n1): whole tiles, then one vector at a time, then plain loops over the last < kLanes.
template <int R>
static void smallRows(int N, int K, const float* A, const float* B, float* C, int i0, int n0, int n1) {
  int j0 = smallTiles<R, tileVectors(R)>(N, K, A, B, C, i0, n0, n1);
  if (tileVectors(R) > 1) j0 = smallTiles<R, 1>(N, K, A, B, C, i0, j0, n1);
  if (j0 == n1) return;
  int nb = n1 - j0;
  for (int r = 0; r < R; r++) {
    float acc[kLanes] = {0};
    const float* a = A + (int64_t)(i0 + r) * K;
    for (int k = 0; k < K; k++) {
      const float* b = B + (int64_t)k * N + j0;
      for (int j = 0; j < nb; j++) acc[j] += a[k] * b[j];
    }
    std::memcpy(C + (int64_t)(i0 + r) * N + j0, acc, sizeof(float) * nb);
  }
}

// Wide B (rows ≥ 1 KB apart: a projection's [D, I], an LM head's [D, V]): walking a narrow column panel down K rows
// touches a new page per row and defeats the prefetcher (up to 10x slower than streaming). Instead, chunks of W columns: each row of B is read as one
// contiguous W-float run into R accumulator rows that stay in L1.
template <int R>
static void smallRowsWide(int N, int K, const float* A, const float* B, float* C, int i0, int n0, int n1) {
  constexpr int W = 512;
  alignas(64) float acc[R][W];
  for (int j0 = n0; j0 < n1; j0 += W) {
    int w = std::min(W, n1 - j0);
    for (int r = 0; r < R; r++) std::memset(acc[r], 0, sizeof(float) * w);
    for (int k = 0; k < K; k++) {
      const float* b = B + (int64_t)k * N + j0;
      for (int r = 0; r < R; r++) {
        float a = A[(int64_t)(i0 + r) * K + k];
        float* c = acc[r];
        if (w == W) {
          for (int j = 0; j < W; j++) c[j] += a * b[j];
        } else {
          for (int j = 0; j < w; j++) c[j] += a * b[j];
        }
      }
    }
    for (int r = 0; r < R; r++) std::memcpy(C + (int64_t)(i0 + r) * N + j0, acc[r], sizeof(float) * w);
  }
}

void smallGemmNN(int M, int N, int K, const float* A, const float* B, float* C, int n0, int n1) {
  // Only a B that does not stay in L2 (more than 2 MB) is streamed by rows: one that does is read fastest down its
  // column panels with the accumulators in registers (a small model's [8, 1024] x [1024, 256]: 24 us against 86 us
  // streamed, whose accumulators live in L1 and are loaded and stored at every k).
  if (N >= 256 && (int64_t)K * N > (int64_t)1 << 19) {
    int i0 = 0;
    for (; i0 + 8 <= M; i0 += 8) smallRowsWide<8>(N, K, A, B, C, i0, n0, n1);
    for (; i0 + 4 <= M; i0 += 4) smallRowsWide<4>(N, K, A, B, C, i0, n0, n1);
    for (; i0 < M; i0++) smallRowsWide<1>(N, K, A, B, C, i0, n0, n1);
    return;
  }
  int i0 = 0;
  // batch-8 decode: B read once per kTileRows rows
  for (; i0 + kTileRows <= M; i0 += kTileRows) smallRows<kTileRows>(N, K, A, B, C, i0, n0, n1);
  for (; i0 + 4 <= M; i0 += 4) smallRows<4>(N, K, A, B, C, i0, n0, n1);
  for (; i0 < M; i0++) smallRows<1>(N, K, A, B, C, i0, n0, n1);
}

// B stored [N, K] (transposeB; a tied LM head's embedding): C[i, j] = A[i, :] · B[j, :], dot products over contiguous
// rows. JB rows of B × 2 rows of A in 2·JB vector accumulators: each loaded vector feeds JB or 2 products, and the
// 2·JB independent sums hide the FMA latency (one running sum per output was load- and latency-bound); the JB rows of
// B stay in L1 while every pair of rows of A passes over them.
static inline float hsum(v8f v) {
  float s = 0.0f;
  for (int t = 0; t < 8; t++) s += v[t];
  return s;
}

template <int IB, int JB>
static void dotBlock(int N, int K, const float* A, const float* B, float* C, int i0, int j0) {
  v8f acc[IB][JB] = {};
  const float* a0 = A + (int64_t)i0 * K;
  const float* b0 = B + (int64_t)j0 * K;
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    v8f b[JB];
#pragma GCC unroll 8
    for (int j = 0; j < JB; j++) b[j] = *reinterpret_cast<const v8fu*>(b0 + (int64_t)j * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < IB; i++) {
      v8f a = *reinterpret_cast<const v8fu*>(a0 + (int64_t)i * K + k);
#pragma GCC unroll 8
      for (int j = 0; j < JB; j++) acc[i][j] += a * b[j];
    }
  }
  for (int i = 0; i < IB; i++) {
    const float* a = A + (int64_t)(i0 + i) * K;
    for (int j = 0; j < JB; j++) {
      const float* b = B + (int64_t)(j0 + j) * K;
      float sum = hsum(acc[i][j]);
      for (int kk = k; kk < K; kk++) sum += a[kk] * b[kk];
      C[(int64_t)(i0 + i) * N + j0 + j] = sum;
    }
  }
}

void smallGemmNT(int M, int N, int K, const float* A, const float* B, float* C, int n0, int n1) {
  constexpr int JB = 4;
  int j = n0;
  for (; j + JB <= n1; j += JB) {
    int i = 0;
    for (; i + 2 <= M; i += 2) dotBlock<2, JB>(N, K, A, B, C, i, j);
    for (; i < M; i++) dotBlock<1, JB>(N, K, A, B, C, i, j);
  }
  for (; j < n1; j++) {
    int i = 0;
    for (; i + 2 <= M; i += 2) dotBlock<2, 1>(N, K, A, B, C, i, j);
    for (; i < M; i++) dotBlock<1, 1>(N, K, A, B, C, i, j);
  }
}

void epilogue(float* C, int64_t rows, int N, const float* bias, int act, float alpha) {
  for (int64_t r = 0; r < rows; r++) {
    float* c = C + r * N;
    if (bias != nullptr) {
      for (int j = 0; j < N; j++) c[j] += bias[j];
    }
    switch (act) {
      case kRelu:
        for (int j = 0; j < N; j++) c[j] = c[j] > 0.0f ? c[j] : 0.0f;
        break;
      case kRelu6:
        for (int j = 0; j < N; j++) c[j] = std::min(6.0f, std::max(0.0f, c[j]));
        break;
      case kElu:
        for (int j = 0; j < N; j++) c[j] = c[j] >= 0.0f ? c[j] : std::expm1(c[j]);
        break;
      case kLeakyRelu:
        for (int j = 0; j < N; j++) c[j] = c[j] >= 0.0f ? c[j] : alpha * c[j];
        break;
      case kSigmoid:
        for (int j = 0; j < N; j++) c[j] = 1.0f / (1.0f + std::exp(-c[j]));
        break;
      default:
        break;
    }
  }
}

// C = alpha · op(A) · op(B) + beta · C on the calling thread, any leading dimensions.
void gemmS(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef EFFECT_RL_OPENBLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
#else
  // The blocked SGEMM where it applies (C = or += A·B: all the head kernel's products), else plain loops.
  if (alpha == 1.0f && (beta == 0.0f || beta == 1.0f) && K > 0) {
    sgemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, 0, M, beta == 1.0f);
    return;
  }
  for (int i = 0; i < M; i++) {
    float* c = C + (int64_t)i * ldc;
    for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : c[j] * beta;
    if (tb) {
      for (int j = 0; j < N; j++) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += (ta ? A[(int64_t)k * lda + i] : A[(int64_t)i * lda + k]) * B[(int64_t)j * ldb + k];
        c[j] += alpha * s;
      }
    } else {
      for (int k = 0; k < K; k++) {
        float a = alpha * (ta ? A[(int64_t)k * lda + i] : A[(int64_t)i * lda + k]);
        const float* b = B + (int64_t)k * ldb;
#pragma GCC ivdep
        for (int j = 0; j < N; j++) c[j] += a * b[j];
      }
    }
  }
#endif
}

}  // namespace effect_rl
