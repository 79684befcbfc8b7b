// The CUDA executor: a step's ops become kernel launches on the backend's stream, in order.
//
// Before the first launch the host lays out the step's RoPE frequencies and index arrays
// (token ids, positions, the KV block of each token, the run of each token, the runs, their
// block tables, the logits rows) in the state's pinned buffer and sends them in one copy;
// the ops then read them on the device. Nothing else crosses to the device during a step,
// and no device memory is allocated. The call returns once everything is enqueued: the
// next download() (or a step's observer) waits for the device.
//
// A step whose shape has recurred is launched as a CUDA graph (cuda_graphs.cuh) unless it
// is observed, METRO_CUDA_SYNC=1 synchronises every op, an all-reduce goes through the
// host, or METRO_CUDA_GRAPHS=0; a failed capture falls back to plain launches.
//
// The host checks what a kernel would otherwise read out of bounds: token ids against the
// embedding table, block ids against the arena, every token in a run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "backends/cuda/cuda_backend_impl.cuh"
#include "backends/cuda/formats.h"
#include "backends/validate.h"
#include "base/check.h"
#include "dist/communicator.h"
#include "kernels/ops.h"

namespace metro::backends::cuda {

namespace {

constexpr int kHalfRot = kernels::Rope::kMaxRot / 2;
// The RoPE frequency slots at the start of the index buffer; the int32 arrays follow.
constexpr size_t kRopeBytes = static_cast<size_t>(kMaxRopesPerStep) * kHalfRot * sizeof(double);

size_t align8(size_t v) { return (v + 7) / 8 * 8; }

size_t max_index_ints(const StateSpec& s) {
  return 4 * static_cast<size_t>(s.max_tokens) + static_cast<size_t>(s.max_logits) +
         4 * static_cast<size_t>(s.max_seqs) + static_cast<size_t>(s.max_seqs) * static_cast<size_t>(s.max_blocks_per_seq);
}

const CudaMatrix& cuda_matrix(const DeviceMatrix* m) {
  const auto* cm = dynamic_cast<const CudaMatrix*>(m);
  METRO_CHECK_MSG(cm != nullptr, "the CUDA backend multiplies only matrices it uploaded");
  return *cm;
}

const float* cuda_vector(const DeviceVector* v) {
  const auto* cv = dynamic_cast<const CudaVector*>(v);
  METRO_CHECK_MSG(cv != nullptr, "the CUDA backend reads only vectors it uploaded");
  return cv->mem.as<float>();
}

// Where the step's arrays lie in the index buffer: int32 offsets from kRopeBytes, each a
// function of the token, logits-row and run counts only (the tables' end varies).
struct StepIndex {
  size_t token = 0, pos = 0, tok_run = 0, kv_block = 0, logit_rows = 0, runs = 0, tables = 0, end = 0;
  int n_ropes = 0;
};

StepIndex fill_index(std::span<const Op> ops, const StepDesc& step, const StateSpec& spec, uint8_t* index) {
  int32_t* h = reinterpret_cast<int32_t*>(index + kRopeBytes);
  const size_t n = step.token.size(), n_logits = step.logit_rows.size(), n_runs = step.runs.size();
  StepIndex x;
  x.token = 0;
  x.pos = n;
  x.tok_run = 2 * n;
  x.kv_block = 3 * n;
  x.logit_rows = 4 * n;
  x.runs = x.logit_rows + n_logits;
  x.tables = x.runs + 4 * n_runs;
  for (size_t t = 0; t < n; ++t) {
    h[x.token + t] = step.token[t];
    METRO_CHECK_MSG(step.pos[t] >= 0, "negative position");
    h[x.pos + t] = step.pos[t];
    h[x.tok_run + t] = -1;
    h[x.kv_block + t] = 0;
  }
  for (size_t r = 0; r < n_logits; ++r) {
    METRO_CHECK_MSG(step.logit_rows[r] >= 0 && static_cast<size_t>(step.logit_rows[r]) < n,
                    "a logits row names a token outside the step");
    h[x.logit_rows + r] = step.logit_rows[r];
  }
  size_t next = x.tables;
  const KvView* kv = step.kv;
  for (size_t r = 0; r < n_runs; ++r) {
    const SeqRun& run = step.runs[r];
    METRO_CHECK_MSG(run.start >= 0 && run.n >= 0 && static_cast<size_t>(run.start) + static_cast<size_t>(run.n) <= n,
                    "a sequence run outside the step's tokens");
    METRO_CHECK_MSG(run.pos0 >= 0 && run.pos0 + run.n <= INT32_MAX, "a sequence run's positions overflow");
    for (int i = run.start; i < run.start + run.n; ++i) {
      METRO_CHECK_MSG(h[x.tok_run + static_cast<size_t>(i)] == -1, "a token in two sequence runs");
      h[x.tok_run + static_cast<size_t>(i)] = static_cast<int32_t>(r);
    }
    h[x.runs + 4 * r] = run.start;
    h[x.runs + 4 * r + 1] = run.n;
    h[x.runs + 4 * r + 2] = static_cast<int32_t>(run.pos0);
    h[x.runs + 4 * r + 3] = static_cast<int32_t>(next - x.tables);
    if (kv != nullptr) {
      const auto& table = kv->tables[static_cast<size_t>(run.seq)];
      const int64_t need = (run.pos0 + run.n + kv->layout.block_size - 1) / kv->layout.block_size;
      for (int64_t j = 0; j < need; ++j) {
        const int32_t b = table[static_cast<size_t>(j)];
        METRO_CHECK_MSG(b >= 0 && b < kv->n_blocks, "a block id outside the KV arena");
        h[next++] = b;
      }
    }
  }
  x.end = next;
  METRO_CHECK(x.end <= max_index_ints(spec));
  bool all_in_runs = true;
  for (size_t t = 0; t < n; ++t) all_in_runs = all_in_runs && h[x.tok_run + t] >= 0;
  if (kv != nullptr) {
    for (size_t t = 0; t < n; ++t) {
      const int32_t s = step.seq[t];
      METRO_CHECK_MSG(s >= 0 && static_cast<size_t>(s) < kv->tables.size(), "a token's sequence slot has no table");
      const auto& table = kv->tables[static_cast<size_t>(s)];
      const size_t j = static_cast<size_t>(step.pos[t] / kv->layout.block_size);
      METRO_CHECK_MSG(j < table.size(), "a token's position is past its block table");
      METRO_CHECK_MSG(table[j] >= 0 && table[j] < kv->n_blocks, "a block id outside the KV arena");
      h[x.kv_block + t] = table[j];
    }
  }
  auto* rope = reinterpret_cast<double*>(index);
  for (const Op& op : ops) {
    if (const auto* e = std::get_if<EmbedOp>(&op)) {
      for (size_t t = 0; t < n; ++t) {
        METRO_CHECK_MSG(step.token[t] >= 0 && step.token[t] < e->table->n_rows(), "a token id outside the table");
      }
    } else if (const auto* a = std::get_if<RopeAnglesOp>(&op)) {
      METRO_CHECK_MSG(x.n_ropes < kMaxRopesPerStep, "more RoPE angle ops in one step than the CUDA state holds");
      const auto& f = a->rope->inv_freq();
      METRO_CHECK(f.size() <= static_cast<size_t>(kHalfRot));
      std::copy(f.begin(), f.end(), rope + static_cast<size_t>(x.n_ropes) * kHalfRot);
      ++x.n_ropes;
    } else if (std::holds_alternative<AttentionOp>(op)) {
      METRO_CHECK_MSG(all_in_runs, "attention needs every token in a sequence run");
    }
  }
  return x;
}

KvDev kv_dev(const KvView& kv) {
  const kernels::KvPageLayout& l = kv.layout;
  METRO_CHECK_MSG(l.type == DType::kF16 || l.type == DType::kQ8_0, "KV pages must be F16 or Q8_0");
  METRO_CHECK_MSG(l.head_dim > 0 && l.head_dim <= 256 && l.head_dim % 8 == 0 &&
                      (l.type != DType::kQ8_0 || l.head_dim % 32 == 0),
                  "KV layout: head_dim must be a multiple of 8 (32 for Q8_0) and at most 256");
  METRO_CHECK(l.block_size > 0 && l.n_head_kv > 0);
  KvDev d;
  d.arena = kv.arena;
  d.block_bytes = static_cast<int64_t>(kv.block_bytes());
  d.page_bytes = static_cast<int64_t>(kv.page_bytes());
  d.head_bytes = static_cast<int64_t>(l.head_bytes());
  d.row_bytes = static_cast<int64_t>(l.row_bytes());
  d.block_size = l.block_size;
  d.n_head_kv = l.n_head_kv;
  d.head_dim = l.head_dim;
  d.q8 = l.type == DType::kQ8_0;
  d.n_blocks = kv.n_blocks;
  return d;
}

class Launcher {
 public:
  Launcher(CudaState& st, const StepDesc& step, const StepIndex& x, cudaStream_t s)
      : st_(st), s_(s), n_(static_cast<int>(step.token.size())),
        n_logits_(static_cast<int>(step.logit_rows.size())) {
    const auto* base = reinterpret_cast<const int32_t*>(st.index_dev.as<uint8_t>() + kRopeBytes);
    token_ = base + x.token;
    pos_ = base + x.pos;
    kv_block_ = base + x.kv_block;
    logit_rows_ = base + x.logit_rows;
    runs_.runs = base + x.runs;
    runs_.tables = base + x.tables;
    runs_.tok_run = base + x.tok_run;
    rope_ = st.index_dev.as<double>();
    if (step.kv != nullptr) kv_ = kv_dev(*step.kv);
  }

