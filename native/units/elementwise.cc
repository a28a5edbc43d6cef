// The addon builds as two translation units, balanced for a 2-core machine: elementwise.cc alone takes ~6 s at -O3 (its
// op table instantiates every kernel per op), the other sources together (units/core.cc) about as long. Twelve
// per-file units parsed the same headers twelve times: 21 s of compiler time, ~11 s of `npm ci` on two cores;
// two units take ~7 s. A new source goes into whichever unit keeps the two about even.
#include "../elementwise.cc"
#include "../head.cc"
#include "../bf16.cc"
