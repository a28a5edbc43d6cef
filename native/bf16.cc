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