  void operator()(const EmbedOp& o) {
    const CudaMatrix& m = cuda_matrix(o.table);
    launch_embed(s_, m.type(), m.mem.as<uint8_t>(), m.row_bytes, m.n_cols(), m.n_rows(), token_, n_, o.scale,
                 st_.act(o.dst), st_.cols(o.dst));
  }
  void operator()(const RopeAnglesOp& o) {
    launch_rope_angles(s_, rope_ + static_cast<size_t>(ropes_++) * kHalfRot, o.rope->config().n_rot / 2,
                       o.rope->mscale(), pos_, n_,
                       st_.act(o.dst), st_.cols(o.dst));
  }
  void operator()(const RmsNormOp& o) {
    const bool logits = o.rows == RowSet::kLogits;
    launch_rms_norm(s_, st_.act(o.src), st_.cols(o.src), logits ? logit_rows_ : nullptr, logits ? n_logits_ : n_,
                    cuda_vector(o.weight), st_.act(o.dst), st_.cols(o.dst), st_.cols(o.src), o.eps);
  }
  void operator()(const HeadNormOp& o) {
    // The heads of a token row are contiguous: the rows of a [tokens * n_head][head_dim]
    // matrix, normed in place.
    const int64_t hd = st_.cols(o.x) / o.n_head;
    launch_rms_norm(s_, st_.act(o.x), hd, nullptr, n_ * o.n_head, cuda_vector(o.weight), st_.act(o.x), hd, hd, o.eps);
  }
  void operator()(const ProjectOp& p) {
    const int rows = p.rows == RowSet::kTokens ? n_ : n_logits_;
    const float* src = st_.act(p.src);
    const int64_t k = st_.cols(p.src);
    DType done[3];
    int n_done = 0;
    for (int a = 0; a < p.n_out; ++a) {
      const DType partner = kernels::traits(p.w[static_cast<size_t>(a)]->type()).dot_partner;
      if (std::find(done, done + n_done, partner) != done + n_done) continue;
      done[n_done++] = partner;
      const void* x = src;
      int64_t ld_x = k;
      if (partner != DType::kF32) {
        METRO_CHECK(k % act_block_elems(partner) == 0);
        ld_x = act_row_bytes(partner, k);
        METRO_CHECK_MSG(static_cast<size_t>(ld_x) * static_cast<size_t>(rows) <= st_.qa_bytes,
                        "a product wider than the state's quantized-activation buffer");
        launch_quantize_acts(s_, partner, src, k, rows, k, st_.qa.as<uint8_t>());
        x = st_.qa.get();
      }
      for (int o = 0; o < p.n_out; ++o) {
        const CudaMatrix& w = cuda_matrix(p.w[static_cast<size_t>(o)]);
        if (kernels::traits(w.type()).dot_partner != partner) continue;
        const ActId dst = p.dst[static_cast<size_t>(o)];
        launch_matmul(s_, w.type(), w.mem.as<uint8_t>(), w.row_bytes, w.n_rows(), k, x, ld_x, rows, st_.act(dst),
                      st_.cols(dst));
      }
    }
  }
  void operator()(const AddBiasOp& o) { launch_add_bias(s_, st_.act(o.x), cuda_vector(o.bias), n_, st_.cols(o.x)); }
  void operator()(const RopeOp& o) {
    const kernels::RopeConfig& rc = o.rope->config();
    launch_rope(s_, st_.act(o.x), st_.cols(o.x), st_.act(o.angles), st_.cols(o.angles), n_, o.n_head, rc.head_dim,
                rc.n_rot, rc.mode == kernels::RopeMode::kNeox);
  }
  void operator()(const KvStoreOp& o) {
    launch_kv_store(s_, kv_, o.layer, st_.act(o.k), st_.act(o.v), st_.cols(o.k), pos_, kv_block_, n_);
  }
  void operator()(const AttentionOp& o) {
    METRO_CHECK_MSG(o.n_head > 0 && o.n_head % kv_.n_head_kv == 0, "attention: n_head must be a multiple of n_head_kv");
    launch_attention(s_, kv_, o.layer, runs_, st_.act(o.q), st_.cols(o.q), st_.act(o.out), st_.cols(o.out), n_,
                     o.n_head, o.scale, st_.attn_scratch.as<float>());
  }
  void operator()(const AddOp& o) {
    // Models with scaled sublayer outputs are refused on this backend when they load.
    METRO_CHECK_MSG(o.scale == 1.0f, "a scaled add runs on the CPU backend only");
    launch_add(s_, st_.act(o.a), st_.act(o.b), st_.act(o.dst), int64_t{n_} * st_.cols(o.dst));
  }
  void operator()(const SwigluOp& o) {
    launch_swiglu(s_, st_.act(o.gate), st_.act(o.up), st_.act(o.dst), int64_t{n_} * st_.cols(o.dst), o.gelu);
  }
  // Encoder models are refused on this backend when they load (Model::from_file).
  void operator()(const PosEmbedOp&) { METRO_CHECK_MSG(false, "encoder ops run on the CPU backend only"); }
  void operator()(const LayerNormOp&) { METRO_CHECK_MSG(false, "encoder ops run on the CPU backend only"); }
  void operator()(const GeluOp&) { METRO_CHECK_MSG(false, "encoder ops run on the CPU backend only"); }
  void operator()(const EncoderAttentionOp&) { METRO_CHECK_MSG(false, "encoder ops run on the CPU backend only"); }
  // Mixture-of-experts models are refused on this backend when they load.
  void operator()(const MoeOp&) { METRO_CHECK_MSG(false, "mixture-of-experts ops run on the CPU backend only"); }
  void operator()(const GatedAddOp&) { METRO_CHECK_MSG(false, "mixture-of-experts ops run on the CPU backend only"); }
  // Run-time LoRA adapters are refused on this backend when a model loads them.
  void operator()(const LoraOp&) { METRO_CHECK_MSG(false, "LoRA ops run on the CPU backend only"); }
  // A group of one adds nothing. Larger groups sum through host memory: the rows go to the
  // buffer's pinned mirror, the communicator adds the ranks' rows there, and they come
  // back (correct, not fast: a device all-reduce is future work).
  void operator()(const AllReduceOp& o) {
    if (o.comm->size() == 1) return;
    const size_t count = static_cast<size_t>(n_) * static_cast<size_t>(st_.cols(o.x));
    if (count == 0) return;
    float* host = st_.mirrors[static_cast<size_t>(o.x)].as<float>();
    METRO_CUDA_OK(cudaMemcpyAsync(host, st_.act(o.x), count * sizeof(float), cudaMemcpyDeviceToHost, s_));
    METRO_CUDA_OK(cudaStreamSynchronize(s_));
    o.comm->all_reduce_sum({host, count});
    METRO_CUDA_OK(cudaMemcpyAsync(st_.act(o.x), host, count * sizeof(float), cudaMemcpyHostToDevice, s_));
  }

