// Products with bfloat16 weights: frozen weights (a LoRA run's base, an inference-only model) kept as bfloat16 halve
// their memory and the bytes a decode step streams. Each thread widens a block of columns of the weight to float32
// in its own scratch (a few hundred KB, cache-resident) and multiplies it there; nothing of the size of the weight is
// ever widened at once.
#include <algorithm>
#include <cstring>
#include <vector>

#include "abi.generated.h"
#include "gemm.h"
#include "pool.h"

namespace effect_rl {

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

// One bfloat16 value as float32.
static inline float widen1(uint16_t x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// 8 bfloat16 values widened to float32 in a register.
static inline v8f widen8(const uint16_t* p) {
  v8h h;
  std::memcpy(&h, p, sizeof h);
  v8u u = __builtin_convertvector(h, v8u) << 16;
  v8f f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Few rows (decode), B stored [K, N]: columns [n0, n1) of C = A[M, K] · B for M ≤ kSmallM, B read in memory order.
// Walking a narrow column panel down K rows (a new cache line per row, kilobytes apart) left decode latency-bound at
// 2-3 GB/s. Here each group of KG consecutive rows of B is read across all of this call's columns, W at a time, widened
// into an L1 block, and added into accumulators for all M × (n1 - n0) outputs (L2-resident).
constexpr int kSlabKG = 8, kSlabW = 128;
static void bf16SlabNN(int M, int N, int K, const float* A, const uint16_t* B, float* C, int n0, int n1) {
  int nw = n1 - n0;
  thread_local std::vector<float> accBuf;
  accBuf.assign((size_t)M * nw, 0.0f);
  float* acc = accBuf.data();
  alignas(64) float wb[kSlabKG][kSlabW];
  int k0 = 0;
  for (; k0 + kSlabKG <= K; k0 += kSlabKG) {
    float a[kSmallM][kSlabKG];
    for (int i = 0; i < M; i++)
      for (int t = 0; t < kSlabKG; t++) a[i][t] = A[(int64_t)i * K + k0 + t];
    for (int j0 = 0; j0 < nw; j0 += kSlabW) {
      int w = std::min(kSlabW, nw - j0), wv = w / 8 * 8;
      for (int t = 0; t < kSlabKG; t++) {
        const uint16_t* src = B + (int64_t)(k0 + t) * N + n0 + j0;
        for (int v = 0; v < wv; v += 8) {
          v8f x = widen8(src + v);
          std::memcpy(&wb[t][v], &x, sizeof x);
        }
        for (int v = wv; v < w; v++) wb[t][v] = widen1(src[v]);
      }
      // one row of C at a time: its KG multipliers in registers, 4 column vectors × 2 partial sums = 8 independent
      // FMA chains (one chain per output was FMA-latency-bound at a fifth of the FMA throughput)
      int w32 = w / 32 * 32;
      for (int r = 0; r < M; r++) {
        v8f bc[kSlabKG];
#pragma GCC unroll 8
        for (int t = 0; t < kSlabKG; t++) bc[t] = v8f{} + a[r][t];
        float* accr = acc + (int64_t)r * nw + j0;
        for (int v = 0; v < w32; v += 32) {
          v8f lo[4], hi[4];
#pragma GCC unroll 4
          for (int u = 0; u < 4; u++) {
            lo[u] = *reinterpret_cast<const v8fu*>(accr + v + 8 * u);
            hi[u] = v8f{};
          }
#pragma GCC unroll 4
          for (int t = 0; t < kSlabKG / 2; t++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
              lo[u] += bc[t] * *reinterpret_cast<const v8f*>(&wb[t][v + 8 * u]);
              hi[u] += bc[t + kSlabKG / 2] * *reinterpret_cast<const v8f*>(&wb[t + kSlabKG / 2][v + 8 * u]);
            }
#pragma GCC unroll 4
          for (int u = 0; u < 4; u++) *reinterpret_cast<v8fu*>(accr + v + 8 * u) = lo[u] + hi[u];
        }
        for (int t = 0; t < kSlabKG; t++)
          for (int j = w32; j < w; j++) accr[j] += a[r][t] * wb[t][j];
      }
    }
  }
  for (; k0 < K; k0++) {  // the last K % KG rows
    const uint16_t* src = B + (int64_t)k0 * N + n0;
    for (int r = 0; r < M; r++) {
      float ar = A[(int64_t)r * K + k0];
      float* c = acc + (int64_t)r * nw;
      for (int j = 0; j < nw; j++) c[j] += ar * widen1(src[j]);
    }
  }
  for (int r = 0; r < M; r++) std::memcpy(C + (int64_t)r * N + n0, acc + (int64_t)r * nw, sizeof(float) * nw);
}

napi_value MatmulBf16(Args& args, const MatmulBf16Args& in) {
  const Heap& heap = in.heap;
  int M = in.m, N = in.n, K = in.k;
  bool tb = in.transposeB;
  if (M < 0 || N < 0 || K < 0 || !heap.contains(in.a, (int64_t)M * K) ||
      !heap.containsBytes(in.b, (int64_t)K * N, 2) || !heap.contains(in.out, (int64_t)M * N)) {
    args.fail("matmulBf16: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* A = heap.f32(in.a);
  const uint16_t* B = reinterpret_cast<const uint16_t*>(reinterpret_cast<uintptr_t>(heap.base) + in.b);
  float* C = heap.f32(in.out);
  if (K == 0) {
    std::memset(C, 0, sizeof(float) * (size_t)M * N);
    return undefinedValue(args.env);
  }
  if (M > 64) {
    // Many rows (a training step, a prefill): the product dwarfs widening B once, and whole-B products reuse each
    // packed panel across all rows. B widened into scratch (one weight, transient), then rows of C split over threads.
    int64_t count = (int64_t)K * N;
    Scratch wide((size_t)count);
    uint32_t* wbits = reinterpret_cast<uint32_t*>(wide.p);
    pool.parallelFor(count, 1 << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; i++) wbits[i] = (uint32_t)B[i] << 16;
    });
    // one row part per thread: each part's BLAS call packs B once
    int64_t parts = std::max(1, pool.size());
    pool.parallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
      gemmRows(false, tb, M, N, K, A, wide.p, C, (int)(M * p0 / parts), (int)(M * p1 / parts));
    });
    return undefinedValue(args.env);
  }
  if (M <= kSmallM && !tb) {
    // one contiguous share of the columns per thread (in whole vectors): the wider each row's run, the better it
    // streams
    int64_t vecs = (N + 7) / 8;
    int parts = std::max(1, std::min<int>(pool.size(), (int)vecs));
    pool.parallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
      int n0 = (int)std::min<int64_t>(N, vecs * p0 / parts * 8), n1 = (int)std::min<int64_t>(N, vecs * p1 / parts * 8);
      if (n1 > n0) bf16SlabNN(M, N, K, A, B, C, n0, n1);
    });
    return undefinedValue(args.env);
  }
  // Few rows (decode): column blocks of C, nb columns of op(B) widened to a contiguous [K, nb] (B stored [K, N]) or
  // [nb, K] (B stored [N, K], a transposed product) float32 block in each thread's cache.
  constexpr int nb = 128;
  int64_t blocks = (N + nb - 1) / nb;
  pool.parallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> block;
    block.resize((size_t)K * nb);
    uint32_t* bits = reinterpret_cast<uint32_t*>(block.data());
    for (int64_t blk = b0; blk < b1; blk++) {
      int n0 = (int)(blk * nb), n = std::min(nb, N - n0);
      if (tb) {  // rows n0 … n0 + n of B [N, K]: contiguous
        const uint16_t* src = B + (int64_t)n0 * K;
        for (int64_t i = 0; i < (int64_t)n * K; i++) bits[i] = (uint32_t)src[i] << 16;
        gemmS(false, true, M, n, K, 1.0f, A, K, block.data(), K, 0.0f, C + n0, N);
      } else {  // columns n0 … n0 + n of B [K, N]
        for (int64_t r = 0; r < K; r++) {
          const uint16_t* src = B + r * N + n0;
          uint32_t* dst = bits + r * n;
          for (int c = 0; c < n; c++) dst[c] = (uint32_t)src[c] << 16;
        }
        gemmS(false, false, M, n, K, 1.0f, A, K, block.data(), n, 0.0f, C + n0, N);
      }
    }
  });
  return undefinedValue(args.env);
}

