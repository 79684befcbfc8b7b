// The CUDA backend's resources: the device context, weights in padded blocks (formats.h),
// vectors, KV arenas, workspaces with pinned host mirrors; and the backend's entry points
// (cuda_backend.h). See cuda_executor.cu for how a step runs.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_backend_impl.cuh"
#include "backends/cuda/formats.h"
#include "base/check.h"

namespace metro::backends {

namespace cuda {

void cuda_failed(const char* expr, cudaError_t err, const char* file, int line) {
  std::fprintf(stderr, "metro: CUDA error at %s:%d: %s: %s (%s)\n", file, line, expr, cudaGetErrorString(err),
               cudaGetErrorName(err));
  std::fflush(stderr);
  std::abort();
}

Context::Context(int dev) : device(dev) {
  METRO_CUDA_OK(cudaSetDevice(device));
  METRO_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const char* sync = std::getenv("METRO_CUDA_SYNC");
  sync_each_op = sync != nullptr && std::strcmp(sync, "1") == 0;
  const char* graphs_env = std::getenv("METRO_CUDA_GRAPHS");
  graphs = graphs_env == nullptr || std::strcmp(graphs_env, "0") != 0;
}

void Context::copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) const {
  if (bytes == 0) return;
  use();
  METRO_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  METRO_CUDA_OK(cudaStreamSynchronize(stream));
}

Context::~Context() {
  cudaSetDevice(device);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

void Context::use() const { METRO_CUDA_OK(cudaSetDevice(device)); }

DeviceMem::DeviceMem(std::shared_ptr<Context> ctx, size_t bytes) : ctx_(std::move(ctx)), bytes_(bytes) {
  if (bytes == 0) return;
  ctx_->use();
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "metro: cannot allocate %zu bytes on CUDA device %d\n", bytes, ctx_->device);
    cuda_failed("cudaMalloc", err, __FILE__, __LINE__);
  }
}

DeviceMem::~DeviceMem() {
  if (ptr_ != nullptr) {
    cudaSetDevice(ctx_->device);
    cudaFree(ptr_);  // synchronises with the device: no kernel still reads it
  }
}

