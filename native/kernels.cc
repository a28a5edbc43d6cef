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
#include <chrono>
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
// Thread pool: the calling thread plus (threads - 1) workers. parallelFor splits [0, n) into chunks that the threads
// claim one at a time, so on a loaded machine a worker that is not scheduled does not hold the job up: the caller
// (always running) takes its chunks. Claims carry the job's generation, so a late worker never runs a stale job.
class Pool {
 public:
  ~Pool() { resize(1); }

  int size() const { return threads_; }

  void resize(int threads) {
    std::lock_guard<std::mutex> caller(callers_);  // never while a job runs (another worker_thread may be mid-kernel)
    threads = std::max(1, std::min(threads, 64));
    if (threads == threads_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true, std::memory_order_release);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stop_.store(false, std::memory_order_release);
    threads_ = threads;
    // The generation is read here, before the thread starts: read inside the thread, a resize racing its start could
    // bump it first and the worker would wait for a generation that already came (a hang seen in practice).
    uint64_t start = generation_.load(std::memory_order_acquire);
    for (int w = 1; w < threads_; w++) workers_.emplace_back([this, start] { loop(start); });
  }

  // f(begin, end) over chunks of [0, n); runs inline when n is below `grain` work items per thread.
  void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
    if (n <= 0) return;
    int64_t g = std::max<int64_t>(1, grain);
    int64_t maxParts = std::max<int64_t>(1, n / g);
    if (threads_ <= 1 || maxParts <= 1) {
      f(0, n);
      return;
    }
    // A few chunks per thread (never smaller than the grain): enough to rebalance when a thread is descheduled.
    int64_t chunks = std::min<int64_t>(maxParts, (int64_t)threads_ * 4);
    std::lock_guard<std::mutex> caller(callers_);  // one job at a time (several worker_threads may load the addon)
    // Close the previous job's claims before its fields are reused: a worker still in work() for it may hold a stale
    // claim word whose chunk index was past the old count but is below the new one; without this it would claim (and
    // count in done_) a chunk of the new job under the old generation, so done_ overshoots `chunks` and the caller
    // waits forever, or a chunk runs twice (hangs and crashes seen in RL runs). The CAS in work() fails on this value.
    claim_.store((generation_.load(std::memory_order_relaxed) << 32) | 0xffffffffu, std::memory_order_release);
    job_ = &f;
    jobN_ = n;
    jobChunks_ = chunks;
    done_.store(0, std::memory_order_relaxed);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gen = (generation_.load(std::memory_order_relaxed) + 1) & 0xffffffffu;
      claim_.store(gen << 32, std::memory_order_release);  // next chunk 0 of this generation
      generation_.store(gen, std::memory_order_release);
    }
    wake_.notify_all();
    work(gen);
    // Workers finishing a claimed chunk: spin briefly, then sleep.
    if (!spinUntil([&] { return done_.load(std::memory_order_acquire) == chunks; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == chunks; });
    }
    job_ = nullptr;
  }

 private:
  // Kernels come back to back during a training step, so a worker spins ~50 µs for the next job before it sleeps.
  template <typename Pred>
  static bool spinUntil(Pred done) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0;; i++) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(50)) return false;
    }
  }

  // Claim and run chunks of job `gen` until none is left (or the job is no longer `gen`).
  void work(uint64_t gen) {
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      for (;;) {
        if ((c >> 32) != gen || (int64_t)(c & 0xffffffffu) >= jobChunks_) return;
        if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
      }
      int64_t chunk = (int64_t)(c & 0xffffffffu);
      int64_t begin = jobN_ * chunk / jobChunks_;
      int64_t end = jobN_ * (chunk + 1) / jobChunks_;
      if (begin < end) (*job_)(begin, end);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == jobChunks_) {
        std::lock_guard<std::mutex> lock(mutex_);
        finished_.notify_one();
      }
    }
  }

  void loop(uint64_t seen) {
    for (;;) {
      auto ready = [&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; };
      if (!spinUntil(ready)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, ready);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      work(seen);
    }
  }

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mutex_, callers_;
  std::condition_variable wake_, finished_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claim_{0};  // generation << 32 | next chunk
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t jobN_ = 0;
  int64_t jobChunks_ = 0;
  std::atomic<int64_t> done_{0};
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


// Few rows (decode steps: M = batch ≤ 16): stream B once, rows of C stay in L1. BLAS GEMMs pack all of B per call,
// which costs more than the multiply at this size. Columns [n0, n1) of C.
constexpr int kSmallM = 16;

typedef float v16 __attribute__((vector_size(64), aligned(4)));  // 16 floats, unaligned access allowed

