// Layout kernels that move bytes without arithmetic: strided copies (Transpose, Slice), Concat/SplitV block copies,
// gathers (embedding lookups) and their gradient, the segment sum.
#include <algorithm>
#include <cstring>
#include <vector>

#include "abi.generated.h"
#include "pool.h"

namespace effect_rl {

// Rows of the last out axis are copied with the input's stride, or, when another out axis walks the input
// contiguously, 2-d tiles are transposed through registers.
napi_value Transpose(Args& args, const TransposeArgs& in) {
  const Heap& heap = in.heap;
  int64_t xOff = in.x, outOff = in.out;
  int elem = in.elementBytes;
  int rank = in.rank;
  const int32_t* shape = in.outShape.data;
  const int32_t* strides = in.inStrides.data;
  if (rank < 1 || rank > 8 || in.outShape.count < (size_t)rank || in.inStrides.count < (size_t)rank ||
      (elem != 4 && elem != 1)) {
    args.fail("transpose: bad shape");
    return nullptr;
  }
  int64_t size = 1, ext = 1;
  for (int k = 0; k < rank; k++) {
    size *= shape[k];
    ext += (int64_t)(shape[k] - 1) * strides[k];
  }
  if (size == 0) return undefinedValue(args.env);
  if (!heap.containsBytes(xOff, ext, elem) || !heap.containsBytes(outOff, size, elem)) {
    args.fail("transpose: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  int64_t n = shape[rank - 1];
  int64_t sn = strides[rank - 1];
  int64_t rows = size / n;
  int j = -1;  // the out axis that walks the input contiguously, when it is not the last one
  for (int k = 0; k < rank - 1 && sn != 1; k++)
    if (strides[k] == 1) j = k;
  if (sn == 1 || j < 0) {
    pool.parallelFor(rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        int64_t rest = r, offset = 0;
        for (int k = rank - 2; k >= 0; k--) {
          offset += (rest % shape[k]) * strides[k];
          rest /= shape[k];
        }
        if (elem == 4) {
          const float* src = heap.f32(xOff) + offset;
          float* dst = heap.f32(outOff) + r * n;
          if (sn == 1) {
            std::memcpy(dst, src, n * 4);
          } else {
            for (int64_t i = 0; i < n; i++) dst[i] = src[i * sn];
          }
        } else {
          const uint8_t* src = heap.base + xOff + offset;
          uint8_t* dst = heap.base + outOff + r * n;
          for (int64_t i = 0; i < n; i++) dst[i] = src[i * sn];
        }
      }
    });
    return undefinedValue(args.env);
  }
  // Tiled 2-d transposes of [shape[j], n] planes: reads contiguous along j, writes contiguous along the last axis.
  std::vector<int64_t> outStride(rank);
  outStride[rank - 1] = 1;
  for (int k = rank - 2; k >= 0; k--) outStride[k] = outStride[k + 1] * shape[k + 1];
  int64_t m = shape[j];
  int64_t planes = size / (m * n);
  constexpr int64_t TILE = 32;
  int64_t tilesM = (m + TILE - 1) / TILE, tilesN = (n + TILE - 1) / TILE;
  int64_t tasks = planes * tilesM * tilesN;
  pool.parallelFor(tasks, std::max<int64_t>(1, 16384 / (TILE * TILE)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      int64_t tn = t % tilesN, tm = (t / tilesN) % tilesM, plane = t / (tilesN * tilesM);
      // offsets of this plane: decompose `plane` over the out axes other than j and the last one
      int64_t rest = plane, src = 0, dst = 0;
      for (int k = rank - 2; k >= 0; k--) {
        if (k == j) continue;
        int64_t c = rest % shape[k];
        rest /= shape[k];
        src += c * strides[k];
        dst += c * outStride[k];
      }
      int64_t i0 = tm * TILE, i1 = std::min(m, i0 + TILE);
      int64_t c0 = tn * TILE, c1 = std::min(n, c0 + TILE);
      if (elem == 4) {
        const float* x = heap.f32(xOff) + src;
        float* y = heap.f32(outOff) + dst;
        const int64_t os = outStride[j];
        // 8×8 blocks through a register-sized buffer: 8 contiguous loads, 8 contiguous stores, so power-of-two
        // strides touch only 8 cache lines per side (no L1 set thrashing).
        for (int64_t cb = c0; cb < c1; cb += 8) {
          for (int64_t ib = i0; ib < i1; ib += 8) {
            if (cb + 8 <= c1 && ib + 8 <= i1) {
              float tmp[8][8];
              for (int c = 0; c < 8; c++)
                for (int i = 0; i < 8; i++) tmp[c][i] = x[ib + i + (cb + c) * sn];
              for (int i = 0; i < 8; i++)
                for (int c = 0; c < 8; c++) y[(ib + i) * os + cb + c] = tmp[c][i];
            } else {
              for (int64_t c = cb; c < std::min(c1, cb + 8); c++)
                for (int64_t i = ib; i < std::min(i1, ib + 8); i++) y[i * os + c] = x[i + c * sn];
            }
          }
        }
      } else {
        const uint8_t* x = heap.base + xOff + src;
        uint8_t* y = heap.base + outOff + dst;
        for (int64_t c = c0; c < c1; c++)
          for (int64_t i = i0; i < i1; i++) y[i * outStride[j] + c] = x[i + c * sn];
      }
    }
  });
  return undefinedValue(args.env);
}