DeviceMem::DeviceMem(DeviceMem&& o) noexcept : ctx_(std::move(o.ctx_)), ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceMem& DeviceMem::operator=(DeviceMem&& o) noexcept {
  if (this != &o) {
    DeviceMem old(std::move(*this));
    ctx_ = std::move(o.ctx_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

PinnedMem::PinnedMem(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) METRO_CUDA_OK(cudaMallocHost(&ptr_, bytes));
}

PinnedMem::~PinnedMem() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

PinnedMem::PinnedMem(PinnedMem&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

PinnedMem& PinnedMem::operator=(PinnedMem&& o) noexcept {
  if (this != &o) {
    PinnedMem old(std::move(*this));
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

std::string CudaMatrix::describe() const {
  const BlockGeom g = block_geom(type());
  std::string s(kernels::dtype_name(type()));
  if (g.bytes != g.src_bytes) s += " padded to " + std::to_string(g.bytes) + " B blocks";
  return s + " (CUDA)";
}

CudaState::CudaState(std::shared_ptr<Context> context, const StateSpec& spec) : ctx(std::move(context)), spec_(spec) {
  METRO_CHECK(spec.max_tokens > 0 && spec.max_logits >= 0 && spec.max_seqs > 0 && spec.max_blocks_per_seq > 0 &&
              spec.max_products >= 0);
  ctx->use();
  for (const ActSpec& a : spec.acts) {
    const size_t rows = static_cast<size_t>(a.rows == RowSet::kTokens ? spec.max_tokens : spec.max_logits);
    const size_t bytes = rows * static_cast<size_t>(a.cols) * sizeof(float);
    acts_.emplace_back(ctx, bytes);
    mirrors.emplace_back(bytes);
    bytes_ += bytes;
  }
  const int64_t rows = std::max(spec.max_tokens, spec.max_logits);
  for (DType t : spec.product_types) {
    const DType partner = kernels::traits(t).dot_partner;
    if (partner == DType::kF32) continue;
    qa_bytes = std::max(qa_bytes, static_cast<size_t>(rows * act_row_bytes(partner, spec.widest_product_k)));
  }
  qa = DeviceMem(ctx, qa_bytes);
  attn_scratch = DeviceMem(ctx, attention_scratch_bytes());
  const size_t ib = index_bytes(spec);
  index_host = PinnedMem(ib);
  index_dev = DeviceMem(ctx, ib);
  METRO_CUDA_OK(cudaEventCreateWithFlags(&index_sent, cudaEventDisableTiming));
  METRO_CUDA_OK(cudaEventRecord(index_sent, ctx->stream));
  bytes_ += qa_bytes + attn_scratch.bytes() + ib;
}

CudaState::~CudaState() {
  cudaSetDevice(ctx->device);
  cudaStreamSynchronize(ctx->stream);
  cudaEventDestroy(index_sent);
  for (cudaEvent_t e : op_events) cudaEventDestroy(e);
}

void CudaState::upload(ActId act, std::span<const float> src) {
  const size_t i = static_cast<size_t>(act);
  METRO_CHECK(i < acts_.size() && src.size() * sizeof(float) <= acts_[i].bytes());
  if (src.empty()) return;
  ctx->use();
  METRO_CUDA_OK(cudaStreamSynchronize(ctx->stream));  // the mirror may be in a transfer
  std::memcpy(mirrors[i].as<float>(), src.data(), src.size() * sizeof(float));
  METRO_CUDA_OK(cudaMemcpyAsync(acts_[i].get(), mirrors[i].as<float>(), src.size() * sizeof(float),
                                cudaMemcpyHostToDevice, ctx->stream));
  METRO_CUDA_OK(cudaStreamSynchronize(ctx->stream));
}

std::span<const float> CudaState::download(ActId act, size_t n) {
  const size_t i = static_cast<size_t>(act);
  METRO_CHECK(i < acts_.size() && n * sizeof(float) <= acts_[i].bytes());
  ctx->use();
  if (n > 0) {
    METRO_CUDA_OK(cudaMemcpyAsync(mirrors[i].as<float>(), acts_[i].get(), n * sizeof(float), cudaMemcpyDeviceToHost,
                                  ctx->stream));
  }
  METRO_CUDA_OK(cudaStreamSynchronize(ctx->stream));  // also where a fault of the step's kernels shows
  return {mirrors[i].as<float>(), n};
}

CudaBackend::CudaBackend(std::shared_ptr<Context> ctx, std::string name) : ctx_(std::move(ctx)), name_(std::move(name)) {}

bool CudaBackend::reads(DType t) const { return block_geom(t).elems > 0 && matmul_supports(t); }

std::unique_ptr<DeviceMatrix> CudaBackend::upload_matrix(const HostMatrix& m, MatrixUse use, bool allow_relayout) {
  (void)use;
  (void)allow_relayout;  // the padded layout is the only one its kernels read
  METRO_CHECK(m.n_rows > 0 && m.n_cols > 0 && m.data != nullptr);
  const BlockGeom g = block_geom(m.type);
  METRO_CHECK_MSG(g.elems > 0 && matmul_supports(m.type), "the CUDA backend has no kernels for this weight type");
  METRO_CHECK(m.n_cols % g.elems == 0 && m.row_stride >= kernels::row_bytes(m.type, m.n_cols));
  const int64_t rb = padded_row_bytes(m.type, m.n_cols);
  std::vector<uint8_t> host(static_cast<size_t>(rb * m.n_rows));
  for (int64_t i = 0; i < m.n_rows; ++i) {
    pad_row(m.type, m.data + static_cast<size_t>(i) * m.row_stride, host.data() + i * rb, m.n_cols);
  }
  DeviceMem mem(ctx_, host.size());
  ctx_->copy(mem.get(), host.data(), host.size(), cudaMemcpyHostToDevice);
  return std::make_unique<CudaMatrix>(m.type, m.n_rows, m.n_cols, rb, std::move(mem));
}

std::unique_ptr<DeviceVector> CudaBackend::upload_vector(std::span<const float> v) {
  DeviceMem mem(ctx_, v.size() * sizeof(float));
  ctx_->copy(mem.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  return std::make_unique<CudaVector>(static_cast<int64_t>(v.size()), std::move(mem));
}

std::unique_ptr<DeviceBuffer> CudaBackend::alloc_buffer(size_t bytes) {
  return std::make_unique<CudaBuffer>(bytes, DeviceMem(ctx_, bytes));
}

namespace {
CudaBuffer& cuda_buffer(DeviceBuffer& b) {
  auto* cb = dynamic_cast<CudaBuffer*>(&b);
  METRO_CHECK_MSG(cb != nullptr, "the CUDA backend transfers only buffers it allocated");
  return *cb;
}
}  // namespace

void CudaBackend::copy_bytes(DeviceBuffer& buf, size_t src_offset, size_t dst_offset, size_t n) {
  CudaBuffer& b = cuda_buffer(buf);
  METRO_CHECK(src_offset <= b.bytes() && n <= b.bytes() - src_offset);
  METRO_CHECK(dst_offset <= b.bytes() && n <= b.bytes() - dst_offset);
  METRO_CHECK(src_offset + n <= dst_offset || dst_offset + n <= src_offset);
  if (n == 0) return;
  ctx_->use();
  // On the stream: ordered after the steps that wrote the source, before those that read
  // the copy.
  METRO_CUDA_OK(cudaMemcpyAsync(b.data() + dst_offset, b.data() + src_offset, n, cudaMemcpyDeviceToDevice,
                                ctx_->stream));
}

void CudaBackend::write_bytes(DeviceBuffer& buf, size_t offset, std::span<const uint8_t> src) {
  CudaBuffer& b = cuda_buffer(buf);
  METRO_CHECK(offset <= b.bytes() && src.size() <= b.bytes() - offset);
  ctx_->copy(b.data() + offset, src.data(), src.size(), cudaMemcpyHostToDevice);
}

void CudaBackend::read_bytes(DeviceBuffer& buf, size_t offset, std::span<uint8_t> dst) {
  CudaBuffer& b = cuda_buffer(buf);
  METRO_CHECK(offset <= b.bytes() && dst.size() <= b.bytes() - offset);
  ctx_->copy(dst.data(), b.data() + offset, dst.size(), cudaMemcpyDeviceToHost);
}

std::unique_ptr<ExecState> CudaBackend::make_state(const StateSpec& spec) {
  return std::make_unique<CudaState>(ctx_, spec);
}

}  // namespace cuda

bool cuda_compiled() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error of later calls
    return 0;
  }
  return n;
}

Expected<CudaDeviceInfo> cuda_device_info(int device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n) return unavailable("CUDA device " + std::to_string(device) + " is not present");
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return unavailable(std::string("CUDA device ") + std::to_string(device) + ": " + cudaGetErrorString(err));
  }
  CudaDeviceInfo info;
  info.name = prop.name;
  info.memory_bytes = prop.totalGlobalMem;
  info.major = prop.major;
  info.minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  return info;
}

Expected<std::shared_ptr<Backend>> make_cuda_backend(int device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n) {
    return unavailable(n == 0 ? std::string("no CUDA device is present")
                              : "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                                    " present)");
  }
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return unavailable(std::string("CUDA device ") + std::to_string(device) + ": " + cudaGetErrorString(err));
  }
  if (prop.major < 8) {
    return unavailable(std::string("CUDA device ") + prop.name + " has compute capability " +
                       std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                       "; metro's CUDA kernels are built for 8.0 and later");
  }
  auto ctx = std::make_shared<cuda::Context>(device);
  return std::shared_ptr<Backend>(std::make_shared<cuda::CudaBackend>(
      std::move(ctx), "cuda-sm" + std::to_string(prop.major) + std::to_string(prop.minor)));
}

}  // namespace metro::backends