 private:
  CudaState& st_;
  cudaStream_t s_;
  const int n_, n_logits_;
  const int32_t* token_ = nullptr;
  const int32_t* pos_ = nullptr;
  const int32_t* kv_block_ = nullptr;
  const int32_t* logit_rows_ = nullptr;
  const double* rope_ = nullptr;
  RunsDev runs_;
  KvDev kv_;
  int ropes_ = 0;
};

// Writes what launching a step bakes into its kernels' launches (besides the state's own
// buffers, fixed per state): each op's kind and operands, with weights and vectors by their
// device address and geometry, and the step's token, logits-row and run counts and KV
// arena. Two steps with equal keys enqueue the same launches (cuda_graphs.cuh).
class KeyWriter {
 public:
  explicit KeyWriter(std::vector<uint64_t>& k) : k_(k) {}

  void step(const StepDesc& step) {
    put(step.token.size());
    put(step.logit_rows.size());
    put(step.runs.size());
    put(step.kv != nullptr);
    if (step.kv == nullptr) return;
    const KvDev d = kv_dev(*step.kv);
    put(reinterpret_cast<uintptr_t>(d.arena));
    put(d.block_bytes);
    put(d.page_bytes);
    put(d.head_bytes);
    put(d.row_bytes);
    put(d.block_size);
    put(d.n_head_kv);
    put(d.head_dim);
    put(d.q8);
    put(d.n_blocks);
  }
  void op(const Op& op) {
    put(op.index());
    std::visit(*this, op);
  }

