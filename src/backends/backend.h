// The device seam: what executes a model's steps. A backend owns device memory for the
// weights (uploaded once, in the layout its kernels want), for the KV arena and for the
// per-step workspace, and executes a step's op sequence (ops.h) over them. The CPU backend
// (cpu/) is one; a CUDA backend (cuda/) implements the same interface.
//
// Resources are handed out as objects the caller owns; each keeps alive what it needs, so
// it may outlive the backend object that made it. A backend only accepts resources it
// made itself (or one of its kind made).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/kv_view.h"
#include "backends/ops.h"
#include "kernels/dtype.h"

namespace metro {
class ColdStore;
class ThreadPool;
}

namespace metro::backends {

// A weight matrix in the backend's memory: n_rows output features of n_cols inputs each.
class DeviceMatrix {
 public:
  virtual ~DeviceMatrix() = default;
  kernels::DType type() const { return type_; }
  int64_t n_rows() const { return n_rows_; }
  int64_t n_cols() const { return n_cols_; }
  // How the backend stores it, e.g. "Q4_1 x8 interleaved" (`metro inspect`, `metro bench`).
  virtual std::string describe() const = 0;
  // The host memory its products read (a host backend: its own copy, or the bytes it was
  // uploaded from, read in place). Empty for a matrix held in device memory.
  virtual std::vector<std::span<const uint8_t>> host_memory() const { return {}; }
  // Whether it was put in a cold store (HostMatrix::cold): host_memory() then lies in the
  // store's file mapping, resident only while touched.
  virtual bool cold() const { return false; }

 protected:
  DeviceMatrix(kernels::DType type, int64_t n_rows, int64_t n_cols)
      : type_(type), n_rows_(n_rows), n_cols_(n_cols) {}

 private:
  kernels::DType type_;
  int64_t n_rows_;
  int64_t n_cols_;
};

// An F32 vector in the backend's memory (norm weights, biases).
class DeviceVector {
 public:
  virtual ~DeviceVector() = default;
  int64_t size() const { return size_; }

 protected:
  explicit DeviceVector(int64_t size) : size_(size) {}

 private:
  int64_t size_;
};

// Raw device memory (the KV arena).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  // The address ops and KvView use; host memory only for a host backend.
  virtual uint8_t* data() = 0;
  size_t bytes() const { return bytes_; }

 protected:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {}

 private:
  size_t bytes_;
};

// A matrix as it lies in host memory (a GGUF tensor, or a slice of one): row i starts at
// data + i * row_stride and holds n_cols elements of `type` in GGUF block order. A slice of
// columns has a row_stride wider than its rows.
struct HostMatrix {
  kernels::DType type = kernels::DType::kF32;
  int64_t n_rows = 0;
  int64_t n_cols = 0;  // a multiple of the type's block size
  const uint8_t* data = nullptr;
  size_t row_stride = 0;
  // Non-null: a matrix steps read rarely or in parts (an expert; an embedding table, a row
  // per token), which a host backend may keep in this store, behind the page cache, instead
  // of in memory of its own; the executor touches what a step reads of it
  // (ColdStore::touch). Where the store cannot grow, or on a device backend, the matrix is
  // held as any other.
  std::shared_ptr<ColdStore> cold;
};

enum class MatrixUse : uint8_t {
  kProduct,  // the weight of a ProjectOp; the backend may change its layout
  kRows,     // rows gathered by EmbedOp
};

// One activation buffer of the workspace: [rows][cols] F32, the rows being at most
// max_tokens token rows or max_logits logits rows.
struct ActSpec {
  int64_t cols = 0;
  RowSet rows = RowSet::kTokens;
};

// Everything a workspace must hold for the largest step it will run.
struct StateSpec {
  int max_tokens = 0;
  int max_logits = 0;
  int max_seqs = 0;            // sequence runs per step
  int max_blocks_per_seq = 0;  // KV blocks a sequence's attention may read
  std::vector<ActSpec> acts;   // indexed by ActId
  // The matrix products (ProjectOp outputs) one step runs at most, the weight types among
  // them and their widest input: what the backend sizes quantized activations by.
  int max_products = 0;
  std::vector<kernels::DType> product_types;
  int64_t widest_product_k = 0;
  // MoeOps: the most experts of a layer and the most a token uses (its expert products'
  // inputs are max_tokens * max_experts_used rows).
  int max_experts = 0;
  int max_experts_used = 0;
  // LoraOps: the most adapters a LoraSet holds.
  int max_adapters = 0;
};

// A backend's per-step scratch (the activation buffers and whatever its executor needs),
// made once for the largest step: executing a step allocates nothing.
class ExecState {
 public:
  virtual ~ExecState() = default;
  virtual size_t bytes() const = 0;
  // Copies src into the first src.size() floats of buffer `act` (rows in order).
  virtual void upload(ActId act, std::span<const float> src) = 0;
  // The first n floats of buffer `act` in host memory; valid until the next execute or
  // upload with this state (a host backend returns the buffer itself, a device backend
  // copies into a host mirror).
  virtual std::span<const float> download(ActId act, size_t n) = 0;
};

// A run of consecutive tokens of one sequence in a step: batch rows [start, start + n) at
// positions pos0, pos0 + 1, ... of sequence slot `seq`; earlier positions are in its KV.
struct SeqRun {
  int seq = 0;
  int start = 0;
  int n = 0;
  int64_t pos0 = 0;
};

