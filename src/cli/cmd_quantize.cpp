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

namespace metro::cli {
namespace {

// GGUF general.file_type values (llama_ftype) for the formats metro writes.
const std::map<std::string, std::pair<kernels::DType, uint32_t>>& formats() {
  static const std::map<std::string, std::pair<kernels::DType, uint32_t>> m = {
      {"f32", {kernels::DType::kF32, 0}},   {"f16", {kernels::DType::kF16, 1}},
      {"q4_0", {kernels::DType::kQ4_0, 2}}, {"q4_1", {kernels::DType::kQ4_1, 3}},
      {"q8_0", {kernels::DType::kQ8_0, 7}}, {"q5_0", {kernels::DType::kQ5_0, 8}},
      {"q5_1", {kernels::DType::kQ5_1, 9}}, {"q4_k", {kernels::DType::kQ4_K, 15}},
      {"q5_k", {kernels::DType::kQ5_K, 17}}, {"q6_k", {kernels::DType::kQ6_K, 18}},
      {"q2_k", {kernels::DType::kQ2_K, 10}}, {"q3_k", {kernels::DType::kQ3_K, 11}},
      {"bf16", {kernels::DType::kBF16, 32}},
  };
  return m;
}

// "keep": the tensor stays as it is in the input (kernels::DType::kCount stands for it).
constexpr kernels::DType kKeep = kernels::DType::kCount;

Expected<kernels::DType> format_named(std::string name, const std::string& where) {
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  if (name == "keep") return kKeep;
  auto it = formats().find(name);
  if (it == formats().end()) return invalid_argument(where + ": unknown format '" + name + "'");
  return it->second.first;
}

uint32_t file_type_of(kernels::DType t) {
  for (const auto& [name, v] : formats()) {
    if (v.first == t) return v.second;
  }
  return 0;
}

struct Plan {
  std::optional<kernels::DType> type;
  std::vector<std::pair<std::string, kernels::DType>> tensors;  // in the file's order
  std::vector<bool> used;
};

Expected<Plan> read_plan(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("--plan: cannot read " + path);
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("--plan: " + path + " is not a JSON object");
  Plan p;
  for (const auto& [key, v] : j.items()) {
    if (key == "type") {
      if (!v.is_string()) return invalid_argument("--plan: 'type' must be a string");
      METRO_ASSIGN_OR_RETURN(p.type, format_named(v.get<std::string>(), "--plan 'type'"));
    } else if (key == "tensors") {
      if (!v.is_object()) return invalid_argument("--plan: 'tensors' must be an object of name -> format");
      for (const auto& [name, f] : v.items()) {
        if (!f.is_string()) return invalid_argument("--plan: tensors['" + name + "'] must be a format name");
        METRO_ASSIGN_OR_RETURN(kernels::DType t, format_named(f.get<std::string>(), "--plan tensors['" + name + "']"));
        p.tensors.emplace_back(name, t);
      }
    } else {
      return invalid_argument("--plan: unknown key '" + key + "' (expected 'type' and 'tensors')");
    }
  }
  p.used.assign(p.tensors.size(), false);
  return p;
}

// The plan's format for a matrix: an exact name first, then the first matching pattern.
kernels::DType planned(Plan& p, std::string_view name, kernels::DType dflt) {
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    if (p.tensors[i].first == name) {
      p.used[i] = true;
      return p.tensors[i].second;
    }
  }
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    if (glob_match(p.tensors[i].first, name)) {
      p.used[i] = true;
      return p.tensors[i].second;
    }
  }
  return dflt;
}