  void operator()(const EmbedOp& o) {
    matrix(o.table);
    act(o.dst);
    real(o.scale);
  }
  void operator()(const RopeAnglesOp& o) {
    rope(o.rope);
    act(o.dst);
  }
  void operator()(const RmsNormOp& o) {
    act(o.src);
    act(o.dst);
    vec(o.weight);
    real(o.eps);
    put(static_cast<uint64_t>(o.rows));
  }
  void operator()(const HeadNormOp& o) {
    act(o.x);
    vec(o.weight);
    put(static_cast<uint64_t>(o.n_head));
    real(o.eps);
  }
  void operator()(const ProjectOp& o) {
    act(o.src);
    put(static_cast<uint64_t>(o.rows));
    put(static_cast<uint64_t>(o.n_out));
    for (size_t i = 0; i < static_cast<size_t>(o.n_out); ++i) {
      matrix(o.w[i]);
      act(o.dst[i]);
    }
  }
  void operator()(const AddBiasOp& o) {
    act(o.x);
    vec(o.bias);
  }
  void operator()(const RopeOp& o) {
    rope(o.rope);
    act(o.x);
    act(o.angles);
    put(static_cast<uint64_t>(o.n_head));
  }
  void operator()(const KvStoreOp& o) {
    act(o.k);
    act(o.v);
    put(static_cast<uint64_t>(o.layer));
  }
  void operator()(const AttentionOp& o) {
    act(o.q);
    act(o.out);
    real(o.scale);
    put(static_cast<uint64_t>(o.layer));
    put(static_cast<uint64_t>(o.n_head));
    put(static_cast<uint64_t>(o.window));
  }
  void operator()(const AddOp& o) {
    act(o.a);
    act(o.b);
    act(o.dst);
  }
  void operator()(const SwigluOp& o) {
    act(o.gate);
    act(o.up);
    act(o.dst);
    put(static_cast<uint64_t>(o.gelu));
  }
  void operator()(const AllReduceOp& o) {
    act(o.x);
    put(static_cast<uint64_t>(o.comm->size()));
  }
  void operator()(const PosEmbedOp& o) { act(o.x); }
  void operator()(const LayerNormOp& o) {
    act(o.src);
    act(o.dst);
  }
  void operator()(const GeluOp& o) { act(o.x); }
  void operator()(const EncoderAttentionOp& o) {
    act(o.q);
    act(o.out);
  }
  void operator()(const MoeOp& o) {
    act(o.src);
    act(o.dst);
  }
  void operator()(const GatedAddOp& o) {
    act(o.x);
    act(o.y);
  }
  void operator()(const LoraOp& o) { act(o.src); }

