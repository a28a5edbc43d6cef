// The addon's module: registers every function of the ABI table (abi.generated.h's kExports) and sizes the thread
// pool; the pool and build queries themselves (setThreads, info).
//
// Every kernel works in place on the wasm heap: JS passes the heap (a Uint8Array over the wasm memory, fetched per
// call because heap growth detaches the old buffer) and byte offsets of the tensors tfjs already allocated there, so
// nothing is copied. Written against the plain N-API C interface (node_api.h, ABI-stable): one build against the
// Node 20 headers loads in any later Node. Matmuls go to OpenBLAS when it linked at build time (EFFECT_RL_OPENBLAS),
// else to our own blocked SGEMM (gemm.cc); work is split over a small thread pool (pool.h) sized by setThreads.
#include <algorithm>
#include <thread>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "abi.generated.h"
#include "gemm.h"
#include "pool.h"

namespace effect_rl {

napi_value SetThreads(Args& args, const SetThreadsArgs& in) {
  int threads = in.threads;
  if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
  pool.resize(threads);
  return undefinedValue(args.env);
}

napi_value MallocTrim(Args& args, const MallocTrimArgs&) {
#ifdef __GLIBC__
  const bool released = malloc_trim(0) == 1;
#else
  const bool released = false;
#endif
  napi_value out;
  napi_get_boolean(args.env, released, &out);
  return out;
}

napi_value Info(Args& args, const InfoArgs&) {
  napi_env env = args.env;
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
  const char* simd = "avx512";
#elif defined(__AVX2__)
  const char* simd = "avx2";
#elif defined(__AVX__)
  const char* simd = "avx";
#elif defined(__aarch64__)
  const char* simd = "neon";
#else
  const char* simd = "baseline";
#endif
  napi_create_string_utf8(env, simd, NAPI_AUTO_LENGTH, &v);
  napi_set_named_property(env, out, "simd", v);
  napi_create_string_utf8(env, kAbiHash, NAPI_AUTO_LENGTH, &v);
  napi_set_named_property(env, out, "abi", v);
  return out;
}

}  // namespace effect_rl

static napi_value Init(napi_env env, napi_value exports) {
  for (const effect_rl::Export& fn : effect_rl::kExports) {
    napi_value f;
    napi_create_function(env, fn.name, NAPI_AUTO_LENGTH, fn.callback, nullptr, &f);
    napi_set_named_property(env, exports, fn.name, f);
  }
#ifdef EFFECT_RL_OPENBLAS
  openblas_set_num_threads(1);
#endif
  effect_rl::pool.resize((int)std::max(1u, std::thread::hardware_concurrency()));
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
