// One of the addon's two translation units (see units/elementwise.cc for why there are two). The sources stay separate
// files; a unity unit compiles them together so the standard headers they share (<thread>, <functional>, <mutex>, …,
// about 0.7 s of each file's 1-2 s at -O3) are parsed once per unit instead of once per file.
#include "../module.cc"
#include "../pool.cc"
#include "../gemm.cc"
#include "../matmul.cc"
#include "../layout.cc"
#include "../adam.cc"
#include "../io.cc"
#include "../fused.cc"
#include "../attention.cc"