 private:
  template <class T>
  void put(T v) {
    k_.push_back(static_cast<uint64_t>(v));
  }
  void act(ActId a) { put(static_cast<uint8_t>(a)); }
  void real(float f) {
    uint32_t u = 0;
    std::memcpy(&u, &f, sizeof(u));
    put(u);
  }
  void matrix(const DeviceMatrix* m) {
    const CudaMatrix& c = cuda_matrix(m);
    put(reinterpret_cast<uintptr_t>(c.mem.get()));
    put(static_cast<uint64_t>(c.type()));
    put(c.row_bytes);
    put(c.n_rows());
    put(c.n_cols());
  }
  void vec(const DeviceVector* v) {
    put(reinterpret_cast<uintptr_t>(cuda_vector(v)));
    put(v->size());
  }
  void rope(const kernels::Rope* r) {
    const kernels::RopeConfig& c = r->config();
    put(c.n_rot);
    put(c.head_dim);
    put(c.mode == kernels::RopeMode::kNeox);
  }

  std::vector<uint64_t>& k_;
};

// Whether a step may run as a graph: nothing in it waits for the host.
bool capturable(std::span<const Op> ops) {
  for (const Op& op : ops) {
    if (const auto* a = std::get_if<AllReduceOp>(&op); a != nullptr && a->comm->size() > 1) return false;
  }
  return true;
}

// Enqueues the step as a graph when its key has recurred (capturing it the second time it
// is seen); false when the caller must launch it plainly (a new key, a failed capture).
// The step's index copy is enqueued before, outside the graph.
bool launch_as_graph(std::span<const Op> ops, const StepDesc& step, const StepIndex& x, CudaState& st,
                     cudaStream_t s) {
  GraphCache& cache = st.graphs;
  KeyWriter key(cache.start_key());
  key.step(step);
  for (const Op& op : ops) key.op(op);
  GraphCache::Entry& e = cache.lookup();
  if (e.exec == nullptr) {
    if (e.failed || e.seen < GraphCache::kCaptureAfter) return false;
    // Capture mode ThreadLocal: only this thread's calls are restricted while it captures,
    // so other threads (other devices, tensor-parallel ranks) are not disturbed. The
    // launches below only enqueue kernels: no synchronisation, allocation or host copy.
    cudaError_t err = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (err == cudaSuccess) {
      Launcher launch(st, step, x, s);
      for (const Op& op : ops) std::visit(launch, op);
      err = cudaStreamEndCapture(s, &graph);
    }
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the error so the plain launches' checks pass
      e.failed = true;
      if (!cache.reported_failure) {
        std::fprintf(stderr, "metro: CUDA graph capture failed (%s); launching such steps op by op\n",
                     cudaGetErrorName(err));
        cache.reported_failure = true;
      }
      return false;
    }
    e.exec = exec;
    cache.count_capture();
  }
  METRO_CUDA_OK(cudaGraphLaunch(e.exec, s));
  cache.count_launch();
  return true;
}

}  // namespace

