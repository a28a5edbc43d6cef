// Adam: tfjs' AdamOptimizer update of one variable in a single pass (src/native/Adam.ts), where tfjs runs ~12
// element-wise kernels.
#include <cmath>

#include "abi.generated.h"
#include "pool.h"

namespace effect_rl {

napi_value Adam(Args& args, const AdamArgs& in) {
  const Heap& heap = in.heap;
  const int64_t off[7] = {in.value, in.grad, in.m, in.v, in.newValue, in.newM, in.newV};
  int64_t n = in.n;
  float lr = in.learningRate, b1 = (float)in.beta1, b2 = (float)in.beta2, eps = in.epsilon;
  float c1 = in.c1, c2 = in.c2;
  float ob1 = (float)(1.0 - in.beta1), ob2 = (float)(1.0 - in.beta2);
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
  return undefinedValue(args.env);
}

}  // namespace effect_rl
