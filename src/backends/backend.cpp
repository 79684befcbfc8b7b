#include "backends/backend.h"

namespace metro::backends {

std::string_view op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kEmbed: return "embed";
    case OpKind::kRopeAngles: return "rope_angles";
    case OpKind::kRmsNorm: return "rms_norm";
    case OpKind::kProject: return "project";
    case OpKind::kAddBias: return "add_bias";
    case OpKind::kRope: return "rope";
    case OpKind::kKvStore: return "kv_store";
    case OpKind::kAttention: return "attention";
    case OpKind::kAdd: return "add";
    case OpKind::kSwiglu: return "swiglu";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kHeadNorm: return "head_norm";
    case OpKind::kPosEmbed: return "pos_embed";
    case OpKind::kLayerNorm: return "layer_norm";
    case OpKind::kGelu: return "gelu";
    case OpKind::kEncoderAttention: return "encoder_attention";
    case OpKind::kMoe: return "moe";
    case OpKind::kGatedAdd: return "gated_add";
    case OpKind::kLora: return "lora";
    case OpKind::kCount: break;
  }
  return "?";
}

void StepProfile::op_timed(size_t, OpKind kind, int64_t ns) {
  ns_[static_cast<size_t>(kind)] += ns;
  ++calls_[static_cast<size_t>(kind)];
}

double StepProfile::seconds(OpKind kind) const {
  return static_cast<double>(ns_[static_cast<size_t>(kind)]) * 1e-9;
}

int StepProfile::calls(OpKind kind) const { return calls_[static_cast<size_t>(kind)]; }

double StepProfile::total_seconds() const {
  int64_t total = wait_ns_;
  for (int64_t ns : ns_) total += ns;
  return static_cast<double>(total) * 1e-9;
}

}  // namespace metro::backends
