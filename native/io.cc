// Memory and file helpers for the native backend and checkpoint loading: the address of a JS buffer (tensors in JS
// memory are passed to kernels by address), and reading a tensor from a safetensors file straight into its float32
// destination, widened from bfloat16/float16 and transposed on the way, through a block buffer.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "abi.generated.h"
#include "pool.h"

namespace effect_rl {

napi_value AddressOf(Args& args, const AddressOfArgs& in) {
  napi_value v;
  napi_create_double(args.env, (double)reinterpret_cast<uintptr_t>(in.view.data), &v);
  return v;
}

namespace {

inline float bf16ToF32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float f16ToF32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float widen(const uint8_t* src, int64_t i, int dtype) {
  if (dtype == 0) {
    float f;
    std::memcpy(&f, src + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, src + i * 2, 2);
  return dtype == 1 ? bf16ToF32(h) : f16ToF32(h);
}

// out [cols, rows] (a column of `rows` floats per source column): out[c · rows + r0 + r] = block[r, c] for the nr
// rows of this block, in 64 × 64 tiles split over the pool by columns. One copy per dtype D (0 float32, 1 bfloat16,
// 2 float16): `widen` with a constant dtype leaves no branch in the loops.
template <int D>
void transposeBlock(const uint8_t* src, float* out, int64_t rows, int64_t cols, int64_t r0, int64_t nr) {
  constexpr int64_t tile = 64;
  int64_t colTiles = (cols + tile - 1) / tile;
  pool.parallelFor(colTiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      int64_t c0 = t * tile, c1 = std::min(cols, c0 + tile);
      for (int64_t rb = 0; rb < nr; rb += tile) {
        int64_t rEnd = std::min(nr, rb + tile);
        for (int64_t c = c0; c < c1; c++) {
          float* dst = out + c * rows + r0;
          for (int64_t r = rb; r < rEnd; r++) dst[r] = widen(src, r * cols + c, D);
        }
      }
    }
  });
}

// The block buffer of this thread's loads: kept from call to call and never zeroed (pread fills what is used). A
// fresh 16 MB vector per tensor was zeroed and faulted in page by page: a tenth of a 0.6B checkpoint's load.
uint8_t* readBuffer(size_t bytes) {
  thread_local std::unique_ptr<uint8_t[]> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buffer.reset(new uint8_t[bytes]);
    capacity = bytes;
  }
  return buffer.get();
}

}  // namespace

napi_value LoadTensor(Args& args, const LoadTensorArgs& in) {
  int64_t rows = in.rows, cols = in.cols;
  int dtype = in.dtype;
  int elem = dtype == 0 ? 4 : 2;
  if (dtype < 0 || dtype > 2 || rows < 0 || cols < 0 || in.offset < 0) {
    args.fail("loadTensor: bad dtype, shape or offset");
    return nullptr;
  }
  if ((uint64_t)(rows * cols) * 4 > in.out.bytes) {
    args.fail("loadTensor: the output is smaller than rows · cols float32 values");
    return nullptr;
  }
  int fd = open(in.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    args.fail((std::string("cannot open ") + in.path + ": " + std::strerror(errno)).c_str());
    return nullptr;
  }
  float* out = reinterpret_cast<float*>(in.out.data);
  // Blocks of whole rows, about 16 MB each: read once, widened (and transposed) by the pool.
  int64_t rowBytes = std::max<int64_t>(1, cols * elem);
  int64_t blockRows = std::max<int64_t>(1, (16 << 20) / rowBytes);
  uint8_t* buffer = readBuffer((size_t)(std::min(rows, blockRows) * rowBytes));
  int64_t total = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += blockRows) {
    int64_t nr = std::min(blockRows, rows - r0);
    size_t want = (size_t)(nr * cols * elem), got = 0;
    while (got < want) {
      ssize_t n = pread(fd, buffer + got, want - got, (off_t)(in.offset + total + (int64_t)got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::string why = n < 0 ? std::strerror(errno) : "the file ends before the tensor does";
        close(fd);
        args.fail((std::string("reading ") + in.path + " at byte " + std::to_string(in.offset + total + got) + ": " +
                   why)
                      .c_str());
        return nullptr;
      }
      got += (size_t)n;
    }
    const uint8_t* src = buffer;
    if (!in.transpose) {
      float* dst = out + r0 * cols;
      int64_t n = nr * cols;
      if (dtype == 0) {
        std::memcpy(dst, src, (size_t)n * 4);
      } else {
        pool.parallelFor(n, 1 << 16, [&](int64_t i0, int64_t i1) {
          if (dtype == 1) {  // bfloat16: the high half of a float32, a shift the compiler vectorises
            const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
            uint32_t* bits = reinterpret_cast<uint32_t*>(dst);
            for (int64_t i = i0; i < i1; i++) bits[i] = (uint32_t)h[i] << 16;
          } else {
            for (int64_t i = i0; i < i1; i++) dst[i] = widen(src, i, dtype);
          }
        });
      }
    } else {
      if (dtype == 0) transposeBlock<0>(src, out, rows, cols, r0, nr);
      else if (dtype == 1) transposeBlock<1>(src, out, rows, cols, r0, nr);
      else transposeBlock<2>(src, out, rows, cols, r0, nr);
    }
    total += (int64_t)want;
  }
  close(fd);
  napi_value v;
  napi_create_double(args.env, (double)total, &v);
  return v;
}

}  // namespace effect_rl
