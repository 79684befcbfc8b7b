#include "engine/step_trace.h"

namespace metro::engine {

Expected<std::shared_ptr<StepTraceWriter>> StepTraceWriter::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return invalid_argument("--step-trace: cannot write the trace file");
  std::fputs("# step_s prefill_tokens decode_seqs prefill_pairs decode_keys logit_rows attention_s\n", f);
  return std::shared_ptr<StepTraceWriter>(new StepTraceWriter(f));
}

void StepTraceWriter::on_step(const StepReport& r) {
  std::fprintf(file_.get(), "%.6f %d %d %.0f %.0f %d %.6f\n", r.cost.step_s, r.cost.prefill_tokens,
               r.cost.decode_seqs, r.cost.prefill_pairs, r.cost.decode_ctx, r.logit_rows, r.attention_s);
  if (++lines_ % 64 == 0) std::fflush(file_.get());
}

}  // namespace metro::engine
