#include "model/lora.h"

#include <cmath>
#include <map>
#include <string_view>

#include "gguf/writer.h"
#include "kernels/dtype.h"
#include "kernels/quant_ref.h"

namespace metro::model {

namespace {

constexpr std::string_view kA = ".lora_a";
constexpr std::string_view kB = ".lora_b";

using Delta = LoraDelta;

Expected<std::vector<float>> dense(const gguf::TensorInfo& t, const std::string& where) {
  auto dt = kernels::dtype_from_ggml(t.type());
  if (!dt) return unimplemented(where + ": tensor '" + std::string(t.name) + "' has a type metro cannot read");
  const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.ne[1]);
  if (cols % kernels::traits(*dt).block_size != 0) {
    return data_loss(where + ": tensor '" + std::string(t.name) + "' rows do not divide into its blocks");
  }
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const size_t rb = kernels::row_bytes(*dt, cols);
  for (int64_t r = 0; r < rows; ++r) {
    kernels::dequantize_row_ref(*dt, t.data + static_cast<size_t>(r) * rb, out.data() + r * cols, cols);
  }
  return out;
}

// The adapter's deltas, by base matrix name, added to `out`.
Status read_adapter(const gguf::File& base, const gguf::File& ad, const LoraSpec& spec,
                    std::map<std::string, std::vector<Delta>>& out) {
  const std::string where = "LoRA adapter '" + spec.path + "'";
  auto type = ad.get_string("general.type");
  auto kind = ad.get_string("adapter.type");
  if (!type.ok() || *type != "adapter" || !kind.ok() || *kind != "lora") {
    return invalid_argument(where + " is not a LoRA adapter (general.type \"adapter\", adapter.type \"lora\")");
  }
  auto base_arch = base.get_string("general.architecture");
  auto arch = ad.get_string("general.architecture");
  if (arch.ok() && base_arch.ok() && *arch != *base_arch) {
    return invalid_argument(where + " is for architecture '" + std::string(arch->substr(0, 64)) + "', the model is '" +
                            std::string(base_arch->substr(0, 64)) + "'");
  }
  float alpha = 0.0f;
  if (ad.has("adapter.lora.alpha")) {
    METRO_ASSIGN_OR_RETURN(alpha, ad.get_f32("adapter.lora.alpha"));
    if (!std::isfinite(alpha)) return data_loss(where + ": adapter.lora.alpha is not finite");
  }
  std::map<std::string, std::pair<const gguf::TensorInfo*, const gguf::TensorInfo*>> pairs;
  for (const auto& t : ad.tensors()) {
    const std::string_view name = t.name;
    const bool is_a = name.ends_with(kA), is_b = name.ends_with(kB);
    if (!is_a && !is_b) return invalid_argument(where + ": tensor '" + std::string(name) + "' is not a LoRA half");
    auto& p = pairs[std::string(name.substr(0, name.size() - kA.size()))];
    (is_a ? p.first : p.second) = &t;
  }
  if (pairs.empty()) return invalid_argument(where + " adapts no matrix");
  for (const auto& [target, p] : pairs) {
    if (p.first == nullptr || p.second == nullptr) {
      return invalid_argument(where + ": '" + target + "' has " + (p.first ? "lora_a" : "lora_b") + " but not " +
                              (p.first ? "lora_b" : "lora_a"));
    }
    const gguf::TensorInfo* w = base.find_tensor(target);
    if (w == nullptr || w->n_dims != 2) {
      return invalid_argument(where + " adapts '" + target + "', which is not a matrix of the model");
    }
    const gguf::TensorInfo& a = *p.first;
    const gguf::TensorInfo& b = *p.second;
    const uint64_t rank = a.ne[1];
    if (a.n_dims != 2 || b.n_dims != 2 || a.ne[0] != w->ne[0] || b.ne[1] != w->ne[1] || b.ne[0] != rank) {
      return invalid_argument(where + ": '" + target + "' is " + w->shape_string() + " but its halves are " +
                              a.shape_string() + " and " + b.shape_string() + " (want [n_in, r] and [r, n_out])");
    }
    if (rank == 0 || rank > 65536) return invalid_argument(where + ": '" + target + "' has rank " + std::to_string(rank));
    Delta d;
    METRO_ASSIGN_OR_RETURN(d.a, dense(a, where));
    METRO_ASSIGN_OR_RETURN(d.b, dense(b, where));
    d.rank = static_cast<int64_t>(rank);
    d.s = alpha != 0.0f ? spec.scale * alpha / static_cast<float>(rank) : spec.scale;
    out[target].push_back(std::move(d));
  }
  return {};
}

}  // namespace