// R rows × (16·V) columns of C in R·V vector registers, B streamed once per row group; then plain loops over the
// column tail (< 16·V).
template <int R, int V>
void smallRows(int N, int K, const float* A, const float* B, float* C, int i0, int n0, int n1) {
  int j0 = n0;
  for (; j0 + 16 * V <= n1; j0 += 16 * V) {
    v16 c[R][V] = {};
    const float* a0 = A + (int64_t)i0 * K;
    for (int k = 0; k < K; k++) {
      const v16* b = reinterpret_cast<const v16*>(B + (int64_t)k * N + j0);
      v16 bv[V];
      for (int v = 0; v < V; v++) bv[v] = b[v];
      for (int r = 0; r < R; r++) {
        float a = a0[(int64_t)r * K + k];
        for (int v = 0; v < V; v++) c[r][v] += a * bv[v];
      }
    }
    for (int r = 0; r < R; r++) {
      v16* out = reinterpret_cast<v16*>(C + (int64_t)(i0 + r) * N + j0);
      for (int v = 0; v < V; v++) out[v] = c[r][v];
    }
  }
  if (j0 < n1) {
    int nb = n1 - j0;
    for (int r = 0; r < R; r++) {
      float acc[16 * V] = {0};
      const float* a = A + (int64_t)(i0 + r) * K;
      for (int k = 0; k < K; k++) {
        const float* b = B + (int64_t)k * N + j0;
        for (int j = 0; j < nb; j++) acc[j] += a[k] * b[j];
      }
      std::memcpy(C + (int64_t)(i0 + r) * N + j0, acc, sizeof(float) * nb);
    }
  }
}

void smallGemmNN(int M, int N, int K, const float* A, const float* B, float* C, int n0, int n1) {
  int i0 = 0;
  for (; i0 + 8 <= M; i0 += 8) smallRows<8, 2>(N, K, A, B, C, i0, n0, n1);  // batch-8 decode: B read once
  for (; i0 + 4 <= M; i0 += 4) smallRows<4, 4>(N, K, A, B, C, i0, n0, n1);
  for (; i0 < M; i0++) smallRows<1, 4>(N, K, A, B, C, i0, n0, n1);
}

// B stored [N, K] (transposeB): C[i, j] = A[i, :] · B[j, :], dot products over contiguous rows.
void smallGemmNT(int M, int N, int K, const float* A, const float* B, float* C, int n0, int n1) {
  for (int j = n0; j < n1; j++) {
    const float* b = B + (int64_t)j * K;
    for (int i = 0; i < M; i++) {
      const float* a = A + (int64_t)i * K;
      float part[16] = {0};
      int k = 0;
      for (; k + 16 <= K; k += 16)
        for (int t = 0; t < 16; t++) part[t] += a[k + t] * b[k + t];
      float sum = 0.0f;
      for (; k < K; k++) sum += a[k] * b[k];
      for (int t = 0; t < 16; t++) sum += part[t];
      C[(int64_t)i * N + j] = sum;
    }
  }
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
  bool containsBytes(int64_t offset, int64_t count, int elemBytes) const {
    return offset >= 0 && count >= 0 && (uint64_t)offset + (uint64_t)count * elemBytes <= length &&
           offset % elemBytes == 0;
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
  return undefinedValue(env);
}


// ---------------------------------------------------------------------------------------------------------------
// Element-wise, reductions, layout. Shapes arrive collapsed by the JS side to at most 4 dims.

// exp(x) for float32, branch-free so loops over it vectorise: x = n·ln2 + r, |r| ≤ ln2/2, exp(r) by a degree-6
// Taylor/minimax polynomial (max relative error ~2e-7), times 2^n built in the exponent bits.
inline float fastExp(float x) {
  float input = x;
  x = std::min(88.3762626647949f, std::max(-87.3365447504f, x));
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float y = p * scale;
  y = input > 88.72283935546875f ? INFINITY : y;  // overflow, as expf
  y = input < -87.3365447504f ? 0.0f : y;          // underflow (denormals flushed)
  return input != input ? input : y;               // NaN propagates
}

enum BinaryOp { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kMax = 4, kMin = 5, kSquaredDiff = 6, kPow = 7 };
enum CompareOp { kEqual = 0, kNotEqual = 1, kGreater = 2, kGreaterEqual = 3, kLess = 4, kLessEqual = 5 };

template <int Op>
inline float binaryValue(float a, float b) {
  if (Op == kAdd) return a + b;
  if (Op == kSub) return a - b;
  if (Op == kMul) return a * b;
  if (Op == kDiv) return a / b;
  if (Op == kMax) return a > b || std::isnan(a) ? a : b;
  if (Op == kMin) return a < b || std::isnan(a) ? a : b;
  if (Op == kSquaredDiff) return (a - b) * (a - b);
  return std::pow(a, b);
}

template <int Op>
inline uint8_t compareValue(float a, float b) {
  if (Op == kEqual) return a == b;
  if (Op == kNotEqual) return a != b;
  if (Op == kGreater) return a > b;
  if (Op == kGreaterEqual) return a >= b;
  if (Op == kLess) return a < b;
  return a <= b;
}

template <int Op>
struct BinaryFn {
  inline float operator()(float a, float b) const { return binaryValue<Op>(a, b); }
};
template <int Op>
struct CompareFn {
  inline uint8_t operator()(float a, float b) const { return compareValue<Op>(a, b); }
};

// One row of n outputs; sa/sb ∈ {0, 1} in the common cases, which get their own (vectorisable) loops.
template <typename Out, typename F>
inline void row(Out* out, const float* a, const float* b, int64_t n, int64_t sa, int64_t sb, F f) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; i++) out[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    float bv = b[0];
    for (int64_t i = 0; i < n; i++) out[i] = f(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    float av = a[0];
    for (int64_t i = 0; i < n; i++) out[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; i++) out[i] = f(a[i * sa], b[i * sb]);
  }
}

