// Rewriting a GGUF model's weight matrices in other block formats: the core of `metro
// quantize`, of `metro serve --tiers` (a tier derived from the loaded file at start-up) and
// of `metro sensitivity`.
//
// Every 2-D matrix of a format the kernels read is dequantized and quantized again with the
// scalar references; 1-D tensors (norms, biases) stay as they are; metadata is copied but
// for general.file_type. A plan gives some matrices another format than its default:
//   {"type": "q4_k", "tensors": {"output.weight": "q8_0", "blk.*.ffn_down.weight": "q6_k"}}
// (names may use `*` for any run of characters; an exact name wins over a pattern, then the
// first pattern that matches; a pattern that matches no matrix is an error). A matrix whose
// rows do not divide into its format's blocks (the K-quants' 256) gets the nearest 32-block
// format: Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/dtype.h"
#include "model/importance.h"

namespace metro::model {

// "keep": the tensor stays as it is in the input.
inline constexpr kernels::DType kKeepFormat = kernels::DType::kCount;

// A format by its lower-case name (q4_0, q2_k, f16, ... or keep); `where` prefixes errors.
Expected<kernels::DType> quant_format_named(std::string name, const std::string& where);
// Whether `name` names a format (or keep).
bool is_quant_format_name(std::string name);
// GGUF general.file_type (llama_ftype) of a format; 0 for one without.
uint32_t quant_file_type(kernels::DType t);

struct QuantPlan {
  std::optional<kernels::DType> type;                            // the default format
  std::vector<std::pair<std::string, kernels::DType>> tensors;  // name or pattern -> format
};

// A plan from its JSON text; `where` prefixes errors (e.g. "--plan").
Expected<QuantPlan> parse_quant_plan(std::string_view json, const std::string& where);
Expected<QuantPlan> read_quant_plan(const std::string& path, const std::string& where);

// `*` matches any run of characters; every other character itself.
bool glob_match(std::string_view pattern, std::string_view s);

struct RequantizeReport {
  std::map<kernels::DType, size_t> converted;  // matrices rewritten, by format
  size_t kept = 0;                             // tensors copied as they were
  size_t fell_back = 0;                        // matrices given a 32-block format instead
  size_t weighted = 0;                         // matrices quantized with importance weights
  uint64_t bytes = 0;                          // of the result
};

struct RequantizeOptions {
  // Called after each matrix with its bytes in the input and its name (a progress bar).
  std::function<void(uint64_t bytes, std::string_view name)> on_matrix;
  // Column importance from a calibration text: the formats that search their scales
  // (kernels::quantize_takes_importance) minimize the importance-weighted error of the
  // matrices it has weights for. Null: unweighted.
  const Importance* importance = nullptr;
  // Threads quantizing each matrix's rows (0: one per core). Rows are independent, so the
  // bytes written do not depend on it.
  int threads = 0;
};

// Runs fn over [0, rows) split into contiguous ranges, one per thread (threads <= 0: one
// per core; never a range under 8 rows). For row-independent work such as quantizing.
void parallel_rows(int64_t rows, int threads, const std::function<void(int64_t, int64_t)>& fn);

// The bytes of a GGUF file: `in` with its matrices in the plan's formats (plan.type is the
// default; without one, matrices the plan does not name are kept).
Expected<std::vector<uint8_t>> requantize(const gguf::File& in, const QuantPlan& plan,
                                          const RequantizeOptions& options = {},
                                          RequantizeReport* report = nullptr);

// The same file streamed to `out_path` a tensor at a time (memory: about one row of F32
// beyond the mapped input), written beside it and renamed into place.
Status requantize_to_file(const gguf::File& in, const std::string& out_path, const QuantPlan& plan,
                          const RequantizeOptions& options = {}, RequantizeReport* report = nullptr);

// llama.cpp's mixed recipes by name: "q4_k_m" and "q5_k_m" are Q4_K / Q5_K with Q6_K for
// the head (the embedding when the head is tied to it) and for attn_v and ffn_down (experts'
// too) in the layers llama.cpp gives more bits: the first and last eighth and every third
// between. nullopt for another name.
std::optional<QuantPlan> preset_plan(std::string name, const std::vector<std::string>& tensor_names);
bool is_quant_preset_name(std::string name);

// `t`, or for a K-quant on rows of `cols` that do not divide into its 256-blocks, the
// 32-block format requantize() writes instead; F16 where rows do not divide into 32-blocks
// either (as llama.cpp's quantizer falls back).
kernels::DType format_for_row_width(kernels::DType t, int64_t cols);

// Bytes of the 2-D matrices of a format the kernels read (what requantize() converts).
uint64_t matrix_bytes(const gguf::File& f);

}  // namespace metro::model
