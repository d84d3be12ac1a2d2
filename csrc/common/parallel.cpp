#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ja/api.h"

namespace ja {

static int thread_budget() {
  // JA_NUM_THREADS caps the CPU kernels' threads (e.g. under pytest-xdist).
  if (const char* env = std::getenv("JA_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(thread_budget(), (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  std::vector<std::thread> workers;
  workers.reserve(size_t(chunks - 1));
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = c * step, e = std::min(n, b + step);
    if (b < e) workers.emplace_back(fn, b, e);
  }
  fn(0, std::min(n, step));
  for (auto& t : workers) t.join();
}

}  // namespace ja
