// Fused transformer kernels (src/model/Fused.ts) other than attention: RMSNorm, SwiGLU, RoPE (each with its
// gradient) and, for inference, linear (row RMSNorm + matmul + residual). Each runs as one kernel where tfjs'
// composition runs 5–20, which is most of a decode step's cost at small sizes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "abi.generated.h"
#include "gemm.h"
#include "pool.h"
#include "row_math.h"

namespace effect_rl {

napi_value RmsNorm(Args& args, const RmsNormArgs& in) {
  const Heap& heap = in.heap;
  int64_t xOff = in.x, wOff = in.w, outOff = in.out, rows = in.rows, n = in.n;
  int64_t wRows = in.wRows;
  float eps = in.eps;
  if (n <= 0 || wRows <= 0 || !heap.contains(xOff, rows * n) || !heap.contains(outOff, rows * n) ||
      (wOff >= 0 && !heap.contains(wOff, wRows * n))) {
    args.fail("rmsNorm: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* X = heap.f32(xOff);
  const float* W = wOff >= 0 ? heap.f32(wOff) : nullptr;
  float* Y = heap.f32(outOff);
  pool.parallelFor(rows, std::max<int64_t>(1, 8192 / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float* x = X + r * n;
      float* y = Y + r * n;
      float rs = rstdOf(x, n, eps);
      if (W != nullptr) {
        const float* w = W + (r % wRows) * n;
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * rs) * w[i];
      } else {
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * rs;
      }
    }
  });
  return undefinedValue(args.env);
}

// Rows are split into one part per thread, each summing its own dw; the parts are added at the end.
napi_value RmsNormGrad(Args& args, const RmsNormGradArgs& in) {
  const Heap& heap = in.heap;
  int64_t xOff = in.x, wOff = in.w, dyOff = in.dy, dxOff = in.dx, dwOff = in.dw;
  int64_t rows = in.rows, n = in.n, wRows = in.wRows;
  float eps = in.eps;
  if (n <= 0 || wRows <= 0 || !heap.contains(xOff, rows * n) || !heap.contains(dyOff, rows * n) ||
      !heap.contains(dxOff, rows * n) || (wOff >= 0 && !heap.contains(wOff, wRows * n)) ||
      (dwOff >= 0 && !heap.contains(dwOff, wRows * n))) {
    args.fail("rmsNormGrad: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* X = heap.f32(xOff);
  const float* W = wOff >= 0 ? heap.f32(wOff) : nullptr;
  const float* DY = heap.f32(dyOff);
  float* DX = heap.f32(dxOff);
  int parts = (int)std::max<int64_t>(1, std::min<int64_t>(pool.size(), rows / 8));
  int64_t wSize = wRows * n;
  Scratch partial(dwOff >= 0 ? (size_t)(parts * wSize) : 0);
  if (partial.p != nullptr) std::memset(partial.p, 0, sizeof(float) * parts * wSize);
  pool.parallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> g((size_t)n);
    for (int64_t p = p0; p < p1; p++) {
      float* dw = partial.p == nullptr ? nullptr : partial.p + p * wSize;
      for (int64_t r = rows * p / parts; r < rows * (p + 1) / parts; r++) {
        const float* x = X + r * n;
        const float* dy = DY + r * n;
        float* dx = DX + r * n;
        const float* w = W == nullptr ? nullptr : W + (r % wRows) * n;
        float rs = rstdOf(x, n, eps);
        for (int64_t i = 0; i < n; i++) g[i] = w == nullptr ? dy[i] : dy[i] * w[i];
        float mean = dotOf(g.data(), x, n) * rs / (float)n;  // mean(g·x̂)
        for (int64_t i = 0; i < n; i++) dx[i] = rs * (g[i] - (x[i] * rs) * mean);
        if (dw != nullptr) {
          float* d = dw + (r % wRows) * n;
          for (int64_t i = 0; i < n; i++) d[i] += dy[i] * (x[i] * rs);
        }
      }
    }
  });
  if (dwOff >= 0) {
    float* DW = heap.f32(dwOff);
    for (int64_t i = 0; i < wSize; i++) {
      float s = 0.0f;
      for (int p = 0; p < parts; p++) s += partial.p[p * wSize + i];
      DW[i] = s;
    }
  }
  return undefinedValue(args.env);
}

napi_value Swiglu(Args& args, const SwigluArgs& in) {
  const Heap& heap = in.heap;
  int64_t gOff = in.gate, uOff = in.up, outOff = in.out, rows = in.rows, n = in.n;
  int64_t gs = in.gateStride, us = in.upStride;
  if (rows <= 0 || n <= 0) return undefinedValue(args.env);
  if (!heap.contains(gOff, (rows - 1) * gs + n) || !heap.contains(uOff, (rows - 1) * us + n) ||
      !heap.contains(outOff, rows * n)) {
    args.fail("swiglu: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float* g = heap.f32(gOff) + r * gs;
      const float* u = heap.f32(uOff) + r * us;
      float* y = heap.f32(outOff) + r * n;
      for (int64_t i = 0; i < n; i++) y[i] = (g[i] * sigmoidOf(g[i])) * u[i];
    }
  });
  return undefinedValue(args.env);
}

