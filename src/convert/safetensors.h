// Reader of Hugging Face safetensors checkpoints: one file, or the shards an
// index (model.safetensors.index.json) lists. The files are untrusted input: every header is
// bounded and checked (JSON shape, dtypes, shapes, offsets inside the data, sizes equal to
// shape x dtype, no overlaps) before a tensor is handed out.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"

namespace metro::convert {

enum class StDtype : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<uint64_t> shape;  // outermost first, as safetensors and PyTorch write it
  std::span<const uint8_t> data;
  uint64_t numel() const;
  bool is_float() const { return dtype == StDtype::kF32 || dtype == StDtype::kF16 || dtype == StDtype::kBF16; }
};

std::string_view st_dtype_name(StDtype t);

class Checkpoint {
 public:
  // `dir`/model.safetensors, or the shards `dir`/model.safetensors.index.json lists.
  static Expected<Checkpoint> open_dir(const std::string& dir);
  // One safetensors file.
  static Expected<Checkpoint> open_file(const std::string& path);

  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  const StTensor* find(const std::string& name) const;
  // Values of a float tensor as F32 (F32, F16 or BF16 in the file).
  Expected<std::vector<float>> to_f32(const StTensor& t) const;

 private:
  Status add_file(const std::string& path, const std::string& shown);

  std::vector<MappedFile> files_;
  std::map<std::string, StTensor> tensors_;
};

// Parses one file's bytes (exposed for the fuzz target and tests); tensors point into
// `bytes`. `shown` names the file in errors.
Expected<std::vector<StTensor>> parse_safetensors(std::span<const uint8_t> bytes, const std::string& shown);

}  // namespace metro::convert
