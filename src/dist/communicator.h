// Communicators: how the ranks of a tensor-parallel group exchange partial results. This
// layer knows nothing of models; the model's shards call it at the points where each rank
// holds a partial sum of a product (after the attention output and FFN down projections).
#pragma once

#include <memory>
#include <span>
#include <vector>

namespace metro::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // in [0, size())
  virtual int size() const = 0;

  // Collective: every rank of the group calls it with the same number of elements. On
  // return each rank's `data` holds the element-wise sum over the ranks' inputs, the same
  // bits on every rank.
  virtual void all_reduce_sum(std::span<float> data) = 0;

  // Collective: returns once every rank of the group has called it.
  virtual void barrier() = 0;
};

// The group of one: all_reduce_sum leaves the data as it is.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(std::span<float>) override {}
  void barrier() override {}
};

// A group of n ranks inside one process, each rank driven by its own thread (tests, and a
// single machine's tensor parallelism without MPI). Element i of a sum is added in rank
// order (rank 0's value + rank 1's + ...), so the result does not depend on timing and is
// identical on every rank. The ranks share memory: a call publishes each rank's buffer,
// each rank sums its own slice of the elements straight into every buffer, and a barrier
// ends the call. Returns one communicator per rank, index = rank; they share the group's
// state, which lives as long as any of them.
std::vector<std::shared_ptr<Communicator>> make_local_group(int n_ranks);

}  // namespace metro::dist