struct Shape4 {
  int64_t d[4];
  int64_t sa[4];
  int64_t sb[4];
  int64_t size() const { return d[0] * d[1] * d[2] * d[3]; }
};

// out[i0,i1,i2,i3] = f(a[Σ ik·sa_k], b[Σ ik·sb_k]), out contiguous; split over rows (i0,i1,i2).
template <typename Out, typename F>
void broadcastApply(Out* out, const float* a, const float* b, const Shape4& s, F f) {
  int64_t rows = s.d[0] * s.d[1] * s.d[2];
  int64_t n = s.d[3];
  pool.parallelFor(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, n)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      int64_t i2 = r % s.d[2];
      int64_t i1 = (r / s.d[2]) % s.d[1];
      int64_t i0 = r / (s.d[2] * s.d[1]);
      int64_t oa = i0 * s.sa[0] + i1 * s.sa[1] + i2 * s.sa[2];
      int64_t ob = i0 * s.sb[0] + i1 * s.sb[1] + i2 * s.sb[2];
      row(out + r * n, a + oa, b + ob, n, s.sa[3], s.sb[3], f);
    }
  });
}

bool readShape4(Args& args, size_t first, Shape4* s) {
  for (int k = 0; k < 4; k++) {
    s->d[k] = args.i64(first + k);
    s->sa[k] = args.i64(first + 4 + k);
    s->sb[k] = args.i64(first + 8 + k);
  }
  return args.ok;
}

// Largest element offset reached through strides, + 1.
int64_t extent(const Shape4& s, const int64_t* strides) {
  int64_t e = 0;
  for (int k = 0; k < 4; k++) {
    if (s.d[k] == 0) return 0;
    e += (s.d[k] - 1) * strides[k];
  }
  return e + 1;
}

// binary(heap, op, compare, aOff, bOff, outOff, d0..d3, sa0..sa3, sb0..sb3): float32 inputs; output float32
// (compare = false) or bool bytes (compare = true).
napi_value Binary(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int op = (int)args.i64(1);
  bool compare = args.flag(2);
  int64_t aOff = args.i64(3), bOff = args.i64(4), outOff = args.i64(5);
  Shape4 s;
  if (!readShape4(args, 6, &s)) return nullptr;
  int64_t size = s.size();
  if (!heap.contains(aOff, extent(s, s.sa)) || !heap.contains(bOff, extent(s, s.sb)) ||
      !heap.containsBytes(outOff, size, compare ? 1 : 4)) {
    args.fail("binary: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* a = heap.f32(aOff);
  const float* b = heap.f32(bOff);
  if (compare) {
    uint8_t* out = heap.base + outOff;
    switch (op) {
#define CMP(OP) \
  case OP:      \
    broadcastApply(out, a, b, s, CompareFn<OP>()); \
    break;
      CMP(kEqual) CMP(kNotEqual) CMP(kGreater) CMP(kGreaterEqual) CMP(kLess) CMP(kLessEqual)
#undef CMP
      default:
        args.fail("binary: unknown compare op");
    }
  } else {
    float* out = heap.f32(outOff);
    switch (op) {
#define BIN(OP) \
  case OP:      \
    broadcastApply(out, a, b, s, BinaryFn<OP>()); \
    break;
      BIN(kAdd) BIN(kSub) BIN(kMul) BIN(kDiv) BIN(kMax) BIN(kMin) BIN(kSquaredDiff) BIN(kPow)
#undef BIN
      default:
        args.fail("binary: unknown op");
    }
  }
  return args.ok ? undefinedValue(env) : nullptr;
}

enum UnaryOp {
  kExp = 0, kLog = 1, kSqrt = 2, kRsqrt = 3, kSquare = 4, kNeg = 5, kSigmoidU = 6, kTanh = 7, kAbs = 8, kReluU = 9,
  kReciprocal = 10, kStep = 11
};

template <int Op>
inline float unaryValue(float x, float alpha) {
  (void)alpha;
  if (Op == kExp) return fastExp(x);
  if (Op == kLog) return std::log(x);
  if (Op == kSqrt) return std::sqrt(x);
  if (Op == kRsqrt) return 1.0f / std::sqrt(x);
  if (Op == kSquare) return x * x;
  if (Op == kNeg) return -x;
  if (Op == kSigmoidU) return 1.0f / (1.0f + fastExp(-x));
  if (Op == kTanh) return std::tanh(x);
  if (Op == kAbs) return std::fabs(x);
  if (Op == kReluU) return x > 0.0f ? x : 0.0f;
  if (Op == kReciprocal) return 1.0f / x;
  return std::isnan(x) ? x : (x > 0.0f ? 1.0f : alpha);  // Step
}

template <int Op>
void unaryRun(const float* x, float* out, int64_t n, float alpha) {
  pool.parallelFor(n, 32768, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) out[i] = unaryValue<Op>(x[i], alpha);
  });
}

