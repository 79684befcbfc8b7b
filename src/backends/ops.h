// What a model asks a backend to execute for one step: a sequence of typed ops over
// step-scoped activation buffers, uploaded weights and the paged KV cache. The ops know
// nothing of models; a model describes its forward pass with them (model/model.cpp) and a
// backend (backend.h) runs the sequence in order.
//
// Activation buffers are row-major F32 matrices [rows][cols], named by ActId and declared
// when the backend's state is made (StateSpec). A buffer's rows are either the step's
// tokens (RowSet::kTokens: row t is batch token t) or its logits rows (RowSet::kLogits:
// row r is batch token logit_rows[r]); its cols are fixed. Every operand's width is its
// buffer's cols.
//
// Elementwise ops (all but Project, Attention, EncoderAttention, Moe, Lora and AllReduce) compute output row r from
// row r of their operands alone, so an executor may run a run of consecutive elementwise
// ops over the same row set row by row, without synchronising between them. The other ops
// read every row (or every sequence's keys) and need all earlier writes done.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

namespace metro::kernels {
class Rope;
}
namespace metro::dist {
class Communicator;
}

namespace metro::backends {

class DeviceMatrix;
class DeviceVector;

enum class ActId : uint8_t {};
enum class RowSet : uint8_t { kTokens, kLogits };

// dst[t] = row token[t] of `table` (a MatrixUse::kRows matrix), as F32, times `scale`
// (gemma scales its embeddings by sqrt(n_embd)).
struct EmbedOp {
  const DeviceMatrix* table;
  ActId dst;
  float scale = 1.0f;
};

// dst[t] = the cos then the sin of token t's rotary angles at position pos[t]
// (rope->config().n_rot / 2 values each).
struct RopeAnglesOp {
  const kernels::Rope* rope;
  ActId dst;
};

// dst[r] = rms_norm(src[s]) * weight with s = r, or over logits rows s = logit_rows[r]
// (src then is a token buffer: the head norms only the rows it computes logits for).
struct RmsNormOp {
  ActId src;
  ActId dst;
  const DeviceVector* weight;
  float eps;
  RowSet rows;
};

// For each i < n_out: dst[i][r] = src[r] · w[i]ᵀ (dst[i] has w[i]->n_rows() cols, src has
// w[i]->n_cols()). The products share their input: it is quantized to each weight type's
// dot partner once, as the reference quantizer does.
struct ProjectOp {
  ActId src;
  RowSet rows;
  int n_out;
  std::array<const DeviceMatrix*, 3> w;
  std::array<ActId, 3> dst;
};

// x[t] += bias
struct AddBiasOp {
  ActId x;
  const DeviceVector* bias;
};

// Rotates the n_head heads of x[t] (head_dim = rope->config().head_dim each) by the
// angles in angles[t] (a RopeAnglesOp's output).
struct RopeOp {
  const kernels::Rope* rope;
  ActId x;
  ActId angles;
  int n_head;
};

// Writes k[t] and v[t] (the KV heads of token t) into the slot of position pos[t] of
// sequence seq[t], in the K and V pages of arena layer `layer`.
struct KvStoreOp {
  ActId k;
  ActId v;
  int layer;
};

// Causal attention of every sequence run's queries (q: n_head heads per token) over the
// keys and values of its positions [0, pos] in the pages of arena layer `layer`, into out.
struct AttentionOp {
  ActId q;
  ActId out;
  int layer;
  int n_head;
  float scale;
  int64_t window = 0;  // sliding window in tokens (kernels::AttentionParams::window); 0: none
  float softcap = 0.0f;  // scores capped at +-softcap by tanh (kernels::AttentionParams::softcap); 0: none
};

// Each of the n_head heads of x[t] (width/n_head values each) RMS-normed in place with the
// same weight (head_dim values): the per-head query and key norms of qwen3 and gemma3.
struct HeadNormOp {
  ActId x;
  const DeviceVector* weight;
  int n_head;
  float eps;
};

// dst[t] = a[t] + scale * b[t]
struct AddOp {
  ActId a;
  ActId b;
  ActId dst;
  float scale = 1.0f;  // other than 1 only where the backend says scaled_add()
};

// dst[t] = silu(gate[t]) * up[t], or gelu(gate[t]) * up[t] (tanh approximation) when `gelu`
struct SwigluOp {
  ActId gate;
  ActId up;
  ActId dst;
  bool gelu = false;
};

// Encoder (BERT-family) ops.
// x[t] += table[pos[t]]: learned absolute position embeddings (an F32 MatrixUse::kRows
// matrix; an encoder folds its token-type row into it).
struct PosEmbedOp {
  const DeviceMatrix* table;
  ActId x;
};

// dst[t] = (src[t] - mean) / sqrt(var + eps) * weight + bias (dst may be src).
struct LayerNormOp {
  ActId src;
  ActId dst;
  const DeviceVector* weight;
  const DeviceVector* bias;
  float eps;
};

// x[t] = gelu(x[t]), the exact (erf) form.
struct GeluOp {
  ActId x;
};

// Bidirectional attention within each sequence run of the step: every query of a run sees
// every key of the same run (the whole input is in the step; nothing is read from or
// written to KV memory). k and v hold n_head_kv heads per token.
struct EncoderAttentionOp {
  ActId q;
  ActId k;
  ActId v;
  ActId out;
  int n_head;
  int n_head_kv;
  float scale;
};

// x (its token rows) = the sum over the communicator's ranks of each rank's x: where the
// ranks of a tensor-parallel group add up their partial products.
struct AllReduceOp {
  ActId x;
  dist::Communicator* comm;
};

// Mixture-of-experts ops.
// The expert FFNs of one layer: expert e computes down[e] · act(gate[e] x) * (up[e] x).
// All experts' gate (and up) matrices share a shape and a type, and so do the downs.
struct ExpertSet {
  std::vector<const DeviceMatrix*> gate, up, down;
  int size() const { return static_cast<int>(gate.size()); }
};

enum class ExpertGating : uint8_t { kSoftmax, kSigmoid };

// A token's expert FFNs. Its router scores (router[t], one logit per expert, from an earlier
// ProjectOp) become probabilities (softmax over all experts, or a sigmoid each); the n_used
// most probable experts (the lower id first on a tie) run on src[t], each weighted by its
// probability, the weights rescaled to sum 1 when `norm_weights`:
//   dst[t] = sum over the chosen e, most probable first, of w_e * down_e(silu(gate_e src[t]) * up_e src[t]).
// The executor groups the step's tokens by expert, so each expert's products run once over
// all of its tokens; a token's result does not depend on the other tokens of the step.
// slot_in, slot_gate, slot_up and slot_out are scratch buffers of n_used rows of the
// product widths per token ([tokens][n_used * width]).
struct MoeOp {
  ActId src;
  ActId router;
  ActId dst;
  const ExpertSet* experts;
  int n_used;
  bool norm_weights;
  ExpertGating gating;
  ActId slot_in, slot_gate, slot_up, slot_out;
};

// x[t] += sigmoid(gate_in[t] · gate) * y[t], or x[t] += y[t] without a gate: a shared
// expert's output joining the routed experts' (qwen2moe).
struct GatedAddOp {
  ActId x;
  ActId y;
  ActId gate_in;
  const DeviceVector* gate;  // null: no gate
};

// LoRA adapters applied per token at run time.
// One weight's low-rank deltas, one per adapter (adapter ids 1..size(); id 0 is none):
// a[i] is adapter i+1's A [rank][n_in] and b[i] its B [n_out][rank] with the adapter's
// scale folded in; both null where that adapter leaves the weight alone.
struct LoraSet {
  std::vector<const DeviceMatrix*> a, b;
  int size() const { return static_cast<int>(a.size()); }
};

// After a ProjectOp of the same src and rows: for each i < n_out and each row r whose token
// runs with an adapter that adapts w[i], dst[i][r] += b · (a · src[r]). The rows are grouped
// by adapter, so each adapter's two products run once over all of its rows. The scratch
// buffers hold each row's gathered input, its rank values per output and its deltas
// ([rows][width]: the widest input, 3 ranks, the sum of the outputs' widths).
struct LoraOp {
  ActId src;
  RowSet rows;
  int n_out;
  std::array<const LoraSet*, 3> sets;
  std::array<ActId, 3> dst;
  ActId scratch_in, scratch_mid, scratch_out;
};

using Op = std::variant<EmbedOp, RopeAnglesOp, RmsNormOp, ProjectOp, AddBiasOp, RopeOp, KvStoreOp,
                        AttentionOp, AddOp, SwigluOp, AllReduceOp, HeadNormOp, PosEmbedOp, LayerNormOp,
                        GeluOp, EncoderAttentionOp, MoeOp, GatedAddOp, LoraOp>;

// One kind per alternative of Op, in the same order.
enum class OpKind : uint8_t {
  kEmbed,
  kRopeAngles,
  kRmsNorm,
  kProject,
  kAddBias,
  kRope,
  kKvStore,
  kAttention,
  kAdd,
  kSwiglu,
  kAllReduce,
  kHeadNorm,
  kPosEmbed,
  kLayerNorm,
  kGelu,
  kEncoderAttention,
  kMoe,
  kGatedAdd,
  kLora,
  kCount,
};
inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kCount);
static_assert(std::variant_size_v<Op> == kNumOpKinds);

inline OpKind kind_of(const Op& op) { return static_cast<OpKind>(op.index()); }
std::string_view op_name(OpKind kind);

// Whether the op computes each output row from the same row of its operands (see above).
inline bool is_elementwise(OpKind kind) {
  return kind != OpKind::kProject && kind != OpKind::kAttention && kind != OpKind::kAllReduce &&
         kind != OpKind::kEncoderAttention && kind != OpKind::kMoe && kind != OpKind::kLora;
}

// The rows an op runs over.
inline RowSet row_set(const Op& op) {
  if (const auto* n = std::get_if<RmsNormOp>(&op)) return n->rows;
  if (const auto* p = std::get_if<ProjectOp>(&op)) return p->rows;
  if (const auto* l = std::get_if<LoraOp>(&op)) return l->rows;
  return RowSet::kTokens;
}

}  // namespace metro::backends
