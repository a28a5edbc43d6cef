// The matmul kernel (BatchMatMul, _FusedMatMul): batches, broadcasting and the fused epilogue, split over the pool.
#include <algorithm>
#include <cstring>

#include "abi.generated.h"
#include "gemm.h"
#include "pool.h"

namespace effect_rl {

napi_value Matmul(Args& args, const MatmulArgs& in) {
  const Heap& heap = in.heap;
  int64_t aOff = in.a, bOff = in.b, outOff = in.out;
  int64_t batch = in.batch, aStride = in.aBatchStride, bStride = in.bBatchStride;
  int M = in.m, N = in.n, K = in.k;
  bool ta = in.transposeA, tb = in.transposeB;
  int64_t biasOff = in.bias;
  int act = in.activation;
  float alpha = in.alpha;
  const int32_t* aIndex = in.aBatchIndex.data;
  const int32_t* bIndex = in.bBatchIndex.data;
  if (aIndex != nullptr && in.aBatchIndex.count < (size_t)batch) args.fail("aBatchIndex too short");
  if (bIndex != nullptr && in.bBatchIndex.count < (size_t)batch) args.fail("bBatchIndex too short");
  if (!args.ok) return nullptr;
  int64_t aSize = (int64_t)M * K, bSize = (int64_t)K * N, cSize = (int64_t)M * N;
  int64_t aMax = 0, bMax = 0;
  for (int64_t b = 0; b < batch; b++) {
    aMax = std::max<int64_t>(aMax, aIndex ? aIndex[b] : b * aStride);
    bMax = std::max<int64_t>(bMax, bIndex ? bIndex[b] : b * bStride);
  }
  if (M < 0 || N < 0 || K < 0 || batch < 0 || !heap.contains(aOff, aMax + aSize) || !heap.contains(bOff, bMax + bSize) ||
      !heap.contains(outOff, batch * cSize) || (biasOff >= 0 && !heap.contains(biasOff, N))) {
    args.fail("matmul: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* A = heap.f32(aOff);
  const float* B = heap.f32(bOff);
  float* C = heap.f32(outOff);
  const float* bias = biasOff >= 0 ? heap.f32(biasOff) : nullptr;
  auto rowsOf = [&](int64_t b, int r0, int r1) {
    int64_t ia = aIndex ? aIndex[b] : b * aStride;
    int64_t ib = bIndex ? bIndex[b] : b * bStride;
    gemmRows(ta, tb, M, N, K, A + ia, B + ib, C + b * cSize, r0, r1);
  };
  int64_t flops = (int64_t)M * N * std::max(K, 1);
  if (M <= kSmallM && !ta && K > 0) {
    // Split the columns: each thread streams its share of B once.
    int64_t colBlocks = (N + 63) / 64;
    for (int64_t b = 0; b < batch; b++) {
      const float* a = A + (aIndex ? aIndex[b] : b * aStride);
      const float* bm = B + (bIndex ? bIndex[b] : b * bStride);
      float* c = C + b * cSize;
      pool.parallelFor(colBlocks, std::max<int64_t>(1, 262144 / std::max<int64_t>(1, (int64_t)M * K * 64)),
                       [&](int64_t c0, int64_t c1) {
                         int n0 = (int)(c0 * 64), n1 = (int)std::min<int64_t>(N, c1 * 64);
                         if (tb) {
                           smallGemmNT(M, N, K, a, bm, c, n0, n1);
                         } else {
                           smallGemmNN(M, N, K, a, bm, c, n0, n1);
                         }
                       });
    }
  } else if (batch >= pool.size()) {
    // Whole matrices per thread.
    pool.parallelFor(batch, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, flops)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b++) rowsOf(b, 0, M);
    });
  } else {
    // Blocks of 64 rows of C, or (BLAS, when A is the smaller operand) of 64 columns: each chunk's BLAS call packs the
    // whole of the operand it does not split, so split the one that is costlier to repack. About two chunks per thread:
    // big enough to amortise the packing, enough to rebalance when a thread is descheduled.
#ifdef EFFECT_RL_OPENBLAS
    bool byColumns = M < N;
#else
    bool byColumns = false;
#endif
    int64_t units = ((byColumns ? N : M) + 63) / 64;
    int64_t minUnits = std::max<int64_t>(1, (int64_t)262144 / std::max<int64_t>(1, (int64_t)64 * (byColumns ? M : N) * std::max(K, 1)));
    int64_t grain = std::max<int64_t>(minUnits, units / (2 * std::max(1, pool.size())));
    for (int64_t b = 0; b < batch; b++) {
      pool.parallelFor(units, grain, [&](int64_t u0, int64_t u1) {
        if (!byColumns) {
          rowsOf(b, (int)(u0 * 64), (int)std::min<int64_t>(M, u1 * 64));
          return;
        }
#ifdef EFFECT_RL_OPENBLAS
        int n0 = (int)(u0 * 64), n1 = (int)std::min<int64_t>(N, u1 * 64);
        int64_t ia = aIndex ? aIndex[b] : b * aStride;
        int64_t ib = bIndex ? bIndex[b] : b * bStride;
        int lda = ta ? M : K, ldb = tb ? K : N;
        if (K == 0) {
          for (int i = 0; i < M; i++) std::memset(C + b * cSize + (int64_t)i * N + n0, 0, sizeof(float) * (n1 - n0));
          return;
        }
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, n1 - n0, K, 1.0f,
                    A + ia, lda, B + ib + (tb ? (int64_t)n0 * ldb : n0), ldb, 0.0f, C + b * cSize + n0, N);
#endif
      });
    }
  }
  if (bias != nullptr || act != kLinear) {
    int64_t rows = batch * M;
    pool.parallelFor(rows, std::max<int64_t>(1, 8192 / std::max(1, N)),
                     [&](int64_t r0, int64_t r1) { epilogue(C + r0 * N, r1 - r0, N, bias, act, alpha); });
  }
  return undefinedValue(args.env);
}

}  // namespace effect_rl
