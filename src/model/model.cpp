#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backends/registry.h"
#include "base/check.h"
#include "base/log.h"
#include "kernels/ops.h"

namespace metro::model {

namespace {

using backends::ActId;
using backends::RowSet;
using kernels::DType;

// The model's activation buffers (row-major, one row per token or logits row).
constexpr ActId kX{0};       // [tokens][n_embd] the residual stream
constexpr ActId kXb{1};      // [tokens][n_embd] its norm, the input of a layer's products
constexpr ActId kQ{2};       // [tokens][n_q]
constexpr ActId kK{3};       // [tokens][n_kv]
constexpr ActId kV{4};       // [tokens][n_kv]
constexpr ActId kAtt{5};     // [tokens][n_q] attention output
constexpr ActId kTmp{6};     // [tokens][n_embd] a projection back to the stream
constexpr ActId kGate{7};    // [tokens][n_ff]
constexpr ActId kUp{8};      // [tokens][n_ff]
constexpr ActId kRopeCs{9};  // [tokens][n_rot] cos then sin of each token's angles
constexpr ActId kHidden{10};  // [tokens][n_embd] final normed states, on request
constexpr ActId kXl{11};      // [logits][n_embd] normed rows of the tokens that want logits
constexpr ActId kLogits{12};  // [logits][n_vocab]
constexpr ActId kRopeCsLocal{13};  // [tokens][n_rot] the sliding-window layers' angles
// Mixture of experts: router scores, and each token's n_used expert slots of the experts'
// input, gate, up and output rows; the shared expert's output.
constexpr ActId kRouter{14};   // [tokens][n_expert]
constexpr ActId kMoeIn{15};    // [tokens][n_used * n_embd]
constexpr ActId kMoeGate{16};  // [tokens][n_used * n_ff_exp]
constexpr ActId kMoeUp{17};    // [tokens][n_used * n_ff_exp]
constexpr ActId kMoeOut{18};   // [tokens][n_used * n_embd]
constexpr ActId kShared{19};   // [tokens][n_embd]
// Run-time LoRA scratch (LoraOp), of token rows and of logits rows.
constexpr ActId kLoraIn{20}, kLoraMid{21}, kLoraOut{22};
constexpr ActId kLoraInL{23}, kLoraMidL{24}, kLoraOutL{25};
constexpr int kNumActs = 26;

// Ops one layer adds at most: attention with 3 biases, 2 head norms, a post norm and an
// all-reduce (14 with the next layer's norm), a routed FFN with a shared expert (11), and
// a LoraOp after each of 4 projects.
constexpr int kMaxOpsPerLayer = 30;
// Before the layers: two sets of angles, embedding, norm; after them the head's norm,
// product and LoraOp.
constexpr int kMaxOpsOutsideLayers = 7;

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

backends::ProjectOp project(ActId src, RowSet rows, std::initializer_list<const backends::DeviceMatrix*> w,
                            std::initializer_list<ActId> dst) {
  backends::ProjectOp p{src, rows, static_cast<int>(w.size()), {}, {}};
  std::copy(w.begin(), w.end(), p.w.begin());
  std::copy(dst.begin(), dst.end(), p.dst.begin());
  return p;
}

}  // namespace

Model::Model(gguf::File file, HParams hp, ModelWeights w, std::shared_ptr<backends::Backend> backend,
             std::shared_ptr<dist::Communicator> comm)
    : file_(std::move(file)),
      hp_(std::move(hp)),
      w_(std::move(w)),
      backend_(std::move(backend)),
      comm_(std::move(comm)) {
  // llama3 factors when the file has them, else LongRoPE's short ones (or none).
  const float* factors = !w_.rope_freqs.empty() ? w_.rope_freqs.data() : w_.rope_short.empty() ? nullptr : w_.rope_short.data();
  rope_ = std::make_unique<kernels::Rope>(rope_config(hp_, factors));
  if (hp_.has_longrope && w_.rope_freqs.empty()) {
    rope_long_ = std::make_unique<kernels::Rope>(rope_config(hp_, w_.rope_long.data()));
  }
  if (hp_.swa_pattern > 0) rope_local_ = std::make_unique<kernels::Rope>(local_rope_config(hp_));
  release_window_ = uniform_window();
}

uint32_t Model::max_context() const {
  if (hp_.sliding_window > 0 && !backend_->windowed_attention()) return std::min(hp_.sliding_window, hp_.n_ctx_train);
  return hp_.n_ctx_train;
}

uint32_t Model::uniform_window() const {
  if (hp_.sliding_window == 0 || !backend_->windowed_attention() || w_.layers.empty()) return 0;
  for (const LayerWeights& L : w_.layers) {
    if (hp_.layer_window(static_cast<uint32_t>(L.model_layer)) == 0) return 0;
  }
  return hp_.sliding_window;
}

namespace {

// The byte ranges (offset, length) of the experts' tensors of the file at `path`, which a
// model under a MemBudget copies into its cold store: mapped while it loads, not read.
Expected<std::vector<std::pair<size_t, size_t>>> expert_ranges(const std::string& path) {
  METRO_ASSIGN_OR_RETURN(gguf::File peek, gguf::File::open(path));
  std::vector<std::pair<size_t, size_t>> out;
  for (const gguf::TensorInfo& t : peek.tensors()) {
    if (t.name.ends_with("_exps.weight")) {
      out.emplace_back(static_cast<size_t>(t.data - peek.bytes().data()), static_cast<size_t>(t.n_bytes));
    }
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& opts) {
  const bool budget = opts.mem_budget.bytes > 0;
  if (budget && !opts.lora.empty()) {
    return invalid_argument("a memory budget and LoRA adapters merged at load cannot be combined");
  }
  MappedFile::ReadOptions read = opts.read;
  if (budget) {
    METRO_ASSIGN_OR_RETURN(read.map_ranges, expert_ranges(path));
  }
  // A copy, not a map: a map would stay backed by the file (base/mapped_file.h).
  METRO_ASSIGN_OR_RETURN(gguf::File f, gguf::File::load(path, read));
  const FileStamp stamp = *f.stamp();
  if (!opts.lora.empty()) {
    METRO_ASSIGN_OR_RETURN(std::vector<uint8_t> merged, merge_lora(f, opts.lora));
    METRO_ASSIGN_OR_RETURN(f, gguf::File::copy_of(merged));
  }
  METRO_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, from_file(std::move(f), opts));
  // The experts' file pages were mapped to be copied; nothing reads them again.
  if (budget) m->give_back_unread_file_bytes();
  if (opts.watch_period.count() > 0) {
    const size_t slash = path.find_last_of('/');
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    m->watch_ = std::make_unique<FileWatch>(path, stamp, opts.watch_period, [name](const std::string& what) {
      METRO_LOG_WARN("model file '%s' changed on disk (%s); still serving the copy loaded at start",
                     name.c_str(), what.c_str());
    });
  }
  return m;
}

Expected<std::unique_ptr<Model>> Model::from_file(gguf::File file, const ModelOptions& opts) {
  METRO_ASSIGN_OR_RETURN(HParams hp, HParams::from_gguf(file));
  std::shared_ptr<backends::Backend> backend = opts.backend ? opts.backend : backends::default_backend();
  if (hp.encoder && !backend->name().starts_with("cpu")) {
    return unimplemented("encoder models (" + hp.architecture + ") run on the CPU backend only, not on " +
                         std::string(backend->name()));
  }
  if (hp.is_moe() && !backend->name().starts_with("cpu")) {
    return unimplemented("mixture-of-experts models run on the CPU backend only, not on " + std::string(backend->name()));
  }
  if (hp.residual_scale != 1.0f && !backend->scaled_add()) {
    return unimplemented("scaled sublayer outputs (" + hp.architecture + ") are not implemented on the " +
                         std::string(backend->name()) + " backend");
  }
  if (hp.attn_softcap > 0.0f && !backend->attention_soft_capping()) {
    return unimplemented("attention soft-capping (" + hp.architecture + ") is not implemented on the " +
                         std::string(backend->name()) + " backend");
  }
  if (hp.qk_norm_full && opts.shard.tp_size > 1) {
    return unimplemented("tensor-parallel slicing of " + hp.architecture +
                         " (its query and key norms span every head)");
  }
  if (!opts.adapters.empty() && !backend->name().starts_with("cpu")) {
    return unimplemented("run-time LoRA adapters run on the CPU backend only, not on " + std::string(backend->name()));
  }
  std::shared_ptr<dist::Communicator> comm = opts.comm;
  if (opts.shard.tp_size > 1) {
    if (!comm || comm->size() != opts.shard.tp_size || comm->rank() != opts.shard.tp_rank) {
      return invalid_argument("a tensor-parallel shard (rank " + std::to_string(opts.shard.tp_rank) + " of " +
                              std::to_string(opts.shard.tp_size) + ") needs a communicator of that rank and size");
    }
  }
  std::shared_ptr<ColdStore> cold;
  if (opts.mem_budget.bytes > 0) {
    if (!backend->host_memory_complete()) {
      return unimplemented("a memory budget (--mem-budget) is kept on the CPU backend only, not on " +
                           std::string(backend->name()));
    }
    METRO_ASSIGN_OR_RETURN(cold, ColdStore::create(opts.mem_budget.store));
  }
  METRO_ASSIGN_OR_RETURN(ModelWeights w, ModelWeights::bind(file, hp, opts.shard, *backend, opts.allow_repack, cold));
  std::unique_ptr<Model> m(new Model(std::move(file), std::move(hp), std::move(w), std::move(backend), std::move(comm)));
  if (cold && cold->stats().entries > 0) m->cold_ = std::move(cold);  // else nothing went cold
  if (opts.mem_budget.bytes > 0) METRO_RETURN_IF_ERROR(m->apply_budget(opts.mem_budget));
  if (!opts.adapters.empty()) METRO_RETURN_IF_ERROR(m->load_adapters(opts.adapters));
  return m;
}

// Each adapter's factors onto the backend (A as it is, B times the adapter's scale), and a
// LoraSet per adapted matrix. A matrix of a layer this shard does not hold is skipped.
Status Model::load_adapters(const std::vector<LoraSpec>& adapters) {
  if (hp_.encoder) return unimplemented("LoRA adapters on an encoder");
  if (shard().sliced()) return unimplemented("run-time LoRA adapters on a tensor-parallel shard");
  if (adapters.size() > 4096) return invalid_argument("more than 4096 LoRA adapters");
  // The matrices a LoraOp follows, by the file's tensor name: attention and FFN products and
  // a separate head. A fused tensor (phi3's attn_qkv, its gate-and-up ffn_up) adapts each
  // matrix bound from its rows with those rows of B.
  struct Piece {
    std::string name;
    const backends::DeviceMatrix* w;
    int64_t row0;  // the matrix's first row in the tensor
  };
  std::vector<Piece> targets;
  if (!hp_.tied_output && w_.output) targets.push_back({"output.weight", w_.output.get(), 0});
  for (const LayerWeights& L : w_.layers) {
    const std::string p = "blk." + std::to_string(L.model_layer) + ".";
    if (hp_.fused_qkv) {
      targets.push_back({p + "attn_qkv.weight", L.wq.get(), 0});
      targets.push_back({p + "attn_qkv.weight", L.wk.get(), L.wq->n_rows()});
      targets.push_back({p + "attn_qkv.weight", L.wv.get(), L.wq->n_rows() + L.wk->n_rows()});
    } else {
      targets.push_back({p + "attn_q.weight", L.wq.get(), 0});
      targets.push_back({p + "attn_k.weight", L.wk.get(), 0});
      targets.push_back({p + "attn_v.weight", L.wv.get(), 0});
    }
    targets.push_back({p + "attn_output.weight", L.wo.get(), 0});
    if (hp_.is_moe()) continue;
    if (hp_.fused_gate_up) {
      targets.push_back({p + "ffn_up.weight", L.w_gate.get(), 0});
      targets.push_back({p + "ffn_up.weight", L.w_up.get(), L.w_gate->n_rows()});
    } else {
      targets.push_back({p + "ffn_gate.weight", L.w_gate.get(), 0});
      targets.push_back({p + "ffn_up.weight", L.w_up.get(), 0});
    }
    targets.push_back({p + "ffn_down.weight", L.w_down.get(), 0});
  }
  const std::vector<int> held = shard().layers();
  n_adapters_ = static_cast<int>(adapters.size());
  for (size_t i = 0; i < adapters.size(); ++i) {
    const LoraSpec& spec = adapters[i];
    auto f = gguf::File::load(spec.path);
    if (!f.ok()) return Status(f.status().code(), "LoRA adapter '" + spec.path + "': " + f.status().message());
    METRO_ASSIGN_OR_RETURN(auto deltas, read_lora(file_, *f, spec));
    for (auto& entry : deltas) {
      const std::string& name = entry.first;  // a plain reference: lambdas may capture it
      LoraDelta& d = entry.second;
      const bool targeted = std::any_of(targets.begin(), targets.end(), [&](const Piece& x) { return x.name == name; });
      if (!targeted) {
        int layer = -1;
        if (name.starts_with("blk.")) layer = std::atoi(name.c_str() + 4);
        if (layer >= 0 && std::find(held.begin(), held.end(), layer) == held.end()) continue;  // another shard's
        if (name == "output.weight" && !shard().ends_model) continue;
        return unimplemented("LoRA adapter '" + spec.path + "' adapts '" + name +
                             "': at run time adapters apply to attention and FFN matrices and a separate output "
                             "head only (not to experts or embeddings)");
      }
      for (float& v : d.b) v *= d.s;
      // The backend may read these bytes in place: the model keeps them.
      lora_host_.push_back(std::move(d.a));
      const std::vector<float>& a_vals = lora_host_.back();
      const int64_t n_in = static_cast<int64_t>(a_vals.size()) / d.rank;
      backends::HostMatrix a{kernels::DType::kF32, d.rank, n_in, reinterpret_cast<const uint8_t*>(a_vals.data()),
                             static_cast<size_t>(n_in) * sizeof(float)};
      lora_factors_.push_back(backend_->upload_matrix(a, backends::MatrixUse::kProduct, false));
      const backends::DeviceMatrix* a_dev = lora_factors_.back().get();
      const std::vector<float> b_all = std::move(d.b);
      for (const Piece& piece : targets) {
        if (piece.name != name) continue;
        const backends::DeviceMatrix* w = piece.w;
        const int64_t n_out = w->n_rows();
        // This matrix's rows of B.
        lora_host_.emplace_back(b_all.begin() + piece.row0 * d.rank, b_all.begin() + (piece.row0 + n_out) * d.rank);
        backends::HostMatrix b{kernels::DType::kF32, n_out, d.rank, reinterpret_cast<const uint8_t*>(lora_host_.back().data()),
                               static_cast<size_t>(d.rank) * sizeof(float)};
        lora_factors_.push_back(backend_->upload_matrix(b, backends::MatrixUse::kProduct, false));
        std::unique_ptr<backends::LoraSet>& set = lora_sets_[w];
        if (!set) {
          set = std::make_unique<backends::LoraSet>();
          set->a.assign(adapters.size(), nullptr);
          set->b.assign(adapters.size(), nullptr);
        }
        set->a[i] = a_dev;
        set->b[i] = lora_factors_.back().get();
        if (w == w_.output.get()) lora_head_ = true;
      }
      lora_max_rank_ = std::max(lora_max_rank_, static_cast<int>(d.rank));
    }
  }
  return {};
}

const backends::LoraSet* Model::lora_set(const backends::DeviceMatrix* w) const {
  auto it = lora_sets_.find(w);
  return it == lora_sets_.end() ? nullptr : it->second.get();
}

kernels::KvPageLayout Model::kv_layout(kernels::DType type, int block_size) const {
  kernels::KvPageLayout l;
  l.type = type;
  l.block_size = block_size;
  l.n_head_kv = shard().n_head_kv();
  l.head_dim = static_cast<int>(hp_.head_dim);
  return l;
}

Workspace Model::make_workspace(const WorkspaceLimits& lim) const {
  const ShardGeometry& g = shard();
  const int64_t n_embd = hp_.n_embd, hd = hp_.head_dim;
  const int64_t n_q = g.n_head() * hd, n_kv = g.n_head_kv() * hd, n_ff = g.n_ff();
  backends::StateSpec spec;
  spec.max_tokens = lim.max_tokens;
  spec.max_logits = lim.max_logits;
  spec.max_seqs = lim.max_seqs;
  spec.max_blocks_per_seq = lim.max_blocks_per_seq;
  spec.acts.resize(kNumActs);
  auto act = [&](ActId id, int64_t cols, RowSet rows = RowSet::kTokens) {
    spec.acts[static_cast<size_t>(id)] = {cols, rows};
  };
  act(kX, n_embd);
  act(kXb, n_embd);
  act(kQ, n_q);
  act(kK, n_kv);
  act(kV, n_kv);
  act(kAtt, n_q);
  act(kTmp, n_embd);
  // A routed model's kGate and kUp hold its shared expert's hidden values.
  const int64_t n_ff_dense = hp_.is_moe() ? hp_.n_ff_shexp : n_ff;
  act(kGate, n_ff_dense);
  act(kUp, n_ff_dense);
  if (hp_.is_moe()) {
    const int64_t k = hp_.n_expert_used;
    act(kRouter, hp_.n_expert);
    act(kMoeIn, k * n_embd);
    act(kMoeGate, k * n_ff);
    act(kMoeUp, k * n_ff);
    act(kMoeOut, k * n_embd);
    act(kShared, hp_.n_ff_shexp > 0 ? n_embd : 0);
  }
  act(kRopeCs, hp_.n_rot);
  act(kRopeCsLocal, rope_local_ ? hp_.n_rot : 0);
  act(kHidden, g.ends_model ? n_embd : 0);
  const bool head = g.ends_model && !hp_.encoder;
  act(kXl, head ? n_embd : 0, RowSet::kLogits);
  act(kLogits, head ? static_cast<int64_t>(hp_.n_vocab) : 0, RowSet::kLogits);
  if (n_adapters_ > 0) {
    act(kLoraIn, std::max({n_embd, n_q, n_ff}));
    act(kLoraMid, 3 * int64_t{lora_max_rank_});
    act(kLoraOut, std::max({n_q + 2 * n_kv, n_embd, 2 * n_ff}));
    if (lora_head_) {
      act(kLoraInL, n_embd, RowSet::kLogits);
      act(kLoraMidL, 3 * int64_t{lora_max_rank_}, RowSet::kLogits);
      act(kLoraOutL, hp_.n_vocab, RowSet::kLogits);
    } else {
      for (ActId id : {kLoraInL, kLoraMidL, kLoraOutL}) act(id, 0, RowSet::kLogits);
    }
  }
  // Per layer q, k, v, o, gate, up, down, and the router beside a shared expert's gate and up;
  // then the head. Experts' products count apart (StateSpec::max_experts).
  spec.max_products = 8 * g.n_layer() + 1;
  spec.product_types = w_.matmul_types();
  spec.widest_product_k = std::max({n_embd, n_q, n_ff, n_ff_dense});
  spec.max_experts = static_cast<int>(hp_.n_expert);
  spec.max_experts_used = static_cast<int>(hp_.n_expert_used);
  spec.max_adapters = n_adapters_;

  Workspace ws;
  ws.limits_ = lim;
  ws.state_ = backend_->make_state(spec);
  ws.ops.reserve(static_cast<size_t>(kMaxOpsOutsideLayers + kMaxOpsPerLayer * g.n_layer()));
  ws.runs.reserve(static_cast<size_t>(lim.max_seqs));
  ws.logit_rows.reserve(static_cast<size_t>(lim.max_logits));
  return ws;
}

Status Model::plan(const Batch& b, const KvView& kv, Workspace& ws) const {
  const WorkspaceLimits& lim = ws.limits_;
  const int n = b.size();
  if (!ws.state_) return invalid_argument("the workspace was not made by make_workspace");
  if (n == 0) return invalid_argument("empty batch");
  if (b.pos.size() != b.token.size() || b.seq.size() != b.token.size() ||
      b.logits.size() != b.token.size()) {
    return invalid_argument("batch arrays differ in length");
  }
  if (!b.adapter.empty()) {
    if (b.adapter.size() != b.token.size()) return invalid_argument("batch arrays differ in length");
    for (int16_t a : b.adapter) {
      if (a < 0 || a > n_adapters_) {
        return invalid_argument("LoRA adapter " + std::to_string(a) + " is not loaded (" + std::to_string(n_adapters_) +
                                " are)");
      }
    }
  }
  if (n > lim.max_tokens) {
    return resource_exhausted("batch of " + std::to_string(n) + " tokens exceeds the workspace (" +
                              std::to_string(lim.max_tokens) + ")");
  }
  if (kv.n_layer != kv_layers() || kv.layout.n_head_kv != shard().n_head_kv() ||
      kv.layout.head_dim != static_cast<int>(hp_.head_dim)) {
    return invalid_argument("KV view does not match the model shard's shape");
  }
  ws.runs.clear();
  ws.logit_rows.clear();
  const int bs = kv.layout.block_size;
  for (int i = 0; i < n; ++i) {
    if (b.token[static_cast<size_t>(i)] < 0 || b.token[static_cast<size_t>(i)] >= static_cast<int32_t>(hp_.n_vocab)) {
      return invalid_argument("token id " + std::to_string(b.token[static_cast<size_t>(i)]) +
                              " is outside the vocabulary");
    }
    const int s = b.seq[static_cast<size_t>(i)];
    const int64_t p = b.pos[static_cast<size_t>(i)];
    if (s < 0 || s >= static_cast<int>(kv.tables.size())) {
      return invalid_argument("sequence slot " + std::to_string(s) + " has no block table");
    }
    if (p < 0) return invalid_argument("negative position");
    if (b.logits[static_cast<size_t>(i)]) ws.logit_rows.push_back(i);
    if (!ws.runs.empty() && ws.runs.back().seq == s) {
      backends::SeqRun& r = ws.runs.back();
      if (p != r.pos0 + r.n) return invalid_argument("positions of a sequence must be consecutive");
      ++r.n;
      continue;
    }
    for (const auto& r : ws.runs) {
      if (r.seq == s) return invalid_argument("a sequence's tokens must be contiguous in a batch");
    }
    if (static_cast<int>(ws.runs.size()) == lim.max_seqs) {
      return resource_exhausted("too many sequences in one step");
    }
    ws.runs.push_back({s, i, 1, p});
  }
  if (static_cast<int>(ws.logit_rows.size()) > lim.max_logits) {
    return resource_exhausted(std::to_string(ws.logit_rows.size()) +
                              " tokens want logits; the workspace holds " +
                              std::to_string(lim.max_logits));
  }
  for (const auto& r : ws.runs) {
    const int need = ceil_div(r.pos0 + r.n, bs);
    const auto& table = kv.tables[static_cast<size_t>(r.seq)];
    if (static_cast<int>(table.size()) < need) {
      return out_of_range("sequence slot " + std::to_string(r.seq) + " needs " + std::to_string(need) +
                          " KV blocks, its table has " + std::to_string(table.size()));
    }
    if (need > lim.max_blocks_per_seq) return resource_exhausted("sequence longer than the workspace");
    // Blocks before the first key any layer reads may have been given back (kNoBlock) when
    // every layer is windowed (kv_release_window).
    const int first = release_window_ > 0 ? static_cast<int>(kernels::window_first_read(
                                                  r.pos0, release_window_, backend_->window_read_align()) / bs)
                                          : 0;
    for (int j = 0; j < need; ++j) {
      const int32_t blk = table[static_cast<size_t>(j)];
      if (j < first && blk == -1) continue;
      if (blk < 0 || blk >= kv.n_blocks) return out_of_range("block id outside the KV arena");
    }
  }
  return {};
}

// The forward pass as ops. Per layer: the products of the normed stream, biases, RoPE and
// K/V into pages; attention; the output projection added back to the stream and normed;
// gate and up, SwiGLU, down added back and normed for the next layer. A sliced shard sums
// the ranks' partial output and down projections before each add back.
void Model::build_ops(bool want_hidden, int n_logits, int n_ctx, bool lora, std::vector<backends::Op>& ops) const {
  using namespace backends;
  const ShardGeometry& g = shard();
  const float eps = hp_.rms_eps;
  const int n_head = g.n_head(), n_head_kv = g.n_head_kv();
  const float scale = hp_.attention_scale();
  const RowSet tok = RowSet::kTokens;
  // The reserve make_workspace made holds every op: building the list never allocates.
  METRO_CHECK(ops.capacity() >= static_cast<size_t>(kMaxOpsOutsideLayers + kMaxOpsPerLayer * g.n_layer()));
  ops.clear();
  // A project, then the LoRA deltas of the tokens whose adapter adapts its weights.
  auto push_project = [&](const ProjectOp& p) {
    ops.push_back(p);
    if (!lora) return;
    LoraOp l{p.src, p.rows, p.n_out, {}, p.dst, kLoraIn, kLoraMid, kLoraOut};
    if (p.rows == RowSet::kLogits) {
      l.scratch_in = kLoraInL;
      l.scratch_mid = kLoraMidL;
      l.scratch_out = kLoraOutL;
    }
    static const LoraSet kNone;
    bool any = false;
    for (int i = 0; i < p.n_out; ++i) {
      const LoraSet* set = lora_set(p.w[static_cast<size_t>(i)]);
      any = any || set != nullptr;
      l.sets[static_cast<size_t>(i)] = set != nullptr ? set : &kNone;
    }
    if (any) ops.push_back(l);
  };
  const kernels::Rope* global_rope = rope_long_ && hp_.long_rope(n_ctx) ? rope_long_.get() : rope_.get();
  ops.push_back(RopeAnglesOp{global_rope, kRopeCs});
  if (rope_local_) ops.push_back(RopeAnglesOp{rope_local_.get(), kRopeCsLocal});
  if (g.starts_model()) ops.push_back(EmbedOp{w_.token_embd.get(), kX, hp_.embd_scale});
  // Attention and the FFN read the normed stream, or (olmo2) the stream itself.
  const ActId in = hp_.pre_norms ? kXb : kX;
  if (hp_.pre_norms) ops.push_back(RmsNormOp{kX, kXb, w_.layers[0].attn_norm.get(), eps, tok});
  for (size_t il = 0; il < w_.layers.size(); ++il) {
    const LayerWeights& L = w_.layers[il];
    const int layer = static_cast<int>(il);  // in this shard's KV arena
    push_project(project(in, tok, {L.wq.get(), L.wk.get(), L.wv.get()}, {kQ, kK, kV}));
    if (L.bq) {
      ops.push_back(AddBiasOp{kQ, L.bq.get()});
      ops.push_back(AddBiasOp{kK, L.bk.get()});
      ops.push_back(AddBiasOp{kV, L.bv.get()});
    }
    if (hp_.qk_norm_full) {
      ops.push_back(RmsNormOp{kQ, kQ, L.q_norm.get(), eps, tok});
      ops.push_back(RmsNormOp{kK, kK, L.k_norm.get(), eps, tok});
    } else if (L.q_norm) {
      ops.push_back(HeadNormOp{kQ, L.q_norm.get(), n_head, eps});
      ops.push_back(HeadNormOp{kK, L.k_norm.get(), n_head_kv, eps});
    }
    const bool local = hp_.is_local_layer(static_cast<uint32_t>(L.model_layer));
    const kernels::Rope* rope = local ? rope_local_.get() : global_rope;
    const ActId angles = local ? kRopeCsLocal : kRopeCs;
    ops.push_back(RopeOp{rope, kQ, angles, n_head});
    ops.push_back(RopeOp{rope, kK, angles, n_head_kv});
    ops.push_back(KvStoreOp{kK, kV, layer});
    ops.push_back(AttentionOp{kQ, kAtt, layer, n_head, scale, hp_.layer_window(static_cast<uint32_t>(L.model_layer)),
                              hp_.attn_softcap});
    push_project(project(kAtt, tok, {L.wo.get()}, {kTmp}));
    if (g.sliced()) ops.push_back(AllReduceOp{kTmp, comm_.get()});
    if (L.post_attn_norm) ops.push_back(RmsNormOp{kTmp, kTmp, L.post_attn_norm.get(), eps, tok});
    ops.push_back(AddOp{kX, kTmp, kX, hp_.residual_scale});
    if (hp_.pre_norms) ops.push_back(RmsNormOp{kX, kXb, L.ffn_norm.get(), eps, tok});
    if (L.router) {
      // The router's scores and the shared expert's gate and up share their input.
      if (L.w_gate) {
        push_project(project(kXb, tok, {L.router.get(), L.w_gate.get(), L.w_up.get()}, {kRouter, kGate, kUp}));
      } else {
        push_project(project(kXb, tok, {L.router.get()}, {kRouter}));
      }
      const auto gating = hp_.expert_gating == ExpertGating::kSigmoid ? backends::ExpertGating::kSigmoid
                                                                      : backends::ExpertGating::kSoftmax;
      ops.push_back(MoeOp{kXb, kRouter, kTmp, &L.experts, static_cast<int>(hp_.n_expert_used), hp_.expert_weights_norm,
                          gating, kMoeIn, kMoeGate, kMoeUp, kMoeOut});
      if (L.w_gate) {
        ops.push_back(SwigluOp{kGate, kUp, kGate, false});
        push_project(project(kGate, tok, {L.w_down.get()}, {kShared}));
        ops.push_back(GatedAddOp{kTmp, kShared, kXb, L.shexp_gate.get()});
      }
    } else {
      push_project(project(in, tok, {L.w_gate.get(), L.w_up.get()}, {kGate, kUp}));
      ops.push_back(SwigluOp{kGate, kUp, kGate, hp_.gelu_ffn});
      push_project(project(kGate, tok, {L.w_down.get()}, {kTmp}));
    }
    if (g.sliced()) ops.push_back(AllReduceOp{kTmp, comm_.get()});
    if (L.post_ffn_norm) ops.push_back(RmsNormOp{kTmp, kTmp, L.post_ffn_norm.get(), eps, tok});
    ops.push_back(AddOp{kX, kTmp, kX, hp_.residual_scale});
    if (il + 1 < w_.layers.size()) {
      if (hp_.pre_norms) ops.push_back(RmsNormOp{kX, kXb, w_.layers[il + 1].attn_norm.get(), eps, tok});
    } else if (g.ends_model && want_hidden) {
      ops.push_back(RmsNormOp{kX, kHidden, w_.output_norm.get(), eps, tok});
    }
  }
  if (g.ends_model && n_logits > 0) {
    ops.push_back(RmsNormOp{kX, kXl, w_.output_norm.get(), eps, RowSet::kLogits});
    push_project(project(kXl, RowSet::kLogits, {w_.output.get()}, {kLogits}));
  }
}

// An encoder layer (post-norm): the products of the stream plus biases, bidirectional
// attention within each sequence, the output product added back and layer-normed; up
// product, GELU, down product added back and layer-normed. The last norm writes the hidden
// states when they are wanted.
void Model::build_encoder_ops(bool want_hidden, std::vector<backends::Op>& ops) const {
  using namespace backends;
  const float eps = hp_.rms_eps;
  const int n_head = static_cast<int>(hp_.n_head), n_head_kv = static_cast<int>(hp_.n_head_kv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim));
  const RowSet tok = RowSet::kTokens;
  METRO_CHECK(ops.capacity() >= static_cast<size_t>(kMaxOpsOutsideLayers + kMaxOpsPerLayer * shard().n_layer()));
  ops.clear();
  ops.push_back(EmbedOp{w_.token_embd.get(), kX});
  if (w_.pos_embd) ops.push_back(PosEmbedOp{w_.pos_embd.get(), kX});
  if (w_.type0) ops.push_back(AddBiasOp{kX, w_.type0.get()});
  // nomic-bert: each token's angles from its position in its own input.
  if (hp_.encoder_rope) ops.push_back(RopeAnglesOp{rope_.get(), kRopeCs});
  ops.push_back(LayerNormOp{kX, kX, w_.embd_norm.get(), w_.embd_norm_b.get(), eps});
  auto bias = [&](ActId x, const DeviceVector* b) {
    if (b != nullptr) ops.push_back(AddBiasOp{x, b});
  };
  for (size_t il = 0; il < w_.layers.size(); ++il) {
    const LayerWeights& L = w_.layers[il];
    ops.push_back(project(kX, tok, {L.wq.get(), L.wk.get(), L.wv.get()}, {kQ, kK, kV}));
    bias(kQ, L.bq.get());
    bias(kK, L.bk.get());
    bias(kV, L.bv.get());
    if (hp_.encoder_rope) {
      ops.push_back(RopeOp{rope_.get(), kQ, kRopeCs, n_head});
      ops.push_back(RopeOp{rope_.get(), kK, kRopeCs, n_head_kv});
    }
    ops.push_back(EncoderAttentionOp{kQ, kK, kV, kAtt, n_head, n_head_kv, scale});
    ops.push_back(project(kAtt, tok, {L.wo.get()}, {kTmp}));
    bias(kTmp, L.bo.get());
    ops.push_back(AddOp{kX, kTmp, kX});
    ops.push_back(LayerNormOp{kX, kX, L.attn_out_norm.get(), L.attn_out_norm_b.get(), eps});
    if (L.w_gate) {  // SiLU(gate x) * up x
      ops.push_back(project(kX, tok, {L.w_gate.get(), L.w_up.get()}, {kGate, kUp}));
      bias(kUp, L.b_up.get());
      ops.push_back(SwigluOp{kGate, kUp, kGate, false});
      ops.push_back(project(kGate, tok, {L.w_down.get()}, {kTmp}));
    } else {
      ops.push_back(project(kX, tok, {L.w_up.get()}, {kUp}));
      bias(kUp, L.b_up.get());
      ops.push_back(GeluOp{kUp});
      ops.push_back(project(kUp, tok, {L.w_down.get()}, {kTmp}));
    }
    bias(kTmp, L.b_down.get());
    ops.push_back(AddOp{kX, kTmp, kX});
    const bool last = il + 1 == w_.layers.size();
    ops.push_back(LayerNormOp{kX, last && want_hidden ? kHidden : kX, L.out_norm.get(), L.out_norm_b.get(), eps});
  }
}

Expected<ForwardOutput> Model::forward(const Batch& b, const KvView& kv, Workspace& ws,
                                       ThreadPool& pool, const ForwardOptions& opts) const {
  return forward(b, {}, kv, ws, pool, opts);
}

Expected<ForwardOutput> Model::forward(const Batch& b, std::span<const float> residual_in,
                                       const KvView& kv, Workspace& ws, ThreadPool& pool,
                                       const ForwardOptions& opts) const {
  METRO_RETURN_IF_ERROR(plan(b, kv, ws));
  const ShardGeometry& g = shard();
  const size_t T = static_cast<size_t>(b.size());
  const size_t n_embd = hp_.n_embd;
  if (g.starts_model() != residual_in.empty()) {
    return invalid_argument(g.starts_model() ? "a shard that starts the model embeds tokens; it takes no residual"
                                             : "a shard after layer 0 starts from the previous shard's residual");
  }
  if (!residual_in.empty() && residual_in.size() != T * n_embd) {
    return invalid_argument("the residual handed in has " + std::to_string(residual_in.size()) +
                            " values; the batch needs " + std::to_string(T * n_embd));
  }
  const int n_logits = static_cast<int>(ws.logit_rows.size());
  if (hp_.encoder) {
    if (n_logits > 0) return invalid_argument("an encoder has no output head: no token of its batch can want logits");
    build_encoder_ops(opts.want_hidden, ws.ops);
  } else {
    const bool lora = std::any_of(b.adapter.begin(), b.adapter.end(), [](int16_t a) { return a != 0; });
    build_ops(opts.want_hidden, n_logits, ws.limits().n_ctx, lora, ws.ops);
  }
  if (!residual_in.empty()) ws.state_->upload(kX, residual_in);

  backends::StepDesc step;
  step.token = b.token;
  step.pos = b.pos;
  step.seq = b.seq;
  step.runs = ws.runs;
  step.logit_rows = ws.logit_rows;
  step.kv = &kv;
  step.adapter = b.adapter;
  backend_->execute(ws.ops, step, *ws.state_, pool, opts.observer);

  ForwardOutput out;
  out.batch_index = std::span<const int>(ws.logit_rows.data(), ws.logit_rows.size());
  if (g.ends_model) {
    out.n_vocab = static_cast<int>(hp_.n_vocab);
    out.n_rows = n_logits;
    std::span<const float> logits = ws.state_->download(kLogits, static_cast<size_t>(n_logits) * hp_.n_vocab);
    // The logits are scaled and capped where they arrive, on every backend alike; the
    // download is the workspace's own buffer, which nothing else reads before the next step.
    if (hp_.logit_scale != 1.0f) {
      auto* l = const_cast<float*>(logits.data());
      const float inv = 1.0f / hp_.logit_scale;
      for (size_t i = 0; i < logits.size(); ++i) l[i] *= inv;
    }
    if (hp_.final_softcap > 0.0f) {
      kernels::softcap(const_cast<float*>(logits.data()), static_cast<int64_t>(logits.size()), hp_.final_softcap);
    }
    out.logits = logits.data();
    if (opts.want_hidden) out.hidden = ws.state_->download(kHidden, T * n_embd).data();
  } else {
    out.residual = ws.state_->download(kX, T * n_embd).data();
  }
  return out;
}

SequenceKv::SequenceKv(backends::Backend& backend, const kernels::KvPageLayout& layout, int n_layer,
                       int n_ctx) {
  view_.layout = layout;
  view_.n_layer = n_layer;
  const int n_blocks = (n_ctx + layout.block_size - 1) / layout.block_size;
  view_.n_blocks = n_blocks;
  arena_ = backend.alloc_buffer(view_.block_bytes() * static_cast<size_t>(n_blocks));
  view_.arena = arena_->data();
  table_.resize(static_cast<size_t>(n_blocks));
  for (int i = 0; i < n_blocks; ++i) table_[static_cast<size_t>(i)] = i;
  view_.tables = {std::span<const int32_t>(table_)};
  capacity_ = n_blocks * layout.block_size;
}

namespace {

kernels::KvPageLayout whole_layout(const HParams& hp, kernels::DType type, int block_size) {
  kernels::KvPageLayout l;
  l.type = type;
  l.block_size = block_size;
  l.n_head_kv = static_cast<int>(hp.n_head_kv);
  l.head_dim = static_cast<int>(hp.head_dim);
  return l;
}

}  // namespace

SequenceKv::SequenceKv(const HParams& hp, int n_ctx, kernels::DType type, int block_size)
    : SequenceKv(*backends::default_backend(), whole_layout(hp, type, block_size),
                 static_cast<int>(hp.n_layer), n_ctx) {}

SequenceKv::SequenceKv(const Model& m, int n_ctx, kernels::DType type, int block_size)
    : SequenceKv(*m.backend(), m.kv_layout(type, block_size), m.kv_layers(), n_ctx) {}

}  // namespace metro::model
