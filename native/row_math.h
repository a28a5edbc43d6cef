// Per-row float32 maths that several kernels share: a branch-free exp, sums and dot products split by hand so they
// vectorise (no -ffast-math here), the RMS of a row, and RoPE of one head vector.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace effect_rl {

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

inline float sigmoidOf(float g) { return 1.0f / (1.0f + fastExp(-g)); }

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

}  // namespace effect_rl