Expected<std::vector<std::pair<std::string, LoraDelta>>> read_lora(const gguf::File& base, const gguf::File& adapter,
                                                                   const LoraSpec& spec) {
  if (!std::isfinite(spec.scale)) return invalid_argument("LoRA adapter '" + spec.path + "': the scale is not finite");
  std::map<std::string, std::vector<Delta>> deltas;
  METRO_RETURN_IF_ERROR(read_adapter(base, adapter, spec, deltas));
  std::vector<std::pair<std::string, LoraDelta>> out;
  for (auto& [name, list] : deltas) out.emplace_back(name, std::move(list.front()));
  return out;
}

Expected<std::vector<uint8_t>> merge_lora(const gguf::File& base, std::span<const LoraSpec> adapters,
                                          LoraReport* report) {
  std::vector<gguf::File> files;
  files.reserve(adapters.size());
  for (const LoraSpec& spec : adapters) {
    auto f = gguf::File::load(spec.path);
    if (!f.ok()) return Status(f.status().code(), "LoRA adapter '" + spec.path + "': " + f.status().message());
    files.push_back(std::move(*f));
  }
  std::vector<const gguf::File*> ptrs;
  for (const gguf::File& f : files) ptrs.push_back(&f);
  return merge_lora(base, ptrs, adapters, report);
}

Expected<std::vector<uint8_t>> merge_lora(const gguf::File& base, std::span<const gguf::File* const> adapters,
                                          std::span<const LoraSpec> specs, LoraReport* report) {
  if (adapters.size() != specs.size()) return invalid_argument("LoRA: one spec per adapter");
  std::map<std::string, std::vector<Delta>> deltas;
  for (size_t i = 0; i < adapters.size(); ++i) {
    const LoraSpec& spec = specs[i];
    if (!std::isfinite(spec.scale)) return invalid_argument("LoRA adapter '" + spec.path + "': the scale is not finite");
    METRO_RETURN_IF_ERROR(read_adapter(base, *adapters[i], spec, deltas));
  }
  gguf::Writer w;
  w.copy_metadata(base);
  std::vector<float> row;
  for (const auto& t : base.tensors()) {
    const std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    auto it = deltas.find(std::string(t.name));
    if (it == deltas.end()) {
      METRO_RETURN_IF_ERROR(w.add_tensor(t.name, t.type(), dims, {t.data, t.n_bytes}));
      continue;
    }
    auto dt = kernels::dtype_from_ggml(t.type());
    if (!dt || *dt == kernels::DType::kQ8_1 || *dt == kernels::DType::kQ8_K) {
      return unimplemented("LoRA: matrix '" + std::string(t.name) + "' has a type metro cannot rewrite");
    }
    const int64_t n_in = static_cast<int64_t>(t.ne[0]), n_out = static_cast<int64_t>(t.ne[1]);
    const size_t rb = kernels::row_bytes(*dt, n_in);
    std::vector<uint8_t> out(rb * static_cast<size_t>(n_out));
    row.resize(static_cast<size_t>(n_in));
    for (int64_t o = 0; o < n_out; ++o) {
      kernels::dequantize_row_ref(*dt, t.data + static_cast<size_t>(o) * rb, row.data(), n_in);
      for (const Delta& d : it->second) {
        for (int64_t r = 0; r < d.rank; ++r) {
          const float c = d.s * d.b[static_cast<size_t>(o * d.rank + r)];
          const float* a = d.a.data() + r * n_in;
          for (int64_t i = 0; i < n_in; ++i) row[static_cast<size_t>(i)] += c * a[i];
        }
      }
      kernels::quantize_row_ref(*dt, row.data(), out.data() + static_cast<size_t>(o) * rb, n_in);
    }
    METRO_RETURN_IF_ERROR(w.add_tensor(t.name, t.type(), dims, out));
    if (report != nullptr) ++report->matrices;
  }
  if (report != nullptr) report->adapters = adapters.size();
  return w.serialize();
}

}  // namespace metro::model
