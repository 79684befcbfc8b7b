// Internal to backends/cuda: the CUDA backend's resource and state types.
//
// Every resource holds a reference to the device context (device index and stream), so a
// matrix, buffer or state may outlive the backend object that made it. All transfers and
// kernels of a backend run on its one stream, in order.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_graphs.cuh"
#include "backends/cuda/cuda_kernels.cuh"

namespace metro::backends::cuda {

struct Context {
  explicit Context(int device);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void use() const;  // makes this the calling thread's current device
  // A transfer on the stream (after everything enqueued before it), waited for: host
  // memory may be pageable, and the runtime's own synchronous copies would not be ordered
  // with this non-blocking stream.
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) const;

  int device;
  cudaStream_t stream = nullptr;
  bool sync_each_op = false;  // METRO_CUDA_SYNC=1: synchronise and check after every op
  bool graphs = true;         // METRO_CUDA_GRAPHS=0: never capture steps into CUDA graphs
};

// Device memory, freed with its owner.
class DeviceMem {
 public:
  DeviceMem() = default;
  DeviceMem(std::shared_ptr<Context> ctx, size_t bytes);
  ~DeviceMem();
  DeviceMem(DeviceMem&& o) noexcept;
  DeviceMem& operator=(DeviceMem&& o) noexcept;
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<Context> ctx_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (transfers to and from it run asynchronously).
class PinnedMem {
 public:
  PinnedMem() = default;
  explicit PinnedMem(size_t bytes);
  ~PinnedMem();
  PinnedMem(PinnedMem&& o) noexcept;
  PinnedMem& operator=(PinnedMem&& o) noexcept;
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class CudaMatrix final : public DeviceMatrix {
 public:
  CudaMatrix(DType type, int64_t n_rows, int64_t n_cols, int64_t row_bytes, DeviceMem mem)
      : DeviceMatrix(type, n_rows, n_cols), row_bytes(row_bytes), mem(std::move(mem)) {}
  std::string describe() const override;

  int64_t row_bytes;  // padded rows (formats.h)
  DeviceMem mem;
};

class CudaVector final : public DeviceVector {
 public:
  CudaVector(int64_t size, DeviceMem mem) : DeviceVector(size), mem(std::move(mem)) {}
  DeviceMem mem;
};

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(size_t bytes, DeviceMem mem) : DeviceBuffer(bytes), mem_(std::move(mem)) {}
  uint8_t* data() override { return mem_.as<uint8_t>(); }

 private:
  DeviceMem mem_;
};

// Most RopeAnglesOps one step may hold (each uploads its frequencies with the step).
inline constexpr int kMaxRopesPerStep = 4;

class CudaState final : public ExecState {
 public:
  CudaState(std::shared_ptr<Context> ctx, const StateSpec& spec);
  ~CudaState() override;
  size_t bytes() const override { return bytes_; }
  void upload(ActId act, std::span<const float> src) override;
  std::span<const float> download(ActId act, size_t n) override;

  const StateSpec& spec() const { return spec_; }
  float* act(ActId id) const { return acts_[static_cast<size_t>(id)].as<float>(); }
  int64_t cols(ActId id) const { return spec_.acts[static_cast<size_t>(id)].cols; }
  size_t act_floats(ActId id) const { return acts_[static_cast<size_t>(id)].bytes() / sizeof(float); }

  const std::shared_ptr<Context> ctx;
  // Quantized activations: a product's input in one partner type (the stream orders the
  // products that read one partner's copy before the next partner's overwrites it).
  DeviceMem qa;
  size_t qa_bytes = 0;
  DeviceMem attn_scratch;  // attention's partial results (launch_attention)
  // The step's RoPE frequencies (kMaxRopesPerStep slots at the start) and index arrays
  // (token ids, positions, runs, block tables, logits rows, after them): filled on the
  // host, sent in one copy per step. Their offsets depend only on the step's shape, so a
  // captured step (graphs) reads the next step's arrays where it read its own.
  PinnedMem index_host;
  DeviceMem index_dev;
  cudaEvent_t index_sent = nullptr;  // the last step's copy has left index_host
  std::vector<PinnedMem> mirrors;    // per buffer: upload(), download() and AllReduce stage here
  // Timing events around each op of an observed step: made on the first observed step of a
  // longer op sequence than any before, reused after.
  std::vector<cudaEvent_t> op_events;
  // Captured steps of recurring shapes (cuda_graphs.cuh); launched only on this state.
  GraphCache graphs;

 private:
  StateSpec spec_;
  std::vector<DeviceMem> acts_;
  size_t bytes_ = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::shared_ptr<Context> ctx, std::string name);
  std::string_view name() const override { return name_; }
  std::unique_ptr<DeviceMatrix> upload_matrix(const HostMatrix& m, MatrixUse use, bool allow_relayout) override;
  bool reads(DType t) const override;
  std::unique_ptr<DeviceVector> upload_vector(std::span<const float> v) override;
  std::unique_ptr<DeviceBuffer> alloc_buffer(size_t bytes) override;
  void copy_bytes(DeviceBuffer& buf, size_t src_offset, size_t dst_offset, size_t n) override;
  void write_bytes(DeviceBuffer& buf, size_t offset, std::span<const uint8_t> src) override;
  void read_bytes(DeviceBuffer& buf, size_t offset, std::span<uint8_t> dst) override;
  std::unique_ptr<ExecState> make_state(const StateSpec& spec) override;
  void execute(std::span<const Op> ops, const StepDesc& step, ExecState& state, ThreadPool& pool,
               StepObserver* observer) override;  // cuda_executor.cu
  bool cheap_op_timing() const override { return false; }  // an event per op and a wait

 private:
  std::shared_ptr<Context> ctx_;
  std::string name_;
};

// Bytes of the step index region a state needs for its spec (cuda_executor.cu).
size_t index_bytes(const StateSpec& spec);

}  // namespace metro::backends::cuda