// The step's inputs besides the activation buffers: host arrays the model filled.
struct StepDesc {
  std::span<const int32_t> token;  // [n tokens] ids (read by EmbedOp)
  std::span<const int32_t> pos;    // [n tokens] positions
  std::span<const int32_t> seq;    // [n tokens] sequence slot, an index into kv->tables
  std::span<const SeqRun> runs;    // every token in exactly one run, in batch order
  std::span<const int> logit_rows;  // the token of each logits row
  const KvView* kv = nullptr;       // null when no op touches KV memory
  // [n tokens] the LoRA adapter each token runs with (LoraOp; 0: none); empty: none at all.
  std::span<const int16_t> adapter;
};

// An optional observer of a step's execution, called on the executing thread 0 (the
// caller of execute). The executor measures nothing when none is given.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Op `index` of the sequence took `ns` of thread 0's wall time. For Project, Attention
  // and AllReduce that is from its start until every thread has finished it (the wait for
  // the slowest included); for an elementwise op, thread 0's own rows.
  virtual void op_timed(size_t index, OpKind kind, int64_t ns) = 0;
  // Thread 0 waited `ns` for the other threads at the end of a run of elementwise ops.
  virtual void wait_timed(int64_t ns) { (void)ns; }
};

// Wall time and calls per op kind over the steps it observed: a step profile.
class StepProfile final : public StepObserver {
 public:
  void op_timed(size_t index, OpKind kind, int64_t ns) override;
  void wait_timed(int64_t ns) override { wait_ns_ += ns; }

  double seconds(OpKind kind) const;
  int calls(OpKind kind) const;
  double wait_seconds() const { return static_cast<double>(wait_ns_) * 1e-9; }
  double total_seconds() const;  // every op and wait
  void clear() { *this = StepProfile(); }

 private:
  std::array<int64_t, kNumOpKinds> ns_{};
  std::array<int, kNumOpKinds> calls_{};
  int64_t wait_ns_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // e.g. "cpu-avx2"; unique among the backends of a machine (registry.h).
  virtual std::string_view name() const = 0;

  // Weights. `allow_relayout`: whether a kProduct matrix may be copied into a layout the
  // backend's kernels prefer (a host backend may otherwise keep reading `m.data`, which
  // must then outlive the matrix). Uploads come from one thread at a time.
  virtual std::unique_ptr<DeviceMatrix> upload_matrix(const HostMatrix& m, MatrixUse use,
                                                      bool allow_relayout) = 0;
  // Whether the backend multiplies weights of this type (a model with others is refused
  // when it binds, before any upload).
  virtual bool reads(kernels::DType t) const {
    (void)t;
    return true;
  }
  virtual std::unique_ptr<DeviceVector> upload_vector(std::span<const float> v) = 0;
  // Whether DeviceMatrix::host_memory names every host byte this backend's matrices read
  // while they compute (a host backend); the memory of uploaded bytes outside it may then
  // be given back.
  virtual bool host_memory_complete() const { return false; }
  // Whether AttentionOp::window is honoured. A backend without it runs a model with a
  // sliding window only at contexts within the window (Model::max_context), where windowed
  // and full attention agree.
  virtual bool windowed_attention() const { return false; }
  // Whether AttentionOp::softcap is honoured; a model that caps its attention scores is
  // refused on a backend without it.
  virtual bool attention_soft_capping() const { return false; }
  // Whether AddOp::scale is honoured; a model that scales its sublayers' outputs (granite)
  // is refused on a backend without it.
  virtual bool scaled_add() const { return false; }
  // With windowed attention: the alignment of the first key position the attention kernels
  // read for a query (they may read keys before its window back to this boundary), so the
  // KV blocks before it can be given back.
  virtual int window_read_align() const { return 1; }

  // Raw memory for a KV arena (uninitialised), and transfers within and to and from it.
  virtual std::unique_ptr<DeviceBuffer> alloc_buffer(size_t bytes) = 0;
  // n bytes at src_offset to dst_offset of the same buffer (ranges must not overlap):
  // how a forked sequence gets its copy of a shared block.
  virtual void copy_bytes(DeviceBuffer& buf, size_t src_offset, size_t dst_offset, size_t n) = 0;
  virtual void write_bytes(DeviceBuffer& buf, size_t offset, std::span<const uint8_t> src) = 0;
  virtual void read_bytes(DeviceBuffer& buf, size_t offset, std::span<uint8_t> dst) = 0;

  virtual std::unique_ptr<ExecState> make_state(const StateSpec& spec) = 0;

  // Runs the ops in order on `state` (made by this backend from a spec that covers the
  // step). A host backend spreads the work over `pool`; a device backend may use it for
  // host-side work or not at all. Preconditions (checked): the ops name buffers of the
  // state, with widths that match their weights; the step fits the spec.
  virtual void execute(std::span<const Op> ops, const StepDesc& step, ExecState& state,
                       ThreadPool& pool, StepObserver* observer = nullptr) = 0;

  // Whether observing a step (execute with an observer) costs next to nothing. A host
  // backend reads a clock; a device backend records an event around every op and waits for
  // the step to finish, so a caller that only sometimes wants op times (the engine's step
  // report) passes an observer only when this holds or when it needs the times.
  virtual bool cheap_op_timing() const { return true; }
};

}  // namespace metro::backends
