// Internal to backends/cuda: captured launch sequences (CUDA graphs) of recurring steps.
//
// A step's kernels read everything that varies between steps of one shape (token ids,
// positions, sequence runs, block tables, logits rows, RoPE frequencies) from the state's
// index buffer, at offsets fixed by the shape; what a launch bakes in (grid sizes, weight,
// activation and KV addresses, widths, layer numbers) is fixed by the op sequence and the
// step's token, logits-row and run counts. The executor writes all of that into a key; a
// key seen twice is captured into a graph, and every later step with that key launches the
// graph (one launch instead of hundreds). Everything baked into a graph is in its key, so a
// key match means the graph is exactly what launching the step would enqueue.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace metro::backends::cuda {

class GraphCache {
 public:
  // Most keys remembered per state (captured or not): a model's steps recur in a few
  // shapes (decode at each batch size in use); the least recently used is dropped.
  static constexpr size_t kMaxEntries = 32;
  // Sightings of a key before it is captured: a shape seen once is launched plainly.
  static constexpr int kCaptureAfter = 2;

  struct Entry {
    std::vector<uint64_t> key;
    uint64_t hash = 0;
    cudaGraphExec_t exec = nullptr;
    int seen = 0;
    bool failed = false;  // capture or instantiation failed: this key launches plainly
    uint64_t last_use = 0;
  };

  GraphCache() = default;
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The key being built for this step (cleared; its capacity is reused across steps).
  std::vector<uint64_t>& start_key() {
    key_.clear();
    return key_;
  }
  // The entry of the key built since start_key(), made (dropping the least recently used
  // entry and its graph when full) if new, with this sighting counted. The reference is
  // valid until the next lookup.
  Entry& lookup();

  // Counts for diagnostics and tests.
  int captured() const { return captured_; }
  int launched() const { return launched_; }
  void count_capture() { ++captured_; }
  void count_launch() { ++launched_; }
  // Whether a capture failure was already reported (one message per state).
  bool reported_failure = false;

 private:
  std::vector<Entry> entries_;
  std::vector<uint64_t> key_;
  uint64_t clock_ = 0;
  int captured_ = 0;
  int launched_ = 0;
};

}  // namespace metro::backends::cuda
