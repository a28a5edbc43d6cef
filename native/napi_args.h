// N-API plumbing: reading one call's arguments (what abi.generated.h's unpack() functions use) and the heap view with
// bounds checks that every kernel applies to the tensor ranges it touches.
#pragma once

#include <node_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace effect_rl {

// First byte and byte length of a typed array or DataView argument.
struct View {
  uint8_t* data = nullptr;
  size_t bytes = 0;
};

// Base pointer and element count of an Int32Array argument (data == nullptr: null was passed).
struct Int32s {
  const int32_t* data = nullptr;
  size_t count = 0;
};

// The wasm heap, with bounds checks: every tensor range a kernel touches must lie inside it. A null heap argument
// (the native backend, whose tensors each have their own buffer in JS memory) makes offsets absolute addresses: base
// 0, no upper bound; the checks then only reject negative and misaligned addresses.
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
  float* f32(int64_t offset) const { return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(base) + offset); }
  int32_t* i32(int64_t offset) const {
    return reinterpret_cast<int32_t*>(reinterpret_cast<uintptr_t>(base) + offset);
  }
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
  // The wasm heap view (a Uint8Array over the wasm memory), or null: absolute addresses.
  Heap heap(size_t i) {
    Heap h;
    if (isNullish(i)) {
      h.length = (size_t)INT64_MAX;
      return h;
    }
    void* data = nullptr;
    if (!typedArray(i, napi_uint8_array, &data, &h.length)) fail("expected a Uint8Array argument (the heap)");
    h.base = static_cast<uint8_t*>(data);
    return h;
  }
  View view(size_t i) {
    View v;
    bool isTyped = false, isView = false;
    if (i < argc) napi_is_typedarray(env, argv[i], &isTyped);
    if (i < argc && !isTyped) napi_is_dataview(env, argv[i], &isView);
    if (isTyped) {
      napi_typedarray_type type;
      size_t length = 0, offset = 0;
      napi_value buffer;
      void* data = nullptr;
      napi_get_typedarray_info(env, argv[i], &type, &length, &data, &buffer, &offset);
      v.data = static_cast<uint8_t*>(data);
      v.bytes = length * elementBytes(type);
    } else if (isView) {
      napi_value buffer;
      size_t offset = 0;
      void* data = nullptr;
      napi_get_dataview_info(env, argv[i], &v.bytes, &data, &buffer, &offset);
      v.data = static_cast<uint8_t*>(data);
    } else {
      fail("expected a typed array or DataView argument");
    }
    return v;
  }
  std::string string(size_t i) {
    size_t length = 0;
    if (i >= argc || napi_get_value_string_utf8(env, argv[i], nullptr, 0, &length) != napi_ok) {
      fail("expected a string argument");
      return std::string();
    }
    std::string s(length, '\0');
    napi_get_value_string_utf8(env, argv[i], s.data(), length + 1, &length);
    return s;
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
  static size_t elementBytes(napi_typedarray_type type) {
    switch (type) {
      case napi_int8_array:
      case napi_uint8_array:
      case napi_uint8_clamped_array:
        return 1;
      case napi_int16_array:
      case napi_uint16_array:
        return 2;
      case napi_float64_array:
      case napi_bigint64_array:
      case napi_biguint64_array:
        return 8;
      default:
        return 4;
    }
  }
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