napi_value ToBf16(Args& args, const ToBf16Args& in) {
  int64_t n = in.n;
  if (in.x.bytes < (size_t)n * 4 || in.out.bytes < (size_t)n * 2) {
    args.fail("toBf16: buffers shorter than n elements");
    return nullptr;
  }
  const uint32_t* x = reinterpret_cast<const uint32_t*>(in.x.data);
  uint16_t* out = reinterpret_cast<uint16_t*>(in.out.data);
  pool.parallelFor(n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
      uint32_t u = x[i];
      if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
        out[i] = (uint16_t)((u >> 16) | 0x40);  // quiet NaN
      } else {
        out[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
      }
    }
  });
  return undefinedValue(args.env);
}

napi_value FromBf16(Args& args, const FromBf16Args& in) {
  int64_t n = in.n;
  if (in.x.bytes < (size_t)n * 2 || in.out.bytes < (size_t)n * 4) {
    args.fail("fromBf16: buffers shorter than n elements");
    return nullptr;
  }
  const uint16_t* x = reinterpret_cast<const uint16_t*>(in.x.data);
  uint32_t* out = reinterpret_cast<uint32_t*>(in.out.data);
  pool.parallelFor(n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) out[i] = (uint32_t)x[i] << 16;
  });
  return undefinedValue(args.env);
}

}  // namespace effect_rl