// The 32-block format standing in for a K-quant on rows that do not divide into 256-blocks.
kernels::DType block32_fallback(kernels::DType t) {
  switch (t) {
    case kernels::DType::kQ2_K:
    case kernels::DType::kQ3_K: return kernels::DType::kQ4_0;
    case kernels::DType::kQ4_K: return kernels::DType::kQ5_0;
    case kernels::DType::kQ5_K: return kernels::DType::kQ5_1;
    case kernels::DType::kQ6_K: return kernels::DType::kQ8_0;
    default: return t;
  }
}

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
  Plan plan;
  if (!plan_path.empty()) {
    auto p = read_plan(plan_path);
    if (!p.ok()) return fail("quantize", p.status());
    plan = std::move(*p);
  }
  std::optional<kernels::DType> base = plan.type;
  if (!base) {
    if (type_name.empty()) return fail("quantize", invalid_argument("--type is required (or a plan with 'type')"));
    auto t = format_named(type_name, "--type");
    if (!t.ok()) return fail("quantize", t.status());
    base = *t;
  }
  const kernels::DType target = *base;
  auto in = gguf::File::open(in_path);
  if (!in.ok()) return fail("quantize", in.status());

  gguf::Writer w;
  for (const auto& kv : in->metadata()) {
    if (kv.key == "general.file_type") continue;
    if (kv.key == "general.alignment") {
      w.set_alignment(static_cast<uint32_t>(*kv.value.as_uint()));
      continue;
    }
    w.add_value(kv.key, kv.value);
  }
  if (target != kKeep) {
    w.add_u32("general.file_type", file_type_of(target));
  } else if (auto ft = in->get_u32("general.file_type"); ft.ok()) {
    w.add_u32("general.file_type", *ft);
  }
  std::vector<float> row;
  size_t kept = 0, fell_back = 0;
  std::map<kernels::DType, size_t> converted;
  uint64_t matrix_bytes = 0;
  for (const auto& t : in->tensors()) {
    if (t.n_dims == 2 && kernels::dtype_from_ggml(t.type())) matrix_bytes += t.n_bytes;
  }
  Progress progress(matrix_bytes);
  for (const auto& t : in->tensors()) {
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    auto src_type = kernels::dtype_from_ggml(t.type());
    kernels::DType want = t.n_dims == 2 && src_type ? planned(plan, t.name, target) : target;
    if (want == kKeep && src_type) want = *src_type;
    if (t.n_dims == 2 && src_type && static_cast<int64_t>(t.ne[0]) % kernels::traits(want).block_size != 0) {
      want = block32_fallback(want);
      ++fell_back;
    }
    const bool matrix = t.n_dims == 2 && src_type && want != *src_type &&
                        static_cast<int64_t>(t.ne[0]) % kernels::traits(want).block_size == 0;
    if (!matrix) {
      auto st = w.add_tensor(t.name, t.type(), dims, {t.data, t.n_bytes});
      if (!st.ok()) return fail("quantize", st);
      ++kept;
      if (t.n_dims == 2 && src_type) progress.advance(t.n_bytes, t.name);
      continue;
    }
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.ne[1]);
    const size_t in_rb = kernels::row_bytes(*src_type, cols), out_rb = kernels::row_bytes(want, cols);
    std::vector<uint8_t> out(out_rb * static_cast<size_t>(rows));
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      kernels::dequantize_row_ref(*src_type, t.data + static_cast<size_t>(r) * in_rb, row.data(), cols);
      kernels::quantize_row_ref(want, row.data(), out.data() + static_cast<size_t>(r) * out_rb, cols);
    }
    auto st = w.add_tensor(t.name, kernels::traits(want).ggml, dims, out);
    if (!st.ok()) return fail("quantize", st);
    ++converted[want];
    progress.advance(t.n_bytes, t.name);
  }
  progress.finish();
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (!plan.used[i]) {
      return fail("quantize", invalid_argument("--plan: '" + plan.tensors[i].first + "' matches no matrix"));
    }
  }
  auto st = w.write(out_path);
  if (!st.ok()) return fail("quantize", st);
  std::string summary;
  for (const auto& [type, n] : converted) {
    summary += (summary.empty() ? "" : ", ") + std::to_string(n) + " to " + std::string(kernels::dtype_name(type));
  }
  std::fprintf(stderr, "metro quantize: matrices %s (%zu in a 32-block format: rows not a multiple of 256); "
               "%zu tensors kept\n", summary.empty() ? "none" : summary.c_str(), fell_back, kept);
  return 0;
}

}  // namespace metro::cli