// unary(heap, op, xOff, outOff, n, alpha)
napi_value Unary(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int op = (int)args.i64(1);
  int64_t xOff = args.i64(2), outOff = args.i64(3), n = args.i64(4);
  float alpha = (float)args.num(5);
  if (!args.ok) return nullptr;
  if (!heap.contains(xOff, n) || !heap.contains(outOff, n)) {
    args.fail("unary: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* x = heap.f32(xOff);
  float* out = heap.f32(outOff);
  switch (op) {
#define UN(OP)                       \
  case OP:                           \
    unaryRun<OP>(x, out, n, alpha);  \
    break;
    UN(kExp) UN(kLog) UN(kSqrt) UN(kRsqrt) UN(kSquare) UN(kNeg) UN(kSigmoidU) UN(kTanh) UN(kAbs) UN(kReluU)
    UN(kReciprocal) UN(kStep)
#undef UN
    default:
      args.fail("unary: unknown op");
      return nullptr;
  }
  return undefinedValue(env);
}

enum ReduceOp { kSum = 0, kMean = 1, kMaxR = 2, kMinR = 3, kProd = 4 };

// reduce(heap, op, xOff, outOff, outer, reduce, inner): x viewed as [outer, reduce, inner], out [outer, inner].
napi_value Reduce(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int op = (int)args.i64(1);
  int64_t xOff = args.i64(2), outOff = args.i64(3);
  int64_t outer = args.i64(4), red = args.i64(5), inner = args.i64(6);
  if (!args.ok) return nullptr;
  if (!heap.contains(xOff, outer * red * inner) || !heap.contains(outOff, outer * inner) || red <= 0) {
    args.fail("reduce: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  const float* x = heap.f32(xOff);
  float* out = heap.f32(outOff);
  float init = op == kMaxR ? -INFINITY : op == kMinR ? INFINITY : op == kProd ? 1.0f : 0.0f;
  if (inner == 1) {
    pool.parallelFor(outer, std::max<int64_t>(1, 32768 / red), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; o++) {
        const float* v = x + o * red;
        float acc = init;
        if (op == kSum || op == kMean) {
          // 8 partial sums (vectorised, and closer to pairwise summation than one running sum)
          float part[16] = {0};
          int64_t i = 0;
          for (; i + 16 <= red; i += 16)
            for (int j = 0; j < 16; j++) part[j] += v[i + j];
          for (; i < red; i++) part[0] += v[i];
          for (int j = 0; j < 16; j++) acc += part[j];
          if (op == kMean) acc /= (float)red;
        } else if (op == kMaxR) {
          for (int64_t i = 0; i < red; i++) acc = v[i] > acc || std::isnan(v[i]) ? v[i] : acc;
        } else if (op == kMinR) {
          for (int64_t i = 0; i < red; i++) acc = v[i] < acc || std::isnan(v[i]) ? v[i] : acc;
        } else {
          for (int64_t i = 0; i < red; i++) acc *= v[i];
        }
        out[o] = acc;
      }
    });
  } else {
    // Reduce over a strided axis: accumulate whole inner rows (vectorised over inner), split over outer × inner blocks.
    int64_t blocks = outer * ((inner + 255) / 256);
    int64_t innerBlocks = (inner + 255) / 256;
    pool.parallelFor(blocks, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, red * 256)), [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; blk++) {
        int64_t o = blk / innerBlocks;
        int64_t j0 = (blk % innerBlocks) * 256;
        int64_t j1 = std::min(inner, j0 + 256);
        float* acc = out + o * inner;
        for (int64_t j = j0; j < j1; j++) acc[j] = init;
        for (int64_t r = 0; r < red; r++) {
          const float* v = x + (o * red + r) * inner;
          if (op == kSum || op == kMean) {
            for (int64_t j = j0; j < j1; j++) acc[j] += v[j];
          } else if (op == kMaxR) {
            for (int64_t j = j0; j < j1; j++) acc[j] = v[j] > acc[j] || std::isnan(v[j]) ? v[j] : acc[j];
          } else if (op == kMinR) {
            for (int64_t j = j0; j < j1; j++) acc[j] = v[j] < acc[j] || std::isnan(v[j]) ? v[j] : acc[j];
          } else {
            for (int64_t j = j0; j < j1; j++) acc[j] *= v[j];
          }
        }
        if (op == kMean)
          for (int64_t j = j0; j < j1; j++) acc[j] /= (float)red;
      }
    });
  }
  return undefinedValue(env);
}