napi_value Gather(Args& args, const GatherArgs& in) {
  const Heap& heap = in.heap;
  int64_t xOff = in.x, idxOff = in.indices, outOff = in.out;
  int64_t outer = in.outer, axisDim = in.axisDim, count = in.count, inner = in.inner;
  int elem = in.elementBytes;
  if ((elem != 4 && elem != 1) || !heap.containsBytes(xOff, outer * axisDim * inner, elem) ||
      !heap.contains(idxOff, count) || !heap.containsBytes(outOff, outer * count * inner, elem)) {
    args.fail("gather: tensor range outside the heap");
    return nullptr;
  }
  const int32_t* idx = heap.i32(idxOff);
  bool valid = true;
  for (int64_t i = 0; i < count; i++) valid = valid && idx[i] >= 0 && idx[i] < axisDim;
  napi_value result;
  napi_get_boolean(args.env, valid, &result);
  if (!valid) return result;
  calls++;
  int64_t rows = outer * count;
  pool.parallelFor(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, inner)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      int64_t o = r / count, i = r % count;
      std::memcpy(heap.base + outOff + r * inner * elem, heap.base + xOff + ((o * axisDim + idx[i]) * inner) * elem,
                  inner * elem);
    }
  });
  return result;
}

// Threads split the columns, so no two write the same element.
napi_value SegmentSum(Args& args, const SegmentSumArgs& in) {
  const Heap& heap = in.heap;
  int64_t xOff = in.x, idsOff = in.segmentIds, outOff = in.out;
  int64_t count = in.count, inner = in.inner, segments = in.numSegments;
  if (!heap.contains(xOff, count * inner) || !heap.contains(idsOff, count) || !heap.contains(outOff, segments * inner)) {
    args.fail("segmentSum: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const int32_t* ids = heap.i32(idsOff);
  const float* x = heap.f32(xOff);
  float* out = heap.f32(outOff);
  std::memset(out, 0, sizeof(float) * segments * inner);
  int64_t colBlocks = (inner + 63) / 64;
  pool.parallelFor(colBlocks, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, count * 64)), [&](int64_t b0, int64_t b1) {
    int64_t c0 = b0 * 64, c1 = std::min(inner, b1 * 64);
    for (int64_t i = 0; i < count; i++) {
      int64_t sgm = ids[i];
      if (sgm < 0 || sgm >= segments) continue;
      const float* src = x + i * inner;
      float* dst = out + sgm * inner;
      for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
    }
  });
  return undefinedValue(args.env);
}

// Concat and SplitV are one call per input/output.
napi_value CopyBlocks(Args& args, const CopyBlocksArgs& in) {
  const Heap& heap = in.heap;
  int64_t src = in.src, dst = in.dst, outer = in.outer, srcStride = in.srcStride, dstStride = in.dstStride,
          chunk = in.chunk;
  if (outer <= 0 || chunk <= 0) return undefinedValue(args.env);
  auto inside = [&](int64_t off, int64_t stride) {
    return off >= 0 && stride >= 0 && (uint64_t)off + (uint64_t)(outer - 1) * stride + chunk <= heap.length;
  };
  if (!inside(src, srcStride) || !inside(dst, dstStride)) {
    args.fail("copyBlocks: range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(outer, std::max<int64_t>(1, 65536 / chunk), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; o++) std::memcpy(heap.base + dst + o * dstStride, heap.base + src + o * srcStride, chunk);
  });
  return undefinedValue(args.env);
}

}  // namespace effect_rl