GraphCache::~GraphCache() {
  for (Entry& e : entries_) {
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  }
}

GraphCache::Entry& GraphCache::lookup() {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the key's words
  for (uint64_t w : key_) h = (h ^ w) * 1099511628211ull;
  ++clock_;
  for (Entry& e : entries_) {
    if (e.hash == h && e.key == key_) {
      ++e.seen;
      e.last_use = clock_;
      return e;
    }
  }
  Entry* slot = nullptr;
  if (entries_.size() < kMaxEntries) {
    slot = &entries_.emplace_back();
  } else {
    slot = &*std::min_element(entries_.begin(), entries_.end(),
                              [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
    // The stream may still run a launch of the dropped graph: destroying an executable
    // graph while it runs is allowed (its resources are released when the launch ends).
    if (slot->exec != nullptr) METRO_CUDA_OK(cudaGraphExecDestroy(slot->exec));
    *slot = Entry();
  }
  slot->key = key_;
  slot->hash = h;
  slot->seen = 1;
  slot->last_use = clock_;
  return *slot;
}

size_t index_bytes(const StateSpec& spec) { return kRopeBytes + align8(max_index_ints(spec) * sizeof(int32_t)); }

void CudaBackend::execute(std::span<const Op> ops, const StepDesc& step, ExecState& state, ThreadPool& pool,
                          StepObserver* observer) {
  (void)pool;  // the host only enqueues
  auto* st = dynamic_cast<CudaState*>(&state);
  METRO_CHECK_MSG(st != nullptr, "the CUDA backend runs on states it made");
  METRO_CHECK_MSG(st->ctx->device == ctx_->device, "a CUDA state of another device");
  validate_step(ops, step, st->spec());
  ctx_->use();
  const cudaStream_t s = ctx_->stream;

  // The previous step's index copy must have left the pinned buffer before it is refilled.
  METRO_CUDA_OK(cudaEventSynchronize(st->index_sent));
  const StepIndex x = fill_index(ops, step, st->spec(), st->index_host.as<uint8_t>());
  // One contiguous copy: the rope slots (when the step has RoPE) and the int32 arrays.
  const size_t from = x.n_ropes > 0 ? 0 : kRopeBytes;
  const size_t to = kRopeBytes + x.end * sizeof(int32_t);
  if (to > from) {
    METRO_CUDA_OK(cudaMemcpyAsync(st->index_dev.as<uint8_t>() + from, st->index_host.as<uint8_t>() + from, to - from,
                                  cudaMemcpyHostToDevice, s));
  }
  METRO_CUDA_OK(cudaEventRecord(st->index_sent, s));

  if (ctx_->graphs && observer == nullptr && !ctx_->sync_each_op && capturable(ops) &&
      launch_as_graph(ops, step, x, *st, s)) {
    return;
  }

  // An observed step is timed on the device: an event before the first op and after each,
  // read once the step is done (so an observed execute returns when the device has run it).
  if (observer != nullptr) {
    while (st->op_events.size() < ops.size() + 1) {
      cudaEvent_t e;
      METRO_CUDA_OK(cudaEventCreate(&e));
      st->op_events.push_back(e);
    }
    METRO_CUDA_OK(cudaEventRecord(st->op_events[0], s));
  }
  Launcher launch(*st, step, x, s);
  for (size_t i = 0; i < ops.size(); ++i) {
    std::visit(launch, ops[i]);
    if (observer != nullptr) METRO_CUDA_OK(cudaEventRecord(st->op_events[i + 1], s));
    if (ctx_->sync_each_op) {
      const cudaError_t err = cudaStreamSynchronize(s);
      if (err != cudaSuccess) {
        std::fprintf(stderr, "metro: CUDA op %zu (%s) failed\n", i, std::string(op_name(kind_of(ops[i]))).c_str());
        cuda_failed("cudaStreamSynchronize", err, __FILE__, __LINE__);
      }
    }
  }
  if (observer != nullptr) {
    METRO_CUDA_OK(cudaEventSynchronize(st->op_events[ops.size()]));
    for (size_t i = 0; i < ops.size(); ++i) {
      float ms = 0.0f;
      METRO_CUDA_OK(cudaEventElapsedTime(&ms, st->op_events[i], st->op_events[i + 1]));
      observer->op_timed(i, kind_of(ops[i]), static_cast<int64_t>(static_cast<double>(ms) * 1e6));
    }
  }
}

}  // namespace metro::backends::cuda
