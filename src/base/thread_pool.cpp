#include "base/thread_pool.h"

#include "base/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define METRO_CPU_RELAX() _mm_pause()
#else
#define METRO_CPU_RELAX() \
  do {                    \
  } while (0)
#endif

namespace metro {

namespace {
// Spin-wait helper: pause first (the common case is a wait of microseconds), then yield the
// core so an oversubscribed machine (more runnable threads than cores) still makes progress
// instead of burning whole time slices in a barrier.
template <class Pred>
void spin_until(Pred done) {
  for (uint32_t i = 0; !done(); ++i) {
    if (i < 4096) {
      METRO_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_raw(RawFn fn, void* ctx) {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);  // publishes fn_/ctx_
  generation_.notify_all();
  fn(ctx, 0, n_threads_);
  spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; });
}

void ThreadPool::worker_main(int ith) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    uint32_t spins = spin_iters_.load(std::memory_order_relaxed);
    for (uint32_t i = 0; gen == seen && i < spins; ++i) {
      METRO_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    while (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    fn_(ctx_, ith, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::barrier() {
  if (n_threads_ == 1) return;
  const uint64_t phase = barrier_phase_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_phase_.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  spin_until([&] { return barrier_phase_.load(std::memory_order_acquire) != phase; });
}

}  // namespace metro
