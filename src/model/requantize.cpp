#include "model/requantize.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "gguf/writer.h"
#include "kernels/quant_ref.h"

namespace metro::model {

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

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
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

// The plan's format for a matrix (an exact name first, then the first matching pattern),
// marking the entry used; `dflt` when none names it.
kernels::DType planned(const QuantPlan& p, std::vector<bool>& used, std::string_view name, kernels::DType dflt) {
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    if (p.tensors[i].first == name) {
      used[i] = true;
      return p.tensors[i].second;
    }
  }
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    if (glob_match(p.tensors[i].first, name)) {
      used[i] = true;
      return p.tensors[i].second;
    }
  }
  return dflt;
}

}  // namespace

bool is_quant_preset_name(std::string name) {
  name = lower(std::move(name));
  return name == "q4_k_m" || name == "q5_k_m";
}

std::optional<QuantPlan> preset_plan(std::string name, const std::vector<std::string>& tensor_names) {
  name = lower(std::move(name));
  if (!is_quant_preset_name(name)) return std::nullopt;
  QuantPlan plan;
  plan.type = name == "q4_k_m" ? kernels::DType::kQ4_K : kernels::DType::kQ5_K;
  // Layer count per kind, from the names ("blk.N.attn_v.weight", "blk.N.ffn_down[_exps].weight").
  static const std::regex kRe(R"(blk\.(\d{1,4})\.(attn_v|ffn_down|ffn_down_exps)\.weight)");
  std::map<std::string, int> n_of;
  bool has_output = false;
  for (const std::string& t : tensor_names) {
    std::smatch m;
    if (std::regex_match(t, m, kRe)) n_of[m[2].str()] = std::max(n_of[m[2].str()], std::stoi(m[1].str()) + 1);
    has_output = has_output || t == "output.weight";
  }
  auto more_bits = [](int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  for (const std::string& t : tensor_names) {
    std::smatch m;
    if (std::regex_match(t, m, kRe) && more_bits(std::stoi(m[1].str()), n_of[m[2].str()])) {
      plan.tensors.emplace_back(t, kernels::DType::kQ6_K);
    } else if (t == (has_output ? "output.weight" : "token_embd.weight")) {
      plan.tensors.emplace_back(t, kernels::DType::kQ6_K);
    }
  }
  return plan;
}

kernels::DType format_for_row_width(kernels::DType t, int64_t cols) {
  if (cols % kernels::traits(t).block_size == 0) return t;
  const kernels::DType b32 = block32_fallback(t);
  return cols % kernels::traits(b32).block_size == 0 ? b32 : kernels::DType::kF16;
}

Expected<kernels::DType> quant_format_named(std::string name, const std::string& where) {
  name = lower(std::move(name));
  if (name == "keep") return kKeepFormat;
  auto it = formats().find(name);
  if (it == formats().end()) return invalid_argument(where + ": unknown format '" + name + "'");
  return it->second.first;
}

bool is_quant_format_name(std::string name) {
  name = lower(std::move(name));
  return name == "keep" || formats().count(name) != 0;
}

uint32_t quant_file_type(kernels::DType t) {
  for (const auto& [name, v] : formats()) {
    if (v.first == t) return v.second;
  }
  return 0;
}

Expected<QuantPlan> parse_quant_plan(std::string_view text, const std::string& where) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(where + " is not a JSON object");
  QuantPlan p;
  for (const auto& [key, v] : j.items()) {
    if (key == "type") {
      if (!v.is_string()) return invalid_argument(where + ": 'type' must be a string");
      METRO_ASSIGN_OR_RETURN(p.type, quant_format_named(v.get<std::string>(), where + " 'type'"));
    } else if (key == "tensors") {
      if (!v.is_object()) return invalid_argument(where + ": 'tensors' must be an object of name -> format");
      for (const auto& [name, f] : v.items()) {
        if (!f.is_string()) return invalid_argument(where + ": tensors['" + name + "'] must be a format name");
        METRO_ASSIGN_OR_RETURN(kernels::DType t,
                               quant_format_named(f.get<std::string>(), where + " tensors['" + name + "']"));
        p.tensors.emplace_back(name, t);
      }
    } else {
      return invalid_argument(where + ": unknown key '" + key + "' (expected 'type' and 'tensors')");
    }
  }
  return p;
}

Expected<QuantPlan> read_quant_plan(const std::string& path, const std::string& where) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(where + ": cannot read " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_quant_plan(text.str(), where + ": " + path);
}

