// N-API plumbing: reading one call's arguments (what abi.generated.h's unpack() functions use) and the heap view with
// bounds checks that every kernel applies to the tensor ranges it touches.
#pragma once

#include <node_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace effect_rl {

// Base pointer and element count of an Int32Array argument (data == nullptr: null was passed).
struct Int32s {
  const int32_t* data = nullptr;
  size_t count = 0;
};

// The wasm heap, with bounds checks: every tensor range a kernel touches must lie inside it.
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

// One call's arguments. A failed read throws one JS error (EFFECT_RL_NATIVE) and clears `ok`; the kernel then returns
// nullptr without running.
struct Args {
  napi_env env;
  size_t argc = 24;
  napi_value argv[24];
  bool ok = true;

  Args(napi_env e, napi_callback_info info) : env(e) { napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr); }

  bool expectCount(size_t n, const char* function) {
    if (argc != n) {
      fail((std::string(function) + ": expected " + std::to_string(n) + " arguments, got " + std::to_string(argc))
               .c_str());
    }
    return ok;
  }
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
  // The wasm heap view (a Uint8Array over the wasm memory).
  Heap heap(size_t i) {
    Heap h;
    void* data = nullptr;
    if (!typedArray(i, napi_uint8_array, &data, &h.length)) fail("expected a Uint8Array argument (the heap)");
    h.base = static_cast<uint8_t*>(data);
    return h;
  }
  Int32s int32s(size_t i) {
    Int32s a;
    void* data = nullptr;
    if (!typedArray(i, napi_int32_array, &data, &a.count)) fail("expected an Int32Array argument");
    a.data = static_cast<const int32_t*>(data);
    return a;
  }
  void fail(const char* message) {
    if (ok) napi_throw_error(env, "EFFECT_RL_NATIVE", message);
    ok = false;
  }

 private:
  bool typedArray(size_t i, napi_typedarray_type want, void** data, size_t* count) {
    napi_typedarray_type type;
    napi_value buffer;
    size_t offset = 0;
    *count = 0;
    if (i >= argc || napi_get_typedarray_info(env, argv[i], &type, count, data, &buffer, &offset) != napi_ok ||
        type != want) {
      *count = 0;
      *data = nullptr;
      return false;
    }
    return true;
  }
};

inline napi_value undefinedValue(napi_env env) {
  napi_value v;
  napi_get_undefined(env, &v);
  return v;
}

}  // namespace effect_rl
