// GGUF files: a bounds-checked reader over a file's bytes, mapped or copied into memory
// (v2 and v3, little-endian).
//
// Layout (GGUF spec): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv
// metadata entries (string key, u32 value type, value), then n_tensors tensor infos
// (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset), then padding to
// `general.alignment` (default 32) and the tensor data section. Strings are u64 length +
// bytes (not NUL-terminated). Arrays are u32 element type + u64 count + elements.
//
// The reader trusts nothing: every count, length, product and offset is checked before use,
// and every failure names the byte offset where the file went wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "gguf/ggml_type.h"

namespace metro::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;
inline constexpr uint32_t kMaxArrayNesting = 8;
inline constexpr size_t kMaxTensorNameBytes = 256;

enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::string_view value_type_name(ValueType t);
// Size in bytes of a fixed-size scalar type; 0 for string and array.
size_t scalar_size(ValueType t);

// One metadata value. Strings and scalar arrays point into the file's bytes, so a Value
// lives no longer than its File.
class Value {
 public:
  ValueType type() const { return type_; }
  bool is_integer() const;
  bool is_float() const { return type_ == ValueType::kF32 || type_ == ValueType::kF64; }

  // Scalar conversions; nullopt when the type does not convert or the value does not fit.
  std::optional<int64_t> as_int() const;
  std::optional<uint64_t> as_uint() const;
  std::optional<double> as_double() const;  // floats and integers
  std::optional<bool> as_bool() const;
  std::optional<std::string_view> as_string() const;

  // Arrays.
  bool is_array() const { return type_ == ValueType::kArray; }
  ValueType array_type() const { return elem_type_; }
  size_t array_size() const { return count_; }
  // Element i of any array as a Value (scalars decoded from the file's bytes).
  Value array_at(size_t i) const;
  // Strings of a string array (empty span otherwise).
  std::span<const std::string_view> strings() const { return strings_; }

  // A short human-readable rendering (arrays abbreviated), for `metro inspect`.
  std::string to_display_string(size_t max_items = 8) const;

 private:
  friend class Parser;
  ValueType type_ = ValueType::kU8;
  ValueType elem_type_ = ValueType::kU8;
  union {
    uint64_t u;
    int64_t i;
    double f;
  } num_{0};
  std::string_view str_;
  // Arrays: scalar elements stay in the file (raw_), strings and nested arrays are indexed.
  size_t count_ = 0;
  const uint8_t* raw_ = nullptr;
  std::vector<std::string_view> strings_;
  std::vector<Value> items_;
};

struct KeyValue {
  std::string_view key;
  Value value;
};

struct TensorInfo {
  std::string_view name;
  uint32_t n_dims = 0;
  uint64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] is the innermost (contiguous) dimension
  uint32_t type_id = 0;
  GgmlTypeInfo type_info{};
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_bytes = 0;
  uint64_t n_elements = 0;
  const uint8_t* data = nullptr;

  GgmlType type() const { return static_cast<GgmlType>(type_id); }
  std::string shape_string() const;  // "[576, 49152]"
};

class File {
 public:
  // Maps and parses a file. Error messages name offsets, never the full path. The map stays
  // backed by the file: for a look at a file, not for serving from it (base/mapped_file.h).
  static Expected<File> open(const std::string& path);
  // Reads the whole file into memory the File owns, then parses it: nothing that later
  // happens to the file on disk (truncated, rewritten, removed) reaches these bytes.
  static Expected<File> load(const std::string& path, const MappedFile::ReadOptions& options);
  static Expected<File> load(const std::string& path) { return load(path, MappedFile::ReadOptions{}); }
  // Parses bytes owned by the caller, who keeps them alive as long as the File.
  static Expected<File> parse(std::span<const uint8_t> bytes);
  // Copies bytes made in memory (a requantized model) into memory the File owns, then
  // parses them.
  static Expected<File> copy_of(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return bytes_.size(); }
  uint64_t data_offset() const { return data_offset_; }
  std::span<const uint8_t> bytes() const { return bytes_; }
  // What stat() said of the file when it was opened or loaded; null for parsed bytes.
  const FileStamp* stamp() const { return map_ ? &map_->stamp() : nullptr; }
  // True when the bytes are a copy the File owns (load), false for a map (open) or bytes
  // owned by the caller (parse).
  bool owns_bytes() const { return map_ && map_->owned(); }
  // Gives back the whole pages of `range` (inside bytes()) when the File owns its copy
  // (MappedFile::give_back): for tensor bytes nothing will read again. Returns the bytes
  // given back.
  size_t give_back(std::span<const uint8_t> range) const {
    if (!owns_bytes() || range.empty() || range.data() < bytes_.data() ||
        range.data() + range.size() > bytes_.data() + bytes_.size()) {
      return 0;
    }
    return map_->give_back(static_cast<size_t>(range.data() - bytes_.data()), range.size());
  }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters: errors name the key and what was found instead.
  Expected<std::string_view> get_string(std::string_view key) const;
  Expected<uint64_t> get_uint(std::string_view key) const;
  Expected<int64_t> get_int(std::string_view key) const;
  Expected<uint32_t> get_u32(std::string_view key) const;
  Expected<double> get_double(std::string_view key) const;
  Expected<float> get_f32(std::string_view key) const;
  Expected<bool> get_bool(std::string_view key) const;
  Expected<std::span<const std::string_view>> get_string_array(std::string_view key) const;
  Expected<std::vector<float>> get_f32_array(std::string_view key) const;
  Expected<std::vector<int64_t>> get_int_array(std::string_view key) const;
  // The length of an array value of any element type.
  Expected<size_t> get_array_size(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  friend class Parser;
  std::shared_ptr<MappedFile> map_;  // null when parsing caller-owned bytes
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace metro::gguf
