// metro quantize IN.gguf OUT.gguf --type q2_k|q3_k|q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q5_k|q6_k|f16|bf16|f32
//                [--plan PLAN.json]
//
// Rewrites every 2-D weight matrix in another block format (dequantize with the scalar
// reference, quantize with the scalar reference); 1-D tensors (norms, biases) stay as they
// are. Metadata is copied unchanged but for general.file_type. Requantizing an already
// quantized file adds the new format's error to the old one.
//
// A plan gives some matrices another format than --type:
//   {"type": "q4_k", "tensors": {"output.weight": "q8_0", "blk.*.ffn_down.weight": "q6_k"}}
// ("type", when given, replaces --type; a format may be `keep`, the tensor as it is in the
// input, as a plan from `metro sensitivity` keeps what it does not name; names may use `*`
// for any run of characters; an exact name wins over a pattern, then the first pattern that
// matches; a pattern that matches no matrix is an error, so a typo does not pass silently).
// A matrix already in its target format is copied as it is. A matrix whose rows do
// not divide into its format's blocks (the K-quants' 256) gets the nearest 32-block format
// instead, as llama.cpp's quantizer does: Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K ->
// Q5_1, Q6_K -> Q8_0; the summary counts them.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "kernels/dtype.h"
#include "kernels/quant_ref.h"
#include "model/requantize.h"

namespace metro::cli {
namespace {

// One line redrawn in place on a terminal: the share of matrix bytes done.
class Progress {
 public:
  explicit Progress(uint64_t total) : total_(total), tty_(isatty(STDERR_FILENO) != 0) {}
  void advance(uint64_t n, std::string_view name) {
    done_ += n;
    if (!tty_ || total_ == 0) return;
    const int pct = static_cast<int>(100 * done_ / total_);
    const int bar = pct * 30 / 100;
    std::fprintf(stderr, "\rquantize [%.*s%*s] %3d%% %-40.40s", bar, "##############################", 30 - bar, "",
                 pct, std::string(name).c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  uint64_t total_, done_ = 0;
  bool tty_;
};

}  // namespace

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Rewrite a GGUF model's weight matrices in another format", "metro quantize"};
  std::string in_path, out_path, type_name;
  app.add_option("input", in_path, "GGUF file to read")->required();
  app.add_option("output", out_path, "GGUF file to write")->required();
  std::string plan_path;
  app.add_option("--type", type_name, "target format of 2-D weights (the plan's 'type' replaces it)");
  app.add_option("--plan", plan_path, "JSON plan: a format per tensor name or pattern (see the command's docs)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  model::QuantPlan plan;
  if (!plan_path.empty()) {
    auto p = model::read_quant_plan(plan_path, "--plan");
    if (!p.ok()) return fail("quantize", p.status());
    plan = std::move(*p);
  }
  if (!plan.type) {
    if (type_name.empty()) return fail("quantize", invalid_argument("--type is required (or a plan with 'type')"));
    auto t = model::quant_format_named(type_name, "--type");
    if (!t.ok()) return fail("quantize", t.status());
    plan.type = *t;
  }
  auto in = gguf::File::open(in_path);
  if (!in.ok()) return fail("quantize", in.status());
  Progress progress(model::matrix_bytes(*in));
  model::RequantizeOptions opts;
  opts.on_matrix = [&](uint64_t bytes, std::string_view name) { progress.advance(bytes, name); };
  model::RequantizeReport rep;
  auto bytes = model::requantize(*in, plan, opts, &rep);
  progress.finish();
  if (!bytes.ok()) {
    const std::string& m = bytes.status().message();
    return fail("quantize", m.starts_with("plan: ") ? invalid_argument("--" + m) : bytes.status());
  }
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) return fail("quantize", io_error("cannot write " + out_path));
  std::string summary;
  for (const auto& [type, n] : rep.converted) {
    summary += (summary.empty() ? "" : ", ") + std::to_string(n) + " to " + std::string(kernels::dtype_name(type));
  }
  std::fprintf(stderr, "metro quantize: matrices %s (%zu in a 32-block format: rows not a multiple of 256); "
               "%zu tensors kept\n", summary.empty() ? "none" : summary.c_str(), rep.fell_back, rep.kept);
  return 0;
}

}  // namespace metro::cli
