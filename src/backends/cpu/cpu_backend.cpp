// The CPU backend's resources: weights as kernels::Weight (repacked where the kernel set
// has an interleaved kernel), vectors and KV arenas in host memory, workspaces.
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_backend_impl.h"
#include "base/check.h"

namespace metro::backends {

namespace cpu {

CpuState::CpuState(const StateSpec& spec) : spec_(spec) {
  METRO_CHECK(spec.max_tokens > 0 && spec.max_logits >= 0 && spec.max_seqs > 0 &&
              spec.max_blocks_per_seq > 0 && spec.max_products >= 0);
  acts_.resize(spec.acts.size());
  embed_cold_ids.reserve(2 * static_cast<size_t>(spec.max_tokens));  // nothing allocates in a step
  for (size_t i = 0; i < spec.acts.size(); ++i) {
    const size_t rows = static_cast<size_t>(spec.acts[i].rows == RowSet::kTokens ? spec.max_tokens
                                                                                  : spec.max_logits);
    acts_[i].resize(rows * static_cast<size_t>(spec.acts[i].cols));
    bytes_ += acts_[i].size() * sizeof(float);
  }
  METRO_CHECK(spec.max_experts >= 0 && spec.max_experts_used >= 0 && spec.max_experts_used <= spec.max_experts);
  size_t qa_bytes = 0;
  const int64_t choices = int64_t{spec.max_tokens} * spec.max_experts_used;
  const int64_t rows = std::max<int64_t>({spec.max_tokens, spec.max_logits, choices});
  for (kernels::DType t : spec.product_types) {
    qa_bytes = std::max(qa_bytes, kernels::quantized_acts_bytes(t, rows, spec.widest_product_k));
  }
  for (auto& b : qa) b.resize(qa_bytes);
  counters = std::make_unique<Counter[]>(static_cast<size_t>(spec.max_products));
  if (spec.max_adapters > 0) {
    for (auto& g : lora_groups) {
      g.rows.reserve(static_cast<size_t>(std::max(spec.max_tokens, spec.max_logits)));
      g.off.reserve(static_cast<size_t>(spec.max_adapters) + 1);
      g.cursor.reserve(static_cast<size_t>(spec.max_adapters));
    }
  }
  if (spec.max_experts > 0) {
    const size_t c = static_cast<size_t>(choices);
    moe_expert.resize(c);
    moe_slot.resize(c);
    moe_slot_token.resize(c);
    moe_weight.resize(c);
    moe_offset.resize(static_cast<size_t>(spec.max_experts) + 1);
    moe_cursor.resize(static_cast<size_t>(spec.max_experts));
    moe_piece_off.resize(static_cast<size_t>(spec.max_experts) + 1);
    moe_counters = std::make_unique<Counter[]>(2);
    moe_cold_ids.reserve(3 * static_cast<size_t>(spec.max_experts));  // nothing allocates in a step
    bytes_ += 4 * c * 4 + 3 * (static_cast<size_t>(spec.max_experts) + 1) * 4 + 2 * sizeof(Counter);
  }
  const size_t pages = static_cast<size_t>(spec.max_seqs) * static_cast<size_t>(spec.max_blocks_per_seq);
  for (int b = 0; b < 2; ++b) {
    k_pages[static_cast<size_t>(b)].resize(pages);
    v_pages[static_cast<size_t>(b)].resize(pages);
    seqs[static_cast<size_t>(b)].resize(static_cast<size_t>(spec.max_seqs));
  }
  bytes_ += 2 * qa_bytes + 4 * pages * sizeof(void*);
}

void CpuState::upload(ActId act, std::span<const float> src) {
  const size_t i = static_cast<size_t>(act);
  METRO_CHECK(i < acts_.size() && src.size() <= acts_[i].size());
  std::copy(src.begin(), src.end(), acts_[i].data());
}

std::span<const float> CpuState::download(ActId act, size_t n) {
  const size_t i = static_cast<size_t>(act);
  METRO_CHECK(i < acts_.size() && n <= acts_[i].size());
  return {acts_[i].data(), n};
}

CpuBackend::CpuBackend(const kernels::KernelSet& set)
    : set_(set), name_("cpu-" + std::string(set.isa())), arena_(std::make_shared<BumpArena>()) {}

std::unique_ptr<DeviceMatrix> CpuBackend::upload_matrix(const HostMatrix& m, MatrixUse use,
                                                        bool allow_relayout) {
  METRO_CHECK(m.n_rows > 0 && m.n_cols > 0 && m.data != nullptr);
  const size_t rb = kernels::row_bytes(m.type, m.n_cols);
  METRO_CHECK(m.row_stride >= rb);
  AlignedBuffer<uint8_t> gathered;
  const uint8_t* rows = m.data;
  if (m.row_stride != rb) {
    gathered.resize(rb * static_cast<size_t>(m.n_rows));
    for (int64_t i = 0; i < m.n_rows; ++i) {
      std::memcpy(gathered.data() + static_cast<size_t>(i) * rb, m.data + static_cast<size_t>(i) * m.row_stride, rb);
    }
    rows = gathered.data();
  }
  const bool repack = use == MatrixUse::kProduct && allow_relayout;
  if (m.cold) {
    auto cold = use == MatrixUse::kProduct ? upload_cold(m, rows, repack) : upload_cold_rows(m, rows);
    if (cold) return cold;
  }
  kernels::Weight w = set_.make_weight(m.type, rows, m.n_rows, m.n_cols, repack, arena_);
  return std::make_unique<CpuMatrix>(std::move(w), std::move(gathered));
}

// The weight in its layout, copied into one entry of the cold store: its kernel bytes, then
// (F16) the row-major bytes kept beside them. Null when the store cannot grow.
std::unique_ptr<DeviceMatrix> CpuBackend::upload_cold(const HostMatrix& m, const uint8_t* rows, bool repack) {
  kernels::Weight w = set_.make_weight(m.type, rows, m.n_rows, m.n_cols, repack, nullptr);
  const auto parts = w.memory();
  size_t total = 0;
  for (const auto& p : parts) total += (p.size() + 63) / 64 * 64;
  uint8_t* dst = m.cold->take(total);
  if (dst == nullptr) return nullptr;
  size_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::memcpy(dst + at, parts[i].data(), parts[i].size());
    if (i == 0) w.data = dst + at;
    if (i == 1) w.row_major = dst + at;
    at += (parts[i].size() + 63) / 64 * 64;
  }
  w.owned = std::monostate{};  // the store keeps the bytes; the matrix keeps the store
  const int id = m.cold->add(dst, total);
  return std::make_unique<CpuMatrix>(std::move(w), m.cold, id);
}

// A row table copied into the cold store as entries of the store's unit each.
std::unique_ptr<DeviceMatrix> CpuBackend::upload_cold_rows(const HostMatrix& m, const uint8_t* rows) {
  const size_t bytes = kernels::row_bytes(m.type, m.n_cols) * static_cast<size_t>(m.n_rows);
  uint8_t* dst = m.cold->take(bytes);
  if (dst == nullptr) return nullptr;
  std::memcpy(dst, rows, bytes);
  const size_t unit = m.cold->unit();
  int first = -1;
  for (size_t at = 0; at < bytes; at += unit) {
    const int id = m.cold->add(dst + at, std::min(unit, bytes - at));
    if (first < 0) first = id;
  }
  kernels::Weight w = set_.make_weight(m.type, dst, m.n_rows, m.n_cols, /*allow_repack=*/false, nullptr);
  auto out = std::make_unique<CpuMatrix>(std::move(w), m.cold, first);
  out->cold_unit = unit;
  return out;
}

std::unique_ptr<DeviceVector> CpuBackend::upload_vector(std::span<const float> v) {
  return std::make_unique<CpuVector>(v);
}

std::unique_ptr<DeviceBuffer> CpuBackend::alloc_buffer(size_t bytes) {
  return std::make_unique<CpuBuffer>(bytes);
}

void CpuBackend::copy_bytes(DeviceBuffer& buf, size_t src_offset, size_t dst_offset, size_t n) {
  METRO_CHECK(src_offset <= buf.bytes() && n <= buf.bytes() - src_offset);
  METRO_CHECK(dst_offset <= buf.bytes() && n <= buf.bytes() - dst_offset);
  METRO_CHECK(src_offset + n <= dst_offset || dst_offset + n <= src_offset);
  std::memcpy(buf.data() + dst_offset, buf.data() + src_offset, n);
}

void CpuBackend::write_bytes(DeviceBuffer& buf, size_t offset, std::span<const uint8_t> src) {
  METRO_CHECK(offset <= buf.bytes() && src.size() <= buf.bytes() - offset);
  std::memcpy(buf.data() + offset, src.data(), src.size());
}

void CpuBackend::read_bytes(DeviceBuffer& buf, size_t offset, std::span<uint8_t> dst) {
  METRO_CHECK(offset <= buf.bytes() && dst.size() <= buf.bytes() - offset);
  std::memcpy(dst.data(), buf.data() + offset, dst.size());
}

std::unique_ptr<ExecState> CpuBackend::make_state(const StateSpec& spec) {
  return std::make_unique<CpuState>(spec);
}

}  // namespace cpu

std::shared_ptr<Backend> make_cpu_backend(const kernels::KernelSet& set) {
  return std::make_shared<cpu::CpuBackend>(set);
}

}  // namespace metro::backends
