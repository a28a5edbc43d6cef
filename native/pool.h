// The thread pool every kernel splits its work over, and the scratch memory kernels allocate per call (counted, so
// tests can see that native memory does not grow).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace effect_rl {

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

extern Pool pool;
extern std::atomic<int64_t> scratchBytes;  // bytes of native scratch currently allocated (leak check)
extern std::atomic<int64_t> calls;         // kernel calls so far

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

}  // namespace effect_rl