napi_value SwigluGrad(Args& args, const SwigluGradArgs& in) {
  const Heap& heap = in.heap;
  int64_t gOff = in.gate, uOff = in.up, dyOff = in.dy, dgOff = in.dgate, duOff = in.dup;
  int64_t rows = in.rows, n = in.n;
  int64_t size = rows * n;
  if (!heap.contains(gOff, size) || !heap.contains(uOff, size) || !heap.contains(dyOff, size) ||
      !heap.contains(dgOff, size) || !heap.contains(duOff, size)) {
    args.fail("swigluGrad: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(size, 16384, [&](int64_t i0, int64_t i1) {
    const float *g = heap.f32(gOff), *u = heap.f32(uOff), *dy = heap.f32(dyOff);
    float *dg = heap.f32(dgOff), *du = heap.f32(duOff);
    for (int64_t i = i0; i < i1; i++) {
      float s = sigmoidOf(g[i]);
      du[i] = dy[i] * (g[i] * s);
      dg[i] = dy[i] * u[i] * (s + g[i] * s * (1.0f - s));
    }
  });
  return undefinedValue(args.env);
}

napi_value Rope(Args& args, const RopeArgs& in) {
  const Heap& heap = in.heap;
  int64_t xOff = in.x, cOff = in.cos, sOff = in.sin, outOff = in.out;
  int64_t N = in.n, heads = in.heads, hd = in.headDim;
  bool backward = in.backward;
  if (hd % 2 != 0 || !heap.contains(xOff, N * heads * hd) || !heap.contains(outOff, N * heads * hd) ||
      !heap.contains(cOff, N * hd) || !heap.contains(sOff, N * hd)) {
    args.fail("rope: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(N * heads, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, hd)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      int64_t n = r / heads;
      ropeVec(heap.f32(xOff) + r * hd, heap.f32(cOff) + n * hd, heap.f32(sOff) + n * hd, heap.f32(outOff) + r * hd,
              (int)hd, backward);
    }
  });
  return undefinedValue(args.env);
}

napi_value Linear(Args& args, const LinearArgs& in) {
  const Heap& heap = in.heap;
  int64_t aOff = in.a, bOff = in.b, oOff = in.out;
  int M = in.m, N = in.n, K = in.k;
  int64_t rOff = in.residual;
  double normEps = in.normEps;
  if (M <= 0 || N <= 0 || K <= 0 || !heap.contains(aOff, (int64_t)M * K) || !heap.contains(bOff, (int64_t)K * N) ||
      !heap.contains(oOff, (int64_t)M * N) || (rOff >= 0 && !heap.contains(rOff, (int64_t)M * N))) {
    args.fail("linear: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* A = heap.f32(aOff);
  const float* Bm = heap.f32(bOff);
  float* C = heap.f32(oOff);
  const float* R = rOff >= 0 ? heap.f32(rOff) : nullptr;
  auto finish = [&](int64_t i0, int64_t i1, int n0, int n1) {
    for (int64_t i = i0; i < i1; i++) {
      float rs = normEps >= 0 ? rstdOf(A + i * K, K, (float)normEps) : 1.0f;
      float* c = C + i * N;
      const float* res = R == nullptr ? nullptr : R + i * N;
      if (normEps >= 0)
        for (int j = n0; j < n1; j++) c[j] *= rs;
      if (res != nullptr)
        for (int j = n0; j < n1; j++) c[j] += res[j];
    }
  };
  if (M <= kSmallM) {
    int64_t colBlocks = (N + 63) / 64;
    pool.parallelFor(colBlocks, std::max<int64_t>(1, 262144 / std::max<int64_t>(1, (int64_t)M * K * 64)),
                     [&](int64_t c0, int64_t c1) {
                       int n0 = (int)(c0 * 64), n1 = (int)std::min<int64_t>(N, c1 * 64);
                       smallGemmNN(M, N, K, A, Bm, C, n0, n1);
                       finish(0, M, n0, n1);
                     });
  } else {
    int64_t blocks = (M + 15) / 16;
    int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, (int64_t)16 * N * K));
    pool.parallelFor(blocks, grain, [&](int64_t k0, int64_t k1) {
      int r0 = (int)(k0 * 16), r1 = (int)std::min<int64_t>(M, k1 * 16);
      gemmRows(false, false, M, N, K, A, Bm, C, r0, r1);
      finish(r0, r1, 0, N);
    });
  }
  return undefinedValue(args.env);
}

}  // namespace effect_rl
