// effect-rl native CPU kernels for the tfjs wasm backend.
//
// Every kernel works in place on the wasm heap: JS passes the heap (a Uint8Array over the wasm memory, fetched per
// call because heap growth detaches the old buffer) and byte offsets of the tensors tfjs already allocated there, so
// nothing is copied. Written against the plain N-API C interface (node_api.h, ABI-stable): one build against the
// Node 20 headers loads in any later Node.
//
// Matmuls go to OpenBLAS when it linked at build time (EFFECT_RL_OPENBLAS), else to the blocked SGEMM below.
// Element-wise work is split over a small pthread pool (std::thread) sized by setThreads (default: hardware cores).
#include <node_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#ifdef EFFECT_RL_OPENBLAS
extern "C" {
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int M, int N, int K, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
void openblas_set_num_threads(int);
}
#endif

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Thread pool: the calling thread plus (threads - 1) workers; parallelFor splits [0, n) into contiguous chunks.
class Pool {
 public:
  ~Pool() { resize(1); }

  int size() const { return threads_; }

  void resize(int threads) {
    threads = std::max(1, std::min(threads, 64));
    if (threads == threads_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      generation_++;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
    threads_ = threads;
    for (int w = 1; w < threads_; w++) workers_.emplace_back([this, w] { loop(w); });
  }

  // f(begin, end) over chunks of [0, n); runs inline when n is below `grain` work items per thread.
  void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
    if (n <= 0) return;
    int parts = (int)std::min<int64_t>(threads_, std::max<int64_t>(1, n / std::max<int64_t>(1, grain)));
    if (parts <= 1) {
      f(0, n);
      return;
    }
    std::lock_guard<std::mutex> caller(callers_);  // one job at a time (several worker_threads may load the addon)
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &f;
    jobN_ = n;
    jobParts_ = parts;
    pending_ = parts - 1;
    generation_++;
    lock.unlock();
    wake_.notify_all();
    runPart(0);
    lock.lock();
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void runPart(int part) {
    int64_t begin = jobN_ * part / jobParts_;
    int64_t end = jobN_ * (part + 1) / jobParts_;
    if (begin < end) (*job_)(begin, end);
  }

  void loop(int w) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      if (job_ == nullptr || w >= jobParts_) continue;
      lock.unlock();
      runPart(w);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mutex_, callers_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t jobN_ = 0;
  int jobParts_ = 0;
  int pending_ = 0;
};

Pool pool;
std::atomic<int64_t> scratchBytes{0};  // bytes of native scratch currently allocated (leak check)
std::atomic<int64_t> calls{0};

// Scratch buffer owned for one kernel call; counted so tests can see native memory does not grow.
struct Scratch {
  float* p = nullptr;
  size_t bytes = 0;
  explicit Scratch(size_t n) : bytes(n * sizeof(float)) {
    if (n == 0) return;
    p = static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    scratchBytes += (int64_t)bytes;
  }
  ~Scratch() {
    if (p != nullptr) {
      std::free(p);
      scratchBytes -= (int64_t)bytes;
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// ---------------------------------------------------------------------------------------------------------------
// SGEMM without BLAS: C[M,N] = op(A)[M,K] · op(B)[K,N] (row-major; lda/ldb are the stored row lengths).
// Blocked for cache (KC × NC panels of B packed row-major), 4-row register blocking, inner loop over N written so
// the compiler vectorises it with the widest FMA the build machine has (-march=native).
#ifndef EFFECT_RL_OPENBLAS
constexpr int KC = 256;
constexpr int NC = 512;

void gemmBlock(const float* A, int lda, bool ta, const float* Bp, int nc, int kc, int k0, float* C, int ldc, int i0,
               int i1) {
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

// Single-threaded: callers parallelise over batches or row blocks.
void sgemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
           int rowBegin, int rowEnd) {
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

// One matmul of the batch, all rows. With OpenBLAS the library threads it; without, rows are split over the pool.
void gemmOne(bool ta, bool tb, int M, int N, int K, const float* A, const float* B, float* C, bool parallel) {
  int lda = ta ? M : K;
  int ldb = tb ? K : N;
  if (K == 0) {
    std::memset(C, 0, sizeof(float) * (size_t)M * N);
    return;
  }
#ifdef EFFECT_RL_OPENBLAS
  (void)parallel;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B,
              ldb, 0.0f, C, N);
#else
  if (parallel) {
    int blocks = (M + 3) / 4;
    pool.parallelFor(blocks, std::max<int64_t>(1, 16384 / std::max(1, N * K / 4 + 1)), [&](int64_t b0, int64_t b1) {
      sgemm(ta, tb, M, N, K, A, lda, B, ldb, C, N, (int)b0 * 4, (int)std::min<int64_t>(M, b1 * 4));
    });
  } else {
    sgemm(ta, tb, M, N, K, A, lda, B, ldb, C, N, 0, M);
  }
#endif
}

enum Activation { kLinear = 0, kRelu = 1, kRelu6 = 2, kElu = 3, kLeakyRelu = 4, kSigmoid = 5 };

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

// ---------------------------------------------------------------------------------------------------------------
// N-API plumbing.
struct Args {
  napi_env env;
  size_t argc = 24;
  napi_value argv[24];
  bool ok = true;

  Args(napi_env e, napi_callback_info info) : env(e) { napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr); }

  double num(size_t i) {
    double v = 0;
    if (i >= argc || napi_get_value_double(env, argv[i], &v) != napi_ok) fail("expected a number argument");
    return v;
  }
  int64_t i64(size_t i) { return (int64_t)num(i); }
  bool flag(size_t i) {
    bool v = false;
    if (i >= argc || napi_get_value_bool(env, argv[i], &v) != napi_ok) fail("expected a boolean argument");
    return v;
  }
  bool isNullish(size_t i) {
    napi_valuetype t;
    if (i >= argc) return true;
    napi_typeof(env, argv[i], &t);
    return t == napi_null || t == napi_undefined;
  }
  // Base pointer and length of a typed array (the wasm heap view, or an index array).
  uint8_t* bytes(size_t i, size_t* length) {
    napi_typedarray_type type;
    size_t count = 0;
    void* data = nullptr;
    napi_value buffer;
    size_t offset = 0;
    if (i >= argc || napi_get_typedarray_info(env, argv[i], &type, &count, &data, &buffer, &offset) != napi_ok) {
      fail("expected a typed array argument");
      *length = 0;
      return nullptr;
    }
    size_t elem = (type == napi_int32_array || type == napi_uint32_array || type == napi_float32_array) ? 4 : 1;
    *length = count * elem;
    return static_cast<uint8_t*>(data);
  }
  void fail(const char* message) {
    if (ok) napi_throw_error(env, "EFFECT_RL_NATIVE", message);
    ok = false;
  }
};

// Heap view with bounds checks: every tensor range a kernel touches must lie inside the heap.
struct Heap {
  uint8_t* base = nullptr;
  size_t length = 0;
  bool contains(int64_t offset, int64_t count) const {
    return offset >= 0 && count >= 0 && (uint64_t)offset + (uint64_t)count * 4 <= length && offset % 4 == 0;
  }
  float* f32(int64_t offset) const { return reinterpret_cast<float*>(base + offset); }
  int32_t* i32(int64_t offset) const { return reinterpret_cast<int32_t*>(base + offset); }
};

bool heapArg(Args& args, size_t i, Heap* heap) {
  heap->base = args.bytes(i, &heap->length);
  return args.ok;
}

napi_value undefinedValue(napi_env env) {
  napi_value v;
  napi_get_undefined(env, &v);
  return v;
}

// matmul(heap, aOff, bOff, outOff, batch, aBatchStride, bBatchStride, M, N, K, transposeA, transposeB,
//        biasOff, activation, alpha, aBatchIndex?, bBatchIndex?)
// out[b] = act(op(A[ia(b)]) · op(B[ib(b)]) + bias), offsets in bytes, strides/indices in elements. ia(b) is
// aBatchIndex[b] when given (an Int32Array, for general batch broadcasting), else b · aBatchStride. biasOff < 0: none;
// bias is a [N] row.
napi_value Matmul(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t aOff = args.i64(1), bOff = args.i64(2), outOff = args.i64(3);
  int64_t batch = args.i64(4), aStride = args.i64(5), bStride = args.i64(6);
  int M = (int)args.i64(7), N = (int)args.i64(8), K = (int)args.i64(9);
  bool ta = args.flag(10), tb = args.flag(11);
  int64_t biasOff = args.i64(12);
  int act = (int)args.i64(13);
  float alpha = (float)args.num(14);
  const int32_t* aIndex = nullptr;
  const int32_t* bIndex = nullptr;
  size_t len = 0;
  if (!args.isNullish(15)) {
    aIndex = reinterpret_cast<const int32_t*>(args.bytes(15, &len));
    if (args.ok && len < (size_t)batch * 4) args.fail("aBatchIndex too short");
  }
  if (!args.isNullish(16)) {
    bIndex = reinterpret_cast<const int32_t*>(args.bytes(16, &len));
    if (args.ok && len < (size_t)batch * 4) args.fail("bBatchIndex too short");
  }
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
  auto one = [&](int64_t b, bool parallel) {
    int64_t ia = aIndex ? aIndex[b] : b * aStride;
    int64_t ib = bIndex ? bIndex[b] : b * bStride;
    gemmOne(ta, tb, M, N, K, A + ia, B + ib, C + b * cSize, parallel);
  };
#ifdef EFFECT_RL_OPENBLAS
  for (int64_t b = 0; b < batch; b++) one(b, true);
#else
  if (batch >= pool.size() && batch > 1) {
    pool.parallelFor(batch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b++) one(b, false);
    });
  } else {
    for (int64_t b = 0; b < batch; b++) one(b, true);
  }
#endif
  if (bias != nullptr || act != kLinear) {
    int64_t rows = batch * M;
    pool.parallelFor(rows, std::max<int64_t>(1, 8192 / std::max(1, N)),
                     [&](int64_t r0, int64_t r1) { epilogue(C + r0 * N, r1 - r0, N, bias, act, alpha); });
  }
  return undefinedValue(env);
}

napi_value SetThreads(napi_env env, napi_callback_info info) {
  Args args(env, info);
  int threads = (int)args.i64(0);
  if (!args.ok) return nullptr;
  if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
  pool.resize(threads);
#ifdef EFFECT_RL_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  return undefinedValue(env);
}

napi_value Info(napi_env env, napi_callback_info) {
  napi_value out, v;
  napi_create_object(env, &out);
#ifdef EFFECT_RL_OPENBLAS
  napi_create_string_utf8(env, "openblas", NAPI_AUTO_LENGTH, &v);
#else
  napi_create_string_utf8(env, "builtin", NAPI_AUTO_LENGTH, &v);
#endif
  napi_set_named_property(env, out, "blas", v);
  napi_create_int32(env, pool.size(), &v);
  napi_set_named_property(env, out, "threads", v);
  napi_create_double(env, (double)scratchBytes.load(), &v);
  napi_set_named_property(env, out, "scratchBytes", v);
  napi_create_double(env, (double)calls.load(), &v);
  napi_set_named_property(env, out, "calls", v);
#if defined(__AVX512F__)
  napi_create_string_utf8(env, "avx512", NAPI_AUTO_LENGTH, &v);
#elif defined(__AVX2__)
  napi_create_string_utf8(env, "avx2", NAPI_AUTO_LENGTH, &v);
#else
  napi_create_string_utf8(env, "baseline", NAPI_AUTO_LENGTH, &v);
#endif
  napi_set_named_property(env, out, "simd", v);
  return out;
}

}  // namespace

napi_value Init(napi_env env, napi_value exports) {
  struct Fn {
    const char* name;
    napi_callback cb;
  };
  const Fn fns[] = {{"matmul", Matmul}, {"setThreads", SetThreads}, {"info", Info}};
  for (const Fn& fn : fns) {
    napi_value f;
    napi_create_function(env, fn.name, NAPI_AUTO_LENGTH, fn.cb, nullptr, &f);
    napi_set_named_property(env, exports, fn.name, f);
  }
  pool.resize((int)std::max(1u, std::thread::hardware_concurrency()));
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
