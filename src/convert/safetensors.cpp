#include "convert/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/fp16.h"

namespace metro::convert {

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the format's own bound
constexpr size_t kMaxTensors = 1u << 20;
constexpr size_t kMaxDims = 8;
constexpr size_t kMaxShards = 4096;

struct DtypeInfo {
  const char* name;
  StDtype type;
  uint64_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"F32", StDtype::kF32, 4}, {"F16", StDtype::kF16, 2},  {"BF16", StDtype::kBF16, 2}, {"F64", StDtype::kF64, 8},
    {"I64", StDtype::kI64, 8}, {"I32", StDtype::kI32, 4},  {"I16", StDtype::kI16, 2},   {"I8", StDtype::kI8, 1},
    {"U8", StDtype::kU8, 1},   {"BOOL", StDtype::kBool, 1},
};

const DtypeInfo* dtype_info(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

Status bad(const std::string& shown, const std::string& msg) { return data_loss(shown + ": " + msg); }

}  // namespace

uint64_t StTensor::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::string_view st_dtype_name(StDtype t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  return "?";
}

Expected<std::vector<StTensor>> parse_safetensors(std::span<const uint8_t> bytes, const std::string& shown) {
  if (bytes.size() < 8) return bad(shown, "shorter than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian, as the format is
  if (n < 2 || n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return bad(shown, "header length " + std::to_string(n) + " does not fit the file (" + std::to_string(bytes.size()) +
                          " bytes)");
  }
  const auto* text = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json header = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad(shown, "the header is not a JSON object");
  if (header.size() > kMaxTensors) return bad(shown, "too many tensors");
  const std::span<const uint8_t> data = bytes.subspan(8 + n);
  std::vector<StTensor> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string name = it.key().substr(0, 512);
    const nlohmann::json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets")) {
      return bad(shown, "tensor '" + name + "' lacks dtype, shape or data_offsets");
    }
    const nlohmann::json &dt = e["dtype"], &sh = e["shape"], &off = e["data_offsets"];
    if (!dt.is_string()) return bad(shown, "tensor '" + name + "': dtype is not a string");
    const DtypeInfo* info = dtype_info(dt.get<std::string>());
    if (info == nullptr) {
      return unimplemented(shown + ": tensor '" + name + "' has dtype '" + dt.get<std::string>().substr(0, 16) +
                           "', which this reader does not take");
    }
    if (!sh.is_array() || sh.size() > kMaxDims) return bad(shown, "tensor '" + name + "': shape is not a short array");
    StTensor t;
    t.name = name;
    t.dtype = info->type;
    uint64_t numel = 1;
    for (const auto& d : sh) {
      if (!d.is_number_unsigned()) return bad(shown, "tensor '" + name + "': a dimension is not a non-negative integer");
      const uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 40) || (v != 0 && numel > (uint64_t{1} << 40) / v)) {
        return bad(shown, "tensor '" + name + "': shape too large");
      }
      numel *= v;
      t.shape.push_back(v);
    }
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad(shown, "tensor '" + name + "': data_offsets is not [begin, end]");
    }
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data.size()) {
      return bad(shown, "tensor '" + name + "': data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                            "] fall outside the " + std::to_string(data.size()) + " data bytes");
    }
    if (en - b != numel * info->bytes) {
      return bad(shown, "tensor '" + name + "': " + std::to_string(en - b) + " bytes for " + std::to_string(numel) +
                            " " + info->name + " values");
    }
    t.data = data.subspan(b, en - b);
    ranges.emplace_back(b, en);
    out.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return bad(shown, "two tensors' data overlap");
  }
  return out;
}

Status Checkpoint::add_file(const std::string& path, const std::string& shown) {
  METRO_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  METRO_ASSIGN_OR_RETURN(std::vector<StTensor> ts, parse_safetensors(f.bytes(), shown));
  for (StTensor& t : ts) {
    const std::string name = t.name;
    if (!tensors_.emplace(name, std::move(t)).second) return data_loss(shown + ": tensor '" + name + "' appears twice");
  }
  files_.push_back(std::move(f));
  return {};
}

Expected<Checkpoint> Checkpoint::open_file(const std::string& path) {
  Checkpoint c;
  const size_t slash = path.find_last_of('/');
  METRO_RETURN_IF_ERROR(c.add_file(path, slash == std::string::npos ? path : path.substr(slash + 1)));
  return c;
}

Expected<Checkpoint> Checkpoint::open_dir(const std::string& dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream index(index_path, std::ios::binary);
  if (!index) return open_file(dir + "/model.safetensors");
  const std::string text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return data_loss("model.safetensors.index.json: no weight_map object");
  }
  std::vector<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) return data_loss("model.safetensors.index.json: the file of '" + name + "' is not a string");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.starts_with(".")) {
      return data_loss("model.safetensors.index.json: shard name '" + f.substr(0, 64) + "' is not a file in the directory");
    }
    if (std::find(shards.begin(), shards.end(), f) == shards.end()) shards.push_back(f);
    if (shards.size() > kMaxShards) return data_loss("model.safetensors.index.json: too many shards");
  }
  Checkpoint c;
  for (const std::string& f : shards) METRO_RETURN_IF_ERROR(c.add_file(dir + "/" + f, f));
  return c;
}

const StTensor* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Expected<std::vector<float>> Checkpoint::to_f32(const StTensor& t) const {
  if (!t.is_float()) {
    return invalid_argument("tensor '" + t.name + "' is " + std::string(st_dtype_name(t.dtype)) + ", not a float type");
  }
  std::vector<float> v(t.numel());
  const uint8_t* p = t.data.data();
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == StDtype::kF32) {
      std::memcpy(&v[i], p + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, p + 2 * i, 2);
      v[i] = t.dtype == StDtype::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
  }
  return v;
}

}  // namespace metro::convert