// transpose(heap, xOff, outOff, elemBytes, rank, outShape (Int32Array), inStrides (Int32Array, of x's axis that
// becomes each out axis)): out contiguous. Rows of the last out axis are copied with the input's stride.
napi_value Transpose(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t xOff = args.i64(1), outOff = args.i64(2);
  int elem = (int)args.i64(3);
  int rank = (int)args.i64(4);
  size_t len1 = 0, len2 = 0;
  const int32_t* shape = reinterpret_cast<const int32_t*>(args.bytes(5, &len1));
  const int32_t* strides = reinterpret_cast<const int32_t*>(args.bytes(6, &len2));
  if (!args.ok) return nullptr;
  if (rank < 1 || rank > 8 || len1 < (size_t)rank * 4 || len2 < (size_t)rank * 4 || (elem != 4 && elem != 1)) {
    args.fail("transpose: bad shape");
    return nullptr;
  }
  int64_t size = 1, ext = 1;
  for (int k = 0; k < rank; k++) {
    size *= shape[k];
    ext += (int64_t)(shape[k] - 1) * strides[k];
  }
  if (size == 0) return undefinedValue(env);
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
    return undefinedValue(env);
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
  return undefinedValue(env);
}

enum CastKind { kIntToFloat = 0, kBoolToFloat = 1, kBoolToInt = 2, kFloatToInt = 3 };

// cast(heap, kind, xOff, outOff, n)
napi_value Cast(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int kind = (int)args.i64(1);
  int64_t xOff = args.i64(2), outOff = args.i64(3), n = args.i64(4);
  if (!args.ok) return nullptr;
  bool fromBool = kind == kBoolToFloat || kind == kBoolToInt;
  if (!heap.containsBytes(xOff, n, fromBool ? 1 : 4) || !heap.contains(outOff, n)) {
    args.fail("cast: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(n, 65536, [&](int64_t i0, int64_t i1) {
    switch (kind) {
      case kIntToFloat:
        for (int64_t i = i0; i < i1; i++) heap.f32(outOff)[i] = (float)heap.i32(xOff)[i];
        break;
      case kBoolToFloat:
        for (int64_t i = i0; i < i1; i++) heap.f32(outOff)[i] = (float)heap.base[xOff + i];
        break;
      case kBoolToInt:
        for (int64_t i = i0; i < i1; i++) heap.i32(outOff)[i] = (int32_t)heap.base[xOff + i];
        break;
      default:
        for (int64_t i = i0; i < i1; i++) heap.i32(outOff)[i] = (int32_t)heap.f32(xOff)[i];
        break;
    }
  });
  return undefinedValue(env);
}

// softmax(heap, xOff, outOff, rows, n, log): softmax (or log-softmax) over the last axis.
napi_value Softmax(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t xOff = args.i64(1), outOff = args.i64(2), rows = args.i64(3), n = args.i64(4);
  bool log = args.flag(5);
  if (!args.ok) return nullptr;
  if (!heap.contains(xOff, rows * n) || !heap.contains(outOff, rows * n) || n <= 0) {
    args.fail("softmax: tensor range outside the heap");
    return nullptr;
  }
  calls++;
  pool.parallelFor(rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float* x = heap.f32(xOff) + r * n;
      float* y = heap.f32(outOff) + r * n;
      // 16 partial maxima / sums: float reductions only vectorise when split by hand (no -ffast-math here).
      float part[16];
      for (int t = 0; t < 16; t++) part[t] = -INFINITY;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16)
        for (int t = 0; t < 16; t++) part[t] = std::max(part[t], x[i + t]);
      float m = -INFINITY;
      for (; i < n; i++) m = std::max(m, x[i]);
      for (int t = 0; t < 16; t++) m = std::max(m, part[t]);
      for (i = 0; i < n; i++) y[i] = fastExp(x[i] - m);
      for (int t = 0; t < 16; t++) part[t] = 0.0f;
      for (i = 0; i + 16 <= n; i += 16)
        for (int t = 0; t < 16; t++) part[t] += y[i + t];
      float sum = 0.0f;
      for (; i < n; i++) sum += y[i];
      for (int t = 0; t < 16; t++) sum += part[t];
      if (log) {
        float lse = m + std::log(sum);
        for (i = 0; i < n; i++) y[i] = x[i] - lse;
      } else {
        float inv = 1.0f / sum;
        for (i = 0; i < n; i++) y[i] *= inv;
      }
    }
  });
  return undefinedValue(env);
}

