// The in-process group: ranks meet at a generation barrier and exchange buffer pointers
// through shared slots.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "base/check.h"
#include "dist/communicator.h"

namespace metro::dist {

namespace {

// The state the ranks of one group share.
class LocalGroupState {
 public:
  explicit LocalGroupState(int n) : n_(n), slots_(static_cast<size_t>(n)) {}

  int size() const { return n_; }

  // Blocks until all n ranks have arrived; reusable.
  void barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

  void all_reduce_sum(int rank, std::span<float> data) {
    slots_[static_cast<size_t>(rank)] = data;
    barrier();  // every buffer is published
    const size_t n = data.size();
    for (int r = 0; r < n_; ++r) {
      METRO_CHECK_MSG(slots_[static_cast<size_t>(r)].size() == n,
                      "all_reduce_sum: ranks passed buffers of different sizes");
    }
    // This rank's slice of the elements: nobody else reads or writes it in this call.
    const size_t begin = n * static_cast<size_t>(rank) / static_cast<size_t>(n_);
    const size_t end = n * static_cast<size_t>(rank + 1) / static_cast<size_t>(n_);
    for (size_t i = begin; i < end; ++i) {
      float sum = slots_[0][i];
      for (int r = 1; r < n_; ++r) sum += slots_[static_cast<size_t>(r)][i];
      for (int r = 0; r < n_; ++r) slots_[static_cast<size_t>(r)][i] = sum;
    }
    barrier();  // every slice is summed; the slots may be republished
  }

 private:
  const int n_;
  std::vector<std::span<float>> slots_;  // each rank writes its own before the first barrier
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroupState> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void all_reduce_sum(std::span<float> data) override { group_->all_reduce_sum(rank_, data); }
  void barrier() override { group_->barrier(); }

 private:
  std::shared_ptr<LocalGroupState> group_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_local_group(int n_ranks) {
  METRO_CHECK_MSG(n_ranks >= 1, "a group needs at least one rank");
  auto state = std::make_shared<LocalGroupState>(n_ranks);
  std::vector<std::shared_ptr<Communicator>> ranks;
  for (int r = 0; r < n_ranks; ++r) ranks.push_back(std::make_shared<LocalCommunicator>(state, r));
  return ranks;
}

}  // namespace metro::dist
