// metro quantize IN.gguf OUT.gguf --type q2_k|q3_k|q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q5_k|q6_k|f16|bf16|f32
//                [--plan PLAN.json] [--imatrix TEXT [--imatrix-tokens N] [--imatrix-window N]]
// metro quantize IN.gguf OUT.gguf --type q4_k_m|q5_k_m      (llama.cpp's mixes: model/requantize.h)
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
//
// --imatrix TEXT: the importance of each weight column is measured on a calibration text
// (the mean square of the activations it multiplies, by the double-precision reference
// forward pass over the text's first N tokens, in windows), and Q2_K, Q3_K and Q4_0 search
// their scales for the least importance-weighted error; other formats ignore it.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "kernels/dtype.h"
#include "kernels/quant_ref.h"
#include "model/requantize.h"
#include "tokenizer/tokenizer.h"

namespace metro::cli {
namespace {

}  // namespace

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Rewrite a GGUF model's weight matrices in another format", "metro quantize"};
  std::string in_path, out_path, type_name;
  app.add_option("input", in_path, "GGUF file to read")->required();
  app.add_option("output", out_path, "GGUF file to write")->required();
  std::string plan_path;
  app.add_option("--type", type_name,
                 "target format of 2-D weights (the plan's 'type' replaces it), or llama.cpp's q4_k_m / q5_k_m mix");
  app.add_option("--plan", plan_path, "JSON plan: a format per tensor name or pattern (see the command's docs)");
  std::string imatrix_path;
  int imatrix_tokens = 512, imatrix_window = 128;
  app.add_option("--imatrix", imatrix_path, "calibration text: weigh Q2_K / Q3_K / Q4_0 rounding by activation importance");
  app.add_option("--imatrix-tokens", imatrix_tokens, "tokens of the calibration text used")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--imatrix-window", imatrix_window, "tokens per forward window over the calibration text")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  int threads = 0;
  app.add_option("-t,--threads", threads, "threads quantizing each matrix's rows (0: one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
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
  const bool preset = !plan.type && model::is_quant_preset_name(type_name);
  if (preset && !plan.tensors.empty()) {
    return fail("quantize", invalid_argument("--type " + type_name + " is a recipe of its own; it takes no --plan"));
  }
  if (!plan.type && !preset) {
    if (type_name.empty()) return fail("quantize", invalid_argument("--type is required (or a plan with 'type')"));
    auto t = model::quant_format_named(type_name, "--type");
    if (!t.ok()) return fail("quantize", t.status());
    plan.type = *t;
  }
  if (same_file(in_path, out_path)) {
    return fail("quantize", invalid_argument("the output '" + out_path + "' is the input file; write another file"));
  }
  auto in = gguf::File::open(in_path);
  if (!in.ok()) return fail("quantize", with_path(in_path, in.status()));
  if (preset) {
    std::vector<std::string> names;
    for (const auto& t : in->tensors()) names.emplace_back(t.name);
    plan = *model::preset_plan(type_name, names);
  }
  model::Importance importance;
  if (!imatrix_path.empty()) {
    std::ifstream text_in(imatrix_path, std::ios::binary);
    if (!text_in) return fail("quantize", io_error("--imatrix: cannot read " + imatrix_path));
    const std::string text((std::istreambuf_iterator<char>(text_in)), std::istreambuf_iterator<char>());
    auto tok = tokenizer::Tokenizer::from_gguf(*in);
    if (!tok.ok()) return fail("quantize", tok.status());
    std::vector<int32_t> ids = tok->encode(text, true, false);
    if (ids.size() > static_cast<size_t>(imatrix_tokens)) ids.resize(static_cast<size_t>(imatrix_tokens));
    const int windows = (static_cast<int>(ids.size()) + imatrix_window - 1) / imatrix_window;
    Progress imp_progress("importance", static_cast<uint64_t>(windows));
    auto imp = model::compute_importance(*in, ids, imatrix_window, [&](int done, int total) {
      imp_progress.advance(1, "window " + std::to_string(done) + " of " + std::to_string(total));
    });
    imp_progress.finish();
    if (!imp.ok()) return fail("quantize", imp.status());
    importance = std::move(*imp);
  }
  Progress progress("quantize", model::matrix_bytes(*in));
  model::RequantizeOptions opts;
  if (!imatrix_path.empty()) opts.importance = &importance;
  opts.threads = threads;
  opts.on_matrix = [&](uint64_t bytes, std::string_view name) { progress.advance(bytes, name); };
  model::RequantizeReport rep;
  const Status st = model::requantize_to_file(*in, out_path, plan, opts, &rep);
  progress.finish();
  if (!st.ok()) {
    const std::string& m = st.message();
    return fail("quantize", m.starts_with("plan: ") ? invalid_argument("--" + m) : st);
  }
  std::string summary;
  for (const auto& [type, n] : rep.converted) {
    summary += (summary.empty() ? "" : ", ") + std::to_string(n) + " to " + std::string(kernels::dtype_name(type));
  }
  std::fprintf(stderr, "metro quantize: matrices %s (%zu in a 32-block format: rows not a multiple of 256); "
               "%zu tensors kept", summary.empty() ? "none" : summary.c_str(), rep.fell_back, rep.kept);
  if (!imatrix_path.empty()) {
    std::fprintf(stderr, "; %zu matrices weighted by importance over %d tokens", rep.weighted, importance.tokens);
  }
  std::fprintf(stderr, "\n");
  return 0;
}

}  // namespace metro::cli