bool glob_match(std::string_view pattern, std::string_view s) {
  // Iterative with one backtrack point (the last `*`): linear for the patterns plans hold.
  size_t p = 0, i = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (p < pattern.size() && pattern[p] == s[i]) {
      ++p;
      ++i;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

uint64_t matrix_bytes(const gguf::File& f) {
  uint64_t total = 0;
  for (const auto& t : f.tensors()) {
    if ((t.n_dims == 2 || t.n_dims == 3) && kernels::dtype_from_ggml(t.type())) total += t.n_bytes;
  }
  return total;
}

namespace {

// The requantized file's writer: every tensor filled from `in` (which must outlive it) when
// the file is built or streamed, so that neither the input nor the output is copied whole.
Expected<gguf::Writer> prepare(const gguf::File& in, const QuantPlan& plan, const RequantizeOptions& options,
                               RequantizeReport& rep) {
  rep = RequantizeReport{};
  const kernels::DType target = plan.type.value_or(kKeepFormat);
  std::vector<bool> used(plan.tensors.size(), false);
  gguf::Writer w;
  w.copy_metadata(in, "general.file_type");
  if (target != kKeepFormat) {
    w.add_u32("general.file_type", quant_file_type(target));
  } else if (auto ft = in.get_u32("general.file_type"); ft.ok()) {
    w.add_u32("general.file_type", *ft);
  }
  for (const auto& t : in.tensors()) {
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    auto src_type = kernels::dtype_from_ggml(t.type());
    // 2-D matrices and 3-D stacks of them (experts); never a router, whose few scores
    // pick the experts (llama.cpp keeps it as it is too).
    const bool is_router = std::string_view(t.name).ends_with("ffn_gate_inp.weight");
    const bool is_matrix = (t.n_dims == 2 || t.n_dims == 3) && src_type.has_value() && !is_router;
    kernels::DType want = is_matrix ? planned(plan, used, t.name, target) : target;
    if (want == kKeepFormat && src_type) want = *src_type;
    if (is_matrix && static_cast<int64_t>(t.ne[0]) % kernels::traits(want).block_size != 0) {
      want = block32_fallback(want);
      ++rep.fell_back;
    }
    const bool convert = is_matrix && want != *src_type &&
                         static_cast<int64_t>(t.ne[0]) % kernels::traits(want).block_size == 0;
    const gguf::TensorInfo* ti = &t;
    const auto on_matrix = options.on_matrix;
    if (!convert) {
      METRO_RETURN_IF_ERROR(w.add_tensor_lazy(t.name, t.type(), dims, [ti, is_matrix, on_matrix](std::span<uint8_t> dst) {
        std::memcpy(dst.data(), ti->data, ti->n_bytes);
        if (is_matrix && on_matrix) on_matrix(ti->n_bytes, ti->name);
        return Status{};
      }));
      ++rep.kept;
      continue;
    }
    const std::vector<float>* imp = nullptr;
    if (options.importance != nullptr && kernels::quantize_takes_importance(want)) {
      imp = options.importance->find(std::string(t.name));
      if (imp != nullptr && imp->size() != static_cast<size_t>(t.ne[0])) imp = nullptr;
      if (imp != nullptr) ++rep.weighted;
    }
    const kernels::DType from = *src_type;
    const int threads = options.threads;
    METRO_RETURN_IF_ERROR(w.add_tensor_lazy(
        t.name, kernels::traits(want).ggml, dims, [ti, from, want, imp, on_matrix, threads](std::span<uint8_t> dst) {
          const int64_t cols = static_cast<int64_t>(ti->ne[0]);
          const int64_t rows = static_cast<int64_t>(ti->ne[1] * (ti->n_dims == 3 ? ti->ne[2] : 1));
          const size_t in_rb = kernels::row_bytes(from, cols), out_rb = kernels::row_bytes(want, cols);
          auto quantize_rows = [&](int64_t r0, int64_t r1) {
            std::vector<float> row(static_cast<size_t>(cols));
            for (int64_t r = r0; r < r1; ++r) {
              kernels::dequantize_row_ref(from, ti->data + static_cast<size_t>(r) * in_rb, row.data(), cols);
              uint8_t* out = dst.data() + static_cast<size_t>(r) * out_rb;
              if (imp != nullptr) {
                kernels::quantize_row_ref_weighted(want, row.data(), out, cols, imp->data());
              } else {
                kernels::quantize_row_ref(want, row.data(), out, cols);
              }
            }
          };
          parallel_rows(rows, threads, quantize_rows);
          if (on_matrix) on_matrix(ti->n_bytes, ti->name);
          return Status{};
        }));
    ++rep.converted[want];
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (!used[i]) return invalid_argument("plan: '" + plan.tensors[i].first + "' matches no matrix");
  }
  rep.bytes = w.file_size();
  return w;
}

}  // namespace

void parallel_rows(int64_t rows, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t want = threads > 0 ? threads : cores;
  const int64_t n = std::clamp<int64_t>(std::min(want, rows / 8), 1, 256);
  if (n == 1) {
    fn(0, rows);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(n - 1));
  for (int64_t i = 1; i < n; ++i) pool.emplace_back(fn, rows * i / n, rows * (i + 1) / n);
  fn(0, rows / n);
  for (auto& th : pool) th.join();
}

Expected<std::vector<uint8_t>> requantize(const gguf::File& in, const QuantPlan& plan,
                                          const RequantizeOptions& options, RequantizeReport* report) {
  RequantizeReport local;
  RequantizeReport& rep = report != nullptr ? *report : local;
  METRO_ASSIGN_OR_RETURN(gguf::Writer w, prepare(in, plan, options, rep));
  return w.build();
}

Status requantize_to_file(const gguf::File& in, const std::string& out_path, const QuantPlan& plan,
                          const RequantizeOptions& options, RequantizeReport* report) {
  RequantizeReport local;
  RequantizeReport& rep = report != nullptr ? *report : local;
  METRO_ASSIGN_OR_RETURN(gguf::Writer w, prepare(in, plan, options, rep));
  return w.write_atomically(out_path);
}

}  // namespace metro::model