// gather(heap, xOff, indicesOff, outOff, outer, axisDim, count, inner, elemBytes) → false when an index is out of
// [0, axisDim) (nothing is written then; the caller raises tfjs' error). x [outer, axisDim, inner] → out [outer, count, inner].
napi_value Gather(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t xOff = args.i64(1), idxOff = args.i64(2), outOff = args.i64(3);
  int64_t outer = args.i64(4), axisDim = args.i64(5), count = args.i64(6), inner = args.i64(7);
  int elem = (int)args.i64(8);
  if (!args.ok) return nullptr;
  if ((elem != 4 && elem != 1) || !heap.containsBytes(xOff, outer * axisDim * inner, elem) ||
      !heap.contains(idxOff, count) || !heap.containsBytes(outOff, outer * count * inner, elem)) {
    args.fail("gather: tensor range outside the heap");
    return nullptr;
  }
  const int32_t* idx = heap.i32(idxOff);
  bool valid = true;
  for (int64_t i = 0; i < count; i++) valid = valid && idx[i] >= 0 && idx[i] < axisDim;
  napi_value result;
  napi_get_boolean(env, valid, &result);
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

// segmentSum(heap, xOff, idsOff, outOff, count, inner, numSegments): out[s, :] = Σ_{i: ids[i] = s} x[i, :]; ids outside
// [0, numSegments) are dropped. Threads split the columns, so no two write the same element.
napi_value SegmentSum(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t xOff = args.i64(1), idsOff = args.i64(2), outOff = args.i64(3);
  int64_t count = args.i64(4), inner = args.i64(5), segments = args.i64(6);
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

// adam(heap, value, grad, m, v, outValue, outM, outV, n, lr, beta1, beta2, eps, oneMinusAccBeta1, oneMinusAccBeta2):
// one pass of tfjs' AdamOptimizer update, same operation order (m' = m·β1 + g·(1−β1), v' = v·β2 + g²·(1−β2),
// value' = (m'/(1−β1ᵗ)) / (√(v'/(1−β2ᵗ)) + ε) · (−lr) + value).
napi_value Adam(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t off[7];
  for (int i = 0; i < 7; i++) off[i] = args.i64(1 + i);
  int64_t n = args.i64(8);
  float lr = (float)args.num(9), b1 = (float)args.num(10), b2 = (float)args.num(11), eps = (float)args.num(12);
  float c1 = (float)args.num(13), c2 = (float)args.num(14);
  float ob1 = (float)(1.0 - args.num(10)), ob2 = (float)(1.0 - args.num(11));
  if (!args.ok) return nullptr;
  for (int i = 0; i < 7; i++) {
    if (!heap.contains(off[i], n)) {
      args.fail("adam: tensor range outside the heap");
      return nullptr;
    }
  }
  calls++;
  const float *value = heap.f32(off[0]), *grad = heap.f32(off[1]), *m = heap.f32(off[2]), *v = heap.f32(off[3]);
  float *outValue = heap.f32(off[4]), *outM = heap.f32(off[5]), *outV = heap.f32(off[6]);
  float negLr = -lr;
  pool.parallelFor(n, 32768, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
      float g = grad[i];
      float mi = m[i] * b1 + g * ob1;
      float vi = v[i] * b2 + (g * g) * ob2;
      outM[i] = mi;
      outV[i] = vi;
      outValue[i] = ((mi / c1) / (std::sqrt(vi / c2) + eps)) * negLr + value[i];
    }
  });
  return undefinedValue(env);
}

// copyBlocks(heap, src, dst, outer, srcStride, dstStride, chunk) — all in bytes: dst[o·dstStride + :chunk] =
// src[o·srcStride + :chunk] for o < outer. Concat and SplitV are one call per input/output.
napi_value CopyBlocks(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t src = args.i64(1), dst = args.i64(2), outer = args.i64(3), srcStride = args.i64(4), dstStride = args.i64(5),
          chunk = args.i64(6);
  if (!args.ok) return nullptr;
  if (outer <= 0 || chunk <= 0) return undefinedValue(env);
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
  return undefinedValue(env);
}

// ---------------------------------------------------------------------------------------------------------------
// Fused transformer kernels (src/model/Fused.ts): RMSNorm, SwiGLU, RoPE, attention (forward and gradients), the
// inference-only q|k|v preparation (qk-norm + RoPE + KV-cache append) and linear (row RMSNorm + matmul + residual).
// Each runs as one kernel where tfjs' composition runs 5–20, which is most of a decode step's cost at small sizes.

