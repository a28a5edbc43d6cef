#include "pool.h"

namespace effect_rl {

Pool pool;
std::atomic<int64_t> scratchBytes{0};
std::atomic<int64_t> calls{0};

}  // namespace effect_rl
