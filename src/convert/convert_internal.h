// Shared by the converter's files (convert.cpp: the shared steps and the encoders;
// convert_decoder.cpp: the decoders): reading config.json, collecting and checking a
// checkpoint's tensors, and adding them to a GGUF writer as lazy tensors in the chosen
// formats. Internal to src/convert.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "convert/convert.h"
#include "convert/safetensors.h"
#include "gguf/writer.h"
#include "kernels/dtype.h"
#include "model/requantize.h"

namespace metro::convert::detail {

using kernels::DType;
using nlohmann::json;

// A converted model before its bytes exist: the writer's tensors are filled from the
// checkpoint (kept alive here) as the file is built or streamed.
struct Prepared {
  gguf::Writer w;
  std::shared_ptr<Checkpoint> ck;
  ConvertReport rep;
};

// What the fills share: the checkpoint, and the progress over its bytes.
struct Source {
  std::shared_ptr<Checkpoint> ck;
  std::shared_ptr<uint64_t> done = std::make_shared<uint64_t>(0);
  uint64_t total = 0;
  std::function<void(uint64_t done, uint64_t total, std::string_view name)> on_tensor;
};

Expected<json> read_json(const std::string& path, bool required);

// Fields of config.json: a positive integer up to `max`; a number in [lo, hi] (`dflt` when
// absent or null); a boolean (`dflt` when absent or not one).
Expected<uint32_t> cfg_u32(const json& c, const char* key, uint32_t max);
Expected<float> cfg_f32(const json& c, const char* key, float dflt, float lo, float hi);
bool cfg_bool(const json& c, const char* key, bool dflt);

using TensorNamer = std::function<Expected<std::optional<std::string>>(const std::string&)>;

// The checkpoint's tensors by their GGUF names, each of the shape `want` expects, every
// expected one present; tensors the namer drops are skipped.
Status collect_tensors(const Checkpoint& ck, const TensorNamer& name_of,
                       const std::map<std::string, std::vector<uint64_t>>& want,
                       std::map<std::string, const StTensor*>& found, uint64_t& source_bytes);

// The format a tensor is written in: matrices in the requested one (a K-quant falls back to a
// 32-block format on rows that do not divide into 256), everything else F32; with a preset's
// per-tensor formats taking precedence.
DType pick_type(const ConvertOptions& opts, bool matrix, int64_t cols);
DType pick_type(const ConvertOptions& opts, const model::QuantPlan& plan, const std::string& name, bool matrix,
                int64_t cols);
// The preset's plan over the GGUF names about to be written (expert pieces by their stack).
Expected<model::QuantPlan> preset_for(const ConvertOptions& opts, const std::map<std::string, const StTensor*>& found);

// `v` (rows of `cols`) into `dst` in format `t`.
void write_values(const std::vector<float>& v, DType t, int64_t cols, std::span<uint8_t> dst);

// Checkpoint tensor `t` as GGUF tensor `g` in format `ty`, `transform` applied to its values
// (a row reordering, a shifted norm) when it is filled.
Status add_converted(gguf::Writer& w, const Source& src, const std::string& g, const StTensor* t, DType ty,
                     std::function<void(std::vector<float>&)> transform = nullptr);

// The checkpoint opened and the file started: architecture, name (the config's, else the
// directory's) and file type.
Expected<Prepared> start(const std::string& dir, const json& cfg, const std::string& arch, const ConvertOptions& opts);

// The families.
Expected<Prepared> convert_bert(const std::string& dir, const json& cfg, const ConvertOptions& opts);
Expected<Prepared> convert_nomic_bert(const std::string& dir, const json& cfg, const ConvertOptions& opts);
// llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, phi3, gemma, gemma2, gemma3, granite, olmo2 (`type`:
// config's model_type).
Expected<Prepared> convert_decoder(const std::string& dir, const json& cfg, const std::string& type,
                                   const ConvertOptions& opts);

}  // namespace metro::convert::detail