// C = alpha · op(A) · op(B) + beta · C on the calling thread, any leading dimensions.
void gemmS(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef EFFECT_RL_OPENBLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
#else
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

inline float sumOf(const float* x, int64_t n) {
  float part[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int t = 0; t < 16; t++) part[t] += x[i + t];
  float s = 0.0f;
  for (; i < n; i++) s += x[i];
  for (int t = 0; t < 16; t++) s += part[t];
  return s;
}

inline float dotOf(const float* x, const float* y, int64_t n) {
  float part[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int t = 0; t < 16; t++) part[t] += x[i + t] * y[i + t];
  float s = 0.0f;
  for (; i < n; i++) s += x[i] * y[i];
  for (int t = 0; t < 16; t++) s += part[t];
  return s;
}

// 1/√(mean(x²) + ε), as tfjs' rsqrt(mean(square(x)) + ε) computes it in float32.
inline float rstdOf(const float* x, int64_t n, float eps) {
  float mean = dotOf(x, x, n) / (float)n;
  return 1.0f / std::sqrt(mean + eps);
}

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

// RoPE of one head vector (HF rotate_half): y = x·cos + rotate_half(x)·sin; backward: the transpose, dx = dy·cos +
// rotate_halfᵀ(dy·sin).
inline void ropeVec(const float* x, const float* c, const float* s, float* y, int hd, bool backward) {
  int h = hd / 2;
  if (!backward) {
    for (int j = 0; j < h; j++) y[j] = x[j] * c[j] + (-x[j + h]) * s[j];
    for (int j = h; j < hd; j++) y[j] = x[j] * c[j] + x[j - h] * s[j];
  } else {
    for (int j = 0; j < h; j++) y[j] = x[j] * c[j] + x[j + h] * s[j + h];
    for (int j = h; j < hd; j++) y[j] = x[j] * c[j] - x[j - h] * s[j - h];
  }
}

// rmsNorm(heap, x, w, out, rows, n, wRows, eps): out[r] = x[r] · rstd(x[r]) (· w[r mod wRows] when w ≥ 0).
napi_value RmsNorm(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t xOff = args.i64(1), wOff = args.i64(2), outOff = args.i64(3), rows = args.i64(4), n = args.i64(5);
  int64_t wRows = args.i64(6);
  float eps = (float)args.num(7);
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

// rmsNormGrad(heap, x, w, dy, dx, dw, rows, n, wRows, eps): dx = r·(g − x̂·mean(g·x̂)) with g = dy·w, x̂ = x·r;
// dw[k] = Σ_{r ≡ k mod wRows} dy[r]·x̂[r] (dw < 0: not wanted).
napi_value RmsNormGrad(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t xOff = args.i64(1), wOff = args.i64(2), dyOff = args.i64(3), dxOff = args.i64(4), dwOff = args.i64(5);
  int64_t rows = args.i64(6), n = args.i64(7), wRows = args.i64(8);
  float eps = (float)args.num(9);
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

inline float sigmoidOf(float g) { return 1.0f / (1.0f + fastExp(-g)); }

// swiglu(heap, gate, up, out, rows, n, gateStride, upStride): out[r, i] = silu(gate[r, i]) · up[r, i], rows of the
// inputs `gateStride`/`upStride` floats apart (a joined gate|up tensor is two strided views), out contiguous.
napi_value SwiGlu(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t gOff = args.i64(1), uOff = args.i64(2), outOff = args.i64(3), rows = args.i64(4), n = args.i64(5);
  int64_t gs = args.i64(6), us = args.i64(7);
  if (!args.ok) return nullptr;
  if (rows <= 0 || n <= 0) return undefinedValue(env);
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
  return undefinedValue(env);
}

// swigluGrad(heap, gate, up, dy, dgate, dup, rows, n): s = σ(g); dgate = dy·u·s·(1 + g·(1 − s)); dup = dy·g·s.
napi_value SwiGluGrad(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t gOff = args.i64(1), uOff = args.i64(2), dyOff = args.i64(3), dgOff = args.i64(4), duOff = args.i64(5);
  int64_t rows = args.i64(6), n = args.i64(7);
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

// rope(heap, x, cos, sin, out, N, heads, hd, backward): x, out [N, heads, hd]; cos, sin [N, hd].
napi_value Rope(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t xOff = args.i64(1), cOff = args.i64(2), sOff = args.i64(3), outOff = args.i64(4);
  int64_t N = args.i64(5), heads = args.i64(6), hd = args.i64(7);
  bool backward = args.flag(8);
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

// qkvPrep(heap, qkv, cos, sin, norm, eps, pastK, pastV, q, keys, values, B, T, P, H, Hkv, hd, pastCap, outCap):
// inference. qkv [B·T, (H + 2Hkv)·hd] → q [B·T, H, hd] and the new tokens' k: each head RMS-normed by norm
// [H + Hkv, hd] (norm ≥ 0) then rotated (cos, sin [B·T, hd]). keys/values [B, outCap, Hkv, hd] hold the P past slots
// (pastK/pastV [B, pastCap, Hkv, hd]), then the new ones. keys == pastK: appended in place (capacity to spare), no copy.
napi_value QkvPrep(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t qkvOff = args.i64(1), cOff = args.i64(2), sOff = args.i64(3), nOff = args.i64(4);
  float eps = (float)args.num(5);
  int64_t pkOff = args.i64(6), pvOff = args.i64(7), qOff = args.i64(8), kOff = args.i64(9), vOff = args.i64(10);
  int64_t B = args.i64(11), T = args.i64(12), P = args.i64(13), H = args.i64(14), Hkv = args.i64(15), hd = args.i64(16);
  int64_t pastCap = args.i64(17), L = args.i64(18);  // L: the outputs' slots per row (capacity ≥ P + T)
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

// attention(heap, q, k, v, bias, out, probs, B, T, L, H, Hkv, hd, scale, kvCap): q, out [B, T, H, hd]; k, v
// [B, kvCap, Hkv, hd] of which the first L slots count; bias [B, T, L] additive (< 0: none); probs [B, H, T, L]
// (< 0: not kept). Query head h reads KV head h / (H / Hkv).
napi_value Attention(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t qOff = args.i64(1), kOff = args.i64(2), vOff = args.i64(3), bOff = args.i64(4), oOff = args.i64(5);
  int64_t pOff = args.i64(6), B = args.i64(7), T = args.i64(8), L = args.i64(9), H = args.i64(10), Hkv = args.i64(11);
  int64_t hd = args.i64(12);
  float scale = (float)args.num(13);
  int64_t cap = args.i64(14);
  if (!args.ok) return nullptr;
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
    return undefinedValue(env);
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
  return undefinedValue(env);
}

// attentionGrad(heap, q, k, v, probs, dOut, dq, dk, dv, B, T, L, H, Hkv, hd, scale): the gradients of attention
// (bias is constant). One task per (batch, KV head): it owns its dk/dv rows, summing over the heads that share them.
napi_value AttentionGrad(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t qOff = args.i64(1), kOff = args.i64(2), vOff = args.i64(3), pOff = args.i64(4), doOff = args.i64(5);
  int64_t dqOff = args.i64(6), dkOff = args.i64(7), dvOff = args.i64(8);
  int64_t B = args.i64(9), T = args.i64(10), L = args.i64(11), H = args.i64(12), Hkv = args.i64(13), hd = args.i64(14);
  float scale = (float)args.num(15);
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

// linear(heap, a, b, out, M, N, K, residual, normEps): out = diag(r) · (a @ b) + residual, r_i = rstd(a_i) when
// normEps ≥ 0 (an RMSNorm whose weight is folded into b's rows), else 1; residual < 0: none.
napi_value Linear(napi_env env, napi_callback_info info) {
  Args args(env, info);
  Heap heap;
  if (!heapArg(args, 0, &heap)) return nullptr;
  int64_t aOff = args.i64(1), bOff = args.i64(2), oOff = args.i64(3);
  int M = (int)args.i64(4), N = (int)args.i64(5), K = (int)args.i64(6);
  int64_t rOff = args.i64(7);
  double normEps = args.num(8);
  if (!args.ok) return nullptr;
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
  return undefinedValue(env);
}

napi_value SetThreads(napi_env env, napi_callback_info info) {
  Args args(env, info);
  int threads = (int)args.i64(0);
  if (!args.ok) return nullptr;
  if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
  pool.resize(threads);
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
  const Fn fns[] = {{"matmul", Matmul},   {"binary", Binary},         {"unary", Unary},
                     {"reduce", Reduce},   {"transpose", Transpose},   {"cast", Cast},
                     {"softmax", Softmax}, {"gather", Gather},         {"segmentSum", SegmentSum}, {"adam", Adam}, {"copyBlocks", CopyBlocks},
                     {"rmsNorm", RmsNorm}, {"rmsNormGrad", RmsNormGrad}, {"swiglu", SwiGlu}, {"swigluGrad", SwiGluGrad},
                     {"rope", Rope}, {"qkvPrep", QkvPrep}, {"attention", Attention}, {"attentionGrad", AttentionGrad},
                     {"linear", Linear}, {"setThreads", SetThreads}, {"info", Info}};
  for (const Fn& fn : fns) {
    napi_value f;
    napi_create_function(env, fn.name, NAPI_AUTO_LENGTH, fn.cb, nullptr, &f);
    napi_set_named_property(env, exports, fn.name, f);
  }
#ifdef EFFECT_RL_OPENBLAS
  openblas_set_num_threads(1);
#endif
  pool.resize((int)std::max(1u, std::thread::hardware_concurrency()));
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
