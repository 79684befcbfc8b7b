// Internal to backends/cpu: the CPU backend's resource and state types.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "base/aligned.h"
#include "base/cold_store.h"
#include "kernels/attention.h"
#include "kernels/kernel_set.h"
#include "kernels/matmul.h"

namespace metro::backends::cpu {

class CpuMatrix final : public DeviceMatrix {
 public:
  CpuMatrix(kernels::Weight w, AlignedBuffer<uint8_t> gathered)
      : DeviceMatrix(w.type, w.n_rows, w.n_cols), weight(std::move(w)), gathered_(std::move(gathered)) {}
  // A matrix whose bytes (weight's spans) lie in entry `id` of a cold store.
  CpuMatrix(kernels::Weight w, std::shared_ptr<ColdStore> store, int id)
      : DeviceMatrix(w.type, w.n_rows, w.n_cols), weight(std::move(w)), cold_store(std::move(store)), cold_id(id) {}
  std::string describe() const override { return weight.describe() + (cold_store ? ", cold" : ""); }
  // A strided slice reads its gathered rows; the weight's spans then lie inside them.
  std::vector<std::span<const uint8_t>> host_memory() const override { return weight.memory(); }
  bool cold() const override { return cold_store != nullptr; }

  kernels::Weight weight;  // kRows matrices keep the row-major layout
  std::shared_ptr<ColdStore> cold_store;  // null for a matrix in memory of its own
  int cold_id = -1;
  // A row table (MatrixUse::kRows) is entries cold_id, cold_id + 1, ... of cold_unit bytes
  // each, so that a step touches the pieces holding its tokens' rows; 0 for one entry.
  size_t cold_unit = 0;

 private:
  AlignedBuffer<uint8_t> gathered_;  // a strided slice's rows made contiguous (weight may read it)
};

class CpuVector final : public DeviceVector {
 public:
  explicit CpuVector(std::span<const float> v)
      : DeviceVector(static_cast<int64_t>(v.size())), values(v.begin(), v.end()) {}
  std::vector<float> values;
};

class CpuBuffer final : public DeviceBuffer {
 public:
  explicit CpuBuffer(size_t bytes) : DeviceBuffer(bytes), mem_(bytes) {}
  uint8_t* data() override { return mem_.data(); }

 private:
  AlignedBuffer<uint8_t> mem_;
};

// One row set's rows of a step that run with a LoRA adapter: rows[off[a - 1], off[a]) run
// with adapter a (off has one value per adapter and a last one, the total).
struct LoraGroups {
  std::vector<int> rows, off;
  std::vector<int> cursor;  // grouping scratch
  bool contiguous = false;  // rows are consecutive row numbers: no gather needed
};

class CpuState final : public ExecState {
 public:
  explicit CpuState(const StateSpec& spec);
  size_t bytes() const override { return bytes_; }
  void upload(ActId act, std::span<const float> src) override;
  std::span<const float> download(ActId act, size_t n) override;

  float* act(ActId id) { return acts_[static_cast<size_t>(id)].data(); }
  size_t cols(ActId id) const { return static_cast<size_t>(spec_.acts[static_cast<size_t>(id)].cols); }
  const StateSpec& spec() const { return spec_; }

  // Quantized activations: a product's input, and a second partner type's beside it.
  std::array<AlignedBuffer<uint8_t>, 2> qa;
  // One work counter per matrix product of a step (kernels::matmul's `next`), zeroed
  // before the step.
  struct alignas(64) Counter {  // a line each: q, k and v run back to back, unfenced
    std::atomic<int64_t> next{0};
  };
  std::unique_ptr<Counter[]> counters;
  // Page pointers and sequence views of two attention ops, used alternately: thread 0
  // prepares the next one's while the other threads may still read the current one's.
  std::array<std::vector<const uint8_t*>, 2> k_pages, v_pages;
  std::array<std::vector<kernels::AttentionSeq>, 2> seqs;
  // A MoeOp's routing (reused by every layer): for choice c = t * n_used + j of token t, its
  // expert, weight and slot (row of the slot buffers, grouped by expert); each slot's
  // token; each expert's first slot and first product piece (n_experts + 1 values each);
  // and the item counters of the gate-and-up and the down phases.
  std::vector<int32_t> moe_expert, moe_slot, moe_slot_token, moe_offset, moe_cursor, moe_piece_off;
  std::vector<float> moe_weight;
  std::unique_ptr<Counter[]> moe_counters;
  std::vector<int> moe_cold_ids;  // the cold entries of a MoeOp's chosen experts
  std::vector<int> embed_cold_ids;  // the cold pieces of an embedding table a step reads
  // LoraOps' rows by adapter: token rows, logits rows (made before each step).
  std::array<LoraGroups, 2> lora_groups;

 private:
  StateSpec spec_;
  std::vector<AlignedBuffer<float>> acts_;
  size_t bytes_ = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const kernels::KernelSet& set);
  std::string_view name() const override { return name_; }
  std::unique_ptr<DeviceMatrix> upload_matrix(const HostMatrix& m, MatrixUse use,
                                              bool allow_relayout) override;
  std::unique_ptr<DeviceVector> upload_vector(std::span<const float> v) override;
  bool host_memory_complete() const override { return true; }  // vectors are copies
  bool windowed_attention() const override { return true; }
  bool attention_soft_capping() const override { return true; }
  bool scaled_add() const override { return true; }
  int window_read_align() const override { return kernels::kAttentionKeyChunk; }
  std::unique_ptr<DeviceBuffer> alloc_buffer(size_t bytes) override;
  void copy_bytes(DeviceBuffer& buf, size_t src_offset, size_t dst_offset, size_t n) override;
  void write_bytes(DeviceBuffer& buf, size_t offset, std::span<const uint8_t> src) override;
  void read_bytes(DeviceBuffer& buf, size_t offset, std::span<uint8_t> dst) override;
  std::unique_ptr<ExecState> make_state(const StateSpec& spec) override;
  void execute(std::span<const Op> ops, const StepDesc& step, ExecState& state, ThreadPool& pool,
               StepObserver* observer) override;  // cpu_executor.cpp

 private:
  std::unique_ptr<DeviceMatrix> upload_cold(const HostMatrix& m, const uint8_t* rows, bool repack);
  std::unique_ptr<DeviceMatrix> upload_cold_rows(const HostMatrix& m, const uint8_t* rows);

  const kernels::KernelSet& set_;
  std::string name_;
  // Repacked matrices are carved from shared chunks so they share huge pages.
  std::shared_ptr<BumpArena> arena_;
};

}  // namespace metro::backends::cpu
