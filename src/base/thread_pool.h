// A persistent compute thread pool with a low-latency fork/join and an in-task barrier.
//
// The caller of run() is thread 0 and does its share of the work, so a pool of N threads
// starts N-1 workers. Several threads may share one pool (the engines of one process):
// their run() calls take turns, each running on every thread of the pool, so the engines
// together never use more compute threads than the pool has. Workers spin briefly on a
// generation counter after each task (a model step issues hundreds of short parallel
// regions back to back), then sleep on a futex.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace metro {

class ThreadPool {
 public:
  // n_threads >= 1, counting the caller.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, n_threads) on every thread of the pool, the caller being index 0,
  // and returns when all calls have returned. Calls from several threads run one after the
  // other. Not reentrant: fn must not call run().
  template <class F>
  void run(F&& fn) {
    auto tramp = [](void* ctx, int ith, int nth) { (*static_cast<F*>(ctx))(ith, nth); };
    run_raw(tramp, &fn);
  }

  // Splits [0, n) into near-equal contiguous ranges, one per thread: fn(begin, end, ith).
  template <class F>
  void parallel_for(size_t n, F&& fn) {
    run([&](int ith, int nth) {
      size_t begin = n * static_cast<size_t>(ith) / static_cast<size_t>(nth);
      size_t end = n * static_cast<size_t>(ith + 1) / static_cast<size_t>(nth);
      if (begin < end) fn(begin, end, ith);
    });
  }

  // Inside a run(): blocks until every thread of the pool has reached the barrier.
  void barrier();

  // How long idle workers spin before sleeping (pause iterations). 0 sleeps at once.
  void set_spin_iterations(uint32_t n) { spin_iters_.store(n, std::memory_order_relaxed); }

 private:
  using RawFn = void (*)(void*, int, int);
  void run_raw(RawFn fn, void* ctx);
  void worker_main(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;

  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int> barrier_count_{0};
  alignas(64) std::atomic<uint64_t> barrier_phase_{0};
  std::atomic<uint32_t> spin_iters_{200000};
  std::atomic<bool> stop_{false};
  std::mutex run_mu_;  // one run() at a time
  RawFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace metro
